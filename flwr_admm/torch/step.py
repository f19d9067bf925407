"""`TorchADMM`: one node's inexact ADMM w-step for a `torch.nn.Module`, both Flower APIs.

The node approximately solves min_w f_i(w) + rho/2 ||w - v||^2 over its trainable
parameters, v its center (`flwr_admm.node.step`). Inside the user's own loop::

    admm = TorchADMM.from_message(model, msg, context)      # or .from_parameters(...)
    admm.start()                       # load the start into `model` (init="auto")
    for x, y in batches:
        optimizer.zero_grad()
        loss = criterion(model(x), y) + admm.penalty_term()   # 0 in "prox" mode
        loss.backward()
        optimizer.step()
        admm.after_step(optimizer)     # the decoupled proximal step ("prox" mode)
    return admm.reply(num_examples=n, metrics={"loss": ...})  # .fit_result(...) legacy

``penalty="prox"`` (default): after each optimizer step, per parameter group of
learning rate eta, w <- (w + eta rho v) / (1 + eta rho): the exact proximal step of
the penalty, stable for any rho (the numpy client's ``prox_step="exact"``). With plain
SGD the loop's fixed points are exactly those of f_i + rho/2 ||w - v||^2. With an
adaptive or momentum optimizer the penalty is decoupled from its preconditioner (as
AdamW decouples weight decay): a fixed point balances the optimizer's direction, not
the raw gradient, against rho (w - v), so it minimizes a preconditioned variant.
``penalty="loss"``: `penalty_term` returns rho/2 sum ||w - v||^2 (squared, over every
trainable tensor, recomputed per call) for the loss, so any optimizer minimizes the
exact objective; `after_step` does nothing.

Linearized form: `penalty_term` is the linear term <y_i, w> in either mode and
`after_step` counts the step budget (`flwr_admm.torch.linearized`).

Only the trainable parameters carry the penalty and a warm start; every other tensor
(BatchNorm statistics) is loaded from the received model, as the server's
``tensor_policy`` holds it (`flwr_admm.core.tensor_policy`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
import torch
from flwr.app import Context, Message
from flwr.common import RecordDict

from flwr_admm.clientapp.step import ADMMTrainStep, refuse_uplink
from flwr_admm.core.linearized import check_form
from flwr_admm.core.types import Arrays
from flwr_admm.node.blocks import split
from flwr_admm.node.config import client_held, server_round_of
from flwr_admm.node.duals import DualsRound
from flwr_admm.node.records import finite, keep_legacy, legacy_previous
from flwr_admm.node.start import LocalInit, start_of
from flwr_admm.node.step import NodeRound
from flwr_admm.protocol import FORM, LOCAL_STEPS, PARTITION_ID
from flwr_admm.torch.linearized import Budget
from flwr_admm.torch.state import check_trainable_only, load_arrays, state_arrays, trainable_names

__all__ = ["PENALTIES", "Penalty", "TorchADMM"]

Penalty = Literal["prox", "loss"]
PENALTIES = ("prox", "loss")
Named = dict[str, np.ndarray[Any, Any]]


@dataclass
class TorchADMM:
    """What one round of a node needs: the received model, v, rho, the warm start.

    Build it with `from_message` (Message API) or `from_parameters` (legacy API); the
    round's values are `flwr_admm.node.step.NodeRound`'s, by ``state_dict`` name
    (`received` is its ``center``).

    Attributes
    ----------
    model : torch.nn.Module
        The node's model (changed in place by `start` and the user's loop).
    penalty : {"prox", "loss"}
        How the penalty is applied (module docstring).

    """

    model: torch.nn.Module
    received: Named
    rho: float
    admm: bool
    penalty: Penalty = "prox"
    previous: Named | None = None
    server_round: int | None = None
    config: dict[str, Any] = field(default_factory=dict)
    context: Context | None = None
    message: Message | None = None
    train_step: ADMMTrainStep | None = None
    duals: DualsRound | None = None
    consensus: Named | None = None
    form: str = "prox"  # "linearized": FedADMM's linearized form (module docstring)
    correction: Named | None = None  # the linearized form's y_i by name
    # set by `start`, not by the caller
    _center: dict[int, torch.Tensor] = field(default_factory=dict, init=False, repr=False)
    _groups: dict[int, list[tuple[dict[str, Any], list[torch.Tensor], list[torch.Tensor]]]] = field(
        default_factory=dict, init=False, repr=False
    )
    _zero: torch.Tensor = field(default_factory=lambda: torch.zeros(()), init=False, repr=False)
    _at_z: bool = field(default=False, init=False, repr=False)
    _linear: dict[int, torch.Tensor] = field(default_factory=dict, init=False, repr=False)
    _budget: Budget | None = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        if self.penalty not in PENALTIES:
            raise ValueError(f"penalty: must be one of {list(PENALTIES)}, got {self.penalty!r}")
        names = list(self.model.state_dict())
        if list(self.received) != names:
            raise ValueError(f"arrays: expected tensors {names}, got {list(self.received)}")

    # ---------------------------------------------------------------- builders
    @classmethod
    def from_message(
        cls,
        model: torch.nn.Module,
        message: Message,
        context: Context,
        *,
        penalty: Penalty = "prox",
        arrayrecord_key: str = "arrays",
        configrecord_key: str = "config",
    ) -> TorchADMM:
        """Read the center, rho and the warm start of a Message-API train message."""
        step = ADMMTrainStep.from_message(
            message, context, arrayrecord_key=arrayrecord_key, configrecord_key=configrecord_key
        )
        if step.duals is not None:  # a dual on a BatchNorm statistic would drift
            check_trainable_only(model, step.center)
        return cls(
            model,
            step.center,
            step.rho,
            step.admm,
            penalty,
            step.previous,
            step.server_round,
            step.config,
            context,
            message,
            step,
            duals=step.duals,
            consensus=step.consensus,
            form=step.form,
            correction=step.correction,
        )

    @classmethod
    def from_parameters(
        cls,
        model: torch.nn.Module,
        parameters: Sequence[np.ndarray[Any, Any]],
        config: Mapping[str, Any],
        context: Context | None = None,
        *,
        penalty: Penalty = "prox",
    ) -> TorchADMM:
        """Read a legacy ``NumPyClient.fit`` call: parameters in ``state_dict()`` order."""
        refuse_uplink(config)
        names, config = list(model.state_dict()), dict(config)
        held, form = client_held(config), check_form(config.get(FORM, "prox"))
        if held and form == "linearized":
            raise ValueError(
                f"{FORM}: the linearized form with client-held duals runs on the Message "
                "API (TorchADMM.from_message); the legacy builder supports it server-held"
            )
        if held:
            check_trainable_only(model, names)  # a dual on a BatchNorm statistic would drift
            if context is None:
                raise ValueError("context: client-held duals keep the dual in context.state")
        received, second = split(parameters, config, names)
        state = context.state if context is not None else RecordDict()
        previous = None
        if context is not None and not held and form == "prox":
            previous = legacy_previous(state, [t.shape for t in received])
        server_round = server_round_of(config)
        node = NodeRound.open(
            received,
            config,
            state,
            second=second,
            previous=previous,
            server_round=(server_round or 0) if held else server_round,
        )

        def by_name(arrays: Arrays | None) -> Named | None:
            return None if arrays is None else dict(zip(names, arrays, strict=True))

        return cls(
            model,
            dict(zip(names, node.center, strict=True)),
            node.rho,
            node.admm,
            penalty,
            by_name(node.previous),
            server_round,
            config,
            context,
            duals=node.duals,
            consensus=by_name(node.consensus),
            form=node.form,
            correction=by_name(node.correction),
        )

    # --------------------------------------------------------------- the loop
    def start(self, *, init: LocalInit | None = None) -> None:
        """Load the starting point into the model (`flwr_admm.node.start`'s rule).

        Only the trainable parameters take the warm start; every other tensor starts at
        the received values.
        """
        source, at_z = start_of(
            init,
            form=self.form,
            admm=self.admm,
            rho=self.rho,
            center=self.received,
            previous=self.previous,
            consensus=self.consensus,
        )
        if self.form == "linearized":
            self._start_linearized()
            return
        self._at_z = at_z  # the reply's START_MARK
        if self.train_step is not None:
            self.train_step.started["at_z"] = at_z
        values = dict(self.received)
        for name in trainable_names(self.model):
            values[name] = source[name]
        load_arrays(self.model, values)
        named = dict(self.model.named_parameters())
        self._center, self._groups = {}, {}
        if self.rho > 0:
            for name in trainable_names(self.model):
                p = named[name]
                center = torch.as_tensor(self.received[name]).to(dtype=p.dtype, device=p.device)
                self._center[id(p)] = center

    def _start_linearized(self) -> None:
        """Load z into the model; keep y_i (and w_0, for a fitted budget) by parameter."""
        assert self.correction is not None
        load_arrays(self.model, self.received)
        named = dict(self.model.named_parameters())
        names = trainable_names(self.model)
        params = [named[name] for name in names]
        self._linear = {
            id(p): torch.as_tensor(self.correction[name]).to(dtype=p.dtype, device=p.device)
            for name, p in zip(names, params, strict=True)
        }
        self._budget = Budget.of(params)

    def penalty_term(self) -> torch.Tensor:
        """Return rho/2 sum_k ||w_k - v_k||^2 in "loss" mode (0 in "prox" mode or rho = 0).

        Under the linearized form: the linear term sum_k <y_k, w_k>, in either mode.
        """
        if self.form == "linearized":
            if self._budget is None:
                raise ValueError("penalty_term: call start() first (it loads z and y_i)")
            self._budget.linear_used = True
            total = self._zero
            for p in self.model.parameters():
                y = self._linear.get(id(p))
                if y is not None:
                    total = total + torch.sum(y * p)
            return total
        if self.penalty != "loss" or not self._center:
            return self._zero
        total = torch.zeros(())
        for p in self.model.parameters():
            v = self._center.get(id(p))
            if v is not None:
                total = total + torch.sum((p - v) ** 2)
        return 0.5 * self.rho * total

    def after_step(self, optimizer: torch.optim.Optimizer) -> None:
        """Take w <- (w + eta rho v) / (1 + eta rho) per group of lr eta ("prox" mode).

        Under the linearized form: count the step and its budget (module docstring).
        """
        if self.form == "linearized":
            if self._budget is None:
                raise ValueError("after_step: call start() first (it loads z and y_i)")
            self._budget.step(optimizer)
            return
        if self.penalty != "prox" or not self._center:
            return
        groups = self._groups.get(id(optimizer))
        if groups is None:  # the penalized tensors of each group, found once per optimizer
            groups = []
            for group in optimizer.param_groups:
                params = [p for p in group["params"] if id(p) in self._center]
                if params:
                    groups.append((group, params, [self._center[id(p)] for p in params]))
            self._groups[id(optimizer)] = groups
        with torch.no_grad():
            for group, params, centers in groups:
                eta_rho = float(group["lr"]) * self.rho  # lr read every step (schedulers)
                # w + t (v - w) with t = eta rho / (1 + eta rho): one fused call per group
                torch._foreach_lerp_(params, centers, eta_rho / (1.0 + eta_rho))

    # ----------------------------------------------------------------- replies
    def reply(self, num_examples: int, metrics: Mapping[str, Any] | None = None) -> Message:
        """Return the Message-API reply (w_i under the received names) and keep w_i."""
        if self.train_step is None:
            raise ValueError("reply: built by from_parameters; use fit_result (legacy API)")
        arrays = state_arrays(self.model)
        if self.form == "linearized":
            assert self._budget is not None
            reported = {LOCAL_STEPS: self._budget.steps, **(metrics or {})}
            budget = self.step_budget()
            return self.train_step.reply(  # the context: the client key (and dual states)
                arrays, num_examples, reported, self.context, step_budget=budget
            )
        return self.train_step.reply(arrays, num_examples, metrics, self.context)

    def step_budget(self) -> float:
        """Return the linearized form's b_i (module docstring); rho_i = 1 / b_i.

        Raises
        ------
        ValueError
            Outside the linearized form, before any `after_step`, when the loop never
            added `penalty_term` (y_i dropped), or when a fitted budget is not > 0.

        """
        if self.form != "linearized" or self._budget is None:
            raise ValueError("step_budget: only under the linearized form, after start()")
        return self._budget.value()

    def fit_result(
        self, num_examples: int, metrics: Mapping[str, Any] | None = None
    ) -> tuple[list[np.ndarray[Any, Any]], int, dict[str, Any]]:
        """Return the legacy ``NumPyClient.fit`` triple; keep w_i (or the duals) in the state."""
        if isinstance(num_examples, bool) or not isinstance(num_examples, int) or num_examples < 1:
            raise ValueError(f"num_examples: must be an integer > 0, got {num_examples!r}")
        reported = dict(metrics or {})
        node_config = self.context.node_config if self.context is not None else {}
        if isinstance(node_config.get(PARTITION_ID), int):
            reported.setdefault(PARTITION_ID, int(node_config[PARTITION_ID]))
        arrays = list(state_arrays(self.model).values())
        budget = self.step_budget() if self.form == "linearized" else None  # checks _budget
        node = NodeRound(
            list(self.received.values()),
            self.rho,
            self.admm,
            self.server_round,
            form=self.form,
            duals=self.duals,
        )
        # START_MARK (FedADMM): 1 = send z, this solve starts there
        answer = node.close(
            arrays, num_examples, at_z=self._at_z and self.rho > 0, step_budget=budget
        )
        reported.update(answer.metrics)
        if self._budget is not None:
            reported[LOCAL_STEPS] = self._budget.steps
        if self.duals is not None:  # Delta_i (and sigma_i'); C and the new pending P kept
            assert self.context is not None
            answer.commit(self.context.state)
            return answer.flat(), num_examples, reported
        if self.admm and self.context is not None and finite(answer.arrays):
            keep_legacy(self.context.state, answer.arrays, self.server_round)
        return arrays, num_examples, reported
