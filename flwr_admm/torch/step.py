"""`TorchADMM`: one node's inexact ADMM w-step for a `torch.nn.Module`, both Flower APIs.

The node approximately solves, over its trainable parameters w,

    min_w  f_i(w) + rho/2 ||w - v||^2

with v its center: v_i = z - u_i sent by `FedADMM` (server-held duals), v = z^k - u_i
computed here from the dual kept in ``context.state`` under `FedADMMClientDuals`
(``admm-duals = "client"``, legacy API), the received model under FedProx, and no
penalty under FedAvg. Inside the user's own loop::

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

Linearized form (``FedADMM(form="linearized")``): `start` loads z, `penalty_term`
is the linear term <y_i, w> in either mode, `after_step` counts the step budget b_i
the reply reports (`flwr_admm.torch.linearized`).

Tensors: the trainable parameters carry the penalty and, under FedADMM with rho > 0,
start where `start`'s ``init`` says (`ADMMClient`'s ``local_init``): the node's
previous w_i ("previous", the warm start), v ("center") or the received z
("consensus", as FedDyn's clients: the Message-API FedADMM sends z under
``admm-start``, client-held duals send z itself); "auto" (default) is "consensus"
wherever z is received, else "previous" (the legacy server-held API). Every
other tensor (BatchNorm statistics, ``num_batches_tracked``) is loaded from the
received model: the server's ``tensor_policy`` decides what it holds
(`flwr_admm.core.tensor_policy`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
import torch
from flwr.app import Context, Message

from flwr_admm.client import client_duals
from flwr_admm.client.admm_client import _flag
from flwr_admm.client.local_init import LocalInit
from flwr_admm.clientapp.step import (
    ADMMTrainStep,
    local_init_of,
    refuse_uplink,
    start_source,
    starts_at_z,
)
from flwr_admm.core import client_duals as dual_math
from flwr_admm.core.linearized import check_form
from flwr_admm.protocol import (
    ACCEL_GAMMA,
    FORM,
    LOCAL_STEPS,
    MODE_CLIENT,
    MODE_KEY,
    PARTITION_ID,
    REBUILD,
    RHO,
    SERVER_ROUND,
    START_MARK,
    STEP_BUDGET,
)
from flwr_admm.torch.legacy import (
    check_trainable_only,
    keep_legacy,
    legacy_previous,
    legacy_rho,
    prox_blocks,
)
from flwr_admm.torch.linearized import Budget, linearized_blocks
from flwr_admm.torch.state import load_arrays, state_arrays, trainable_names

__all__ = ["PENALTIES", "Penalty", "TorchADMM"]

Penalty = Literal["prox", "loss"]
PENALTIES = ("prox", "loss")
Named = dict[str, np.ndarray[Any, Any]]


@dataclass
class TorchADMM:
    """What one round of a node needs: the received model, v, rho, the warm start.

    Build it with `from_message` (Message API) or `from_parameters` (legacy API).

    Attributes
    ----------
    model : torch.nn.Module
        The node's model (changed in place by `start` and the user's loop).
    received : dict
        The received tensors by name, float64 (z, or v_i under server-held duals).
    rho : float
        rho_i (``rho``, else the FedProx mu, else 0).
    admm : bool
        The server is an ADMM strategy (``rho`` in the config): warm-start.
    penalty : {"prox", "loss"}
        How the penalty is applied (module docstring).
    previous : dict or None
        The node's last w_i (all tensors, float64), if its names and shapes match.
    consensus : dict or None
        The received z (float64): FedADMM's ``admm-start`` record, or z under
        client-held duals (where `received` becomes v_i = z - u_i); the start of
        ``init="consensus"``. None when no z is received.

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
    duals: client_duals.KeptDuals | None = None  # client-held duals: C and P
    consensus: Named | None = None  # client-held duals: the received z
    form: str = "prox"  # "linearized": FedADMM's linearized form (module docstring)
    correction: Named | None = None  # the linearized form's y_i by name
    # set by `start` and the client-held-dual setup, not by the caller
    _center: dict[int, torch.Tensor] = field(default_factory=dict, init=False, repr=False)
    _groups: dict[int, list[tuple[dict[str, Any], list[torch.Tensor], list[torch.Tensor]]]] = field(
        default_factory=dict, init=False, repr=False
    )
    _zero: torch.Tensor = field(default_factory=lambda: torch.zeros(()), init=False, repr=False)
    _begin: dual_math.DualStart | None = field(default=None, init=False, repr=False)
    _base: dual_math.Acknowledged | None = field(default=None, init=False, repr=False)
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
        if step.duals is not None:  # client-held duals, as `from_parameters` checks them
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
        names = list(model.state_dict())
        server_round = config.get(SERVER_ROUND)
        server_round = server_round if isinstance(server_round, int) else None
        if check_form(config.get(FORM, "prox")) == "linearized":  # z, then y_i
            if config.get(MODE_KEY) == MODE_CLIENT:
                raise ValueError(
                    f"{FORM}: the linearized form with client-held duals runs on the Message "
                    "API (TorchADMM.from_message); the legacy builder supports it server-held"
                )
            z, y = linearized_blocks(model, parameters)
            return cls(
                model,
                received=z,
                rho=0.0,
                admm=False,
                penalty=penalty,
                server_round=server_round,
                config=dict(config),
                context=context,
                consensus=z,
                form="linearized",
                correction=y,
            )
        received, consensus = prox_blocks(names, parameters, config)
        client_mode = config.get(MODE_KEY) == MODE_CLIENT
        value = legacy_rho(config)
        admm = cls(
            model,
            received,
            value,
            RHO in config,
            penalty,
            None if client_mode else legacy_previous(context, received),
            server_round,
            dict(config),
            context,
            consensus=consensus,
        )
        if client_mode:
            admm._open_client_duals()
        return admm

    def _open_client_duals(self) -> None:
        """Client-held duals: pick the acknowledged state, u_i += gamma (w_i - z), v = z - u_i."""
        if self.rho <= 0:
            raise ValueError(f"rho: must be > 0 with client-held duals, got {self.rho!r}")
        check_trainable_only(self.model, self.received)
        if self.context is None:
            raise ValueError("context: client-held duals keep the dual in context.state")
        if ACCEL_GAMMA in self.config:
            raise ValueError(
                f"{ACCEL_GAMMA}: fast ADMM with client-held duals is not supported by the "
                "torch step yet (use acceleration=None)"
            )
        z = list(self.received.values())
        kept = client_duals.load_states(self.context.state, [t.shape for t in z])
        self.duals = kept
        self._base = dual_math.opened(self.config, z, kept.committed, kept.pending)
        gamma = dual_math.dual_step_of(self.config)
        self._begin = dual_math.start_round(self._base.state, z, dual_step=gamma)
        state = self._base.own  # restored: no w_i
        self.previous = None if state is None else dict(zip(self.received, state.w, strict=True))
        self.consensus = dict(self.received)  # z: init="consensus" starts here
        self.received = dict(zip(self.received, self._begin.center, strict=True))
        self.admm = True

    # --------------------------------------------------------------- the loop
    def start(self, *, init: LocalInit | None = None) -> None:
        """Load the starting point into the model, as `ADMMClient`'s ``local_init``.

        Under FedADMM with rho > 0 the trainable parameters start at the previous w_i
        (``init="previous"``; v in a first round), at v ("center") or at the received z
        ("consensus": ValueError if none was received); "auto" (the default) is
        "consensus" wherever z is received, else "previous". Every other tensor, and
        every tensor under FedProx, FedAvg or rho = 0, starts at the received values.
        The linearized form starts at z ("auto" or "consensus"; else ValueError).
        """
        if self.form == "linearized":
            self._start_linearized(local_init_of(init))
            return
        source = start_source(
            local_init_of(init),
            admm=self.admm,
            rho=self.rho,
            center=self.received,
            previous=self.previous,
            consensus=self.consensus,
        )
        self._at_z = starts_at_z(local_init_of(init))  # the reply's START_MARK
        if self.train_step is not None:
            self.train_step.started["at_z"] = self._at_z
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

    def _start_linearized(self, chosen: LocalInit) -> None:
        """Load z into the model; keep y_i (and w_0, for a fitted budget) by parameter."""
        if chosen not in ("auto", "consensus"):
            raise ValueError(f"init: the linearized form starts at z, got {chosen!r}")
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
            held = self.context if self.train_step.duals is not None else None  # its states
            return self.train_step.reply(arrays, num_examples, reported, held, step_budget=budget)
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
        arrays = state_arrays(self.model)
        if self.form == "linearized":  # the server holds y_i: no state kept
            reported[STEP_BUDGET] = self.step_budget()  # first: it checks _budget
            reported[LOCAL_STEPS] = self._budget.steps if self._budget else 0
            return list(arrays.values()), num_examples, reported
        if self._begin is not None:
            return self._client_duals_result(arrays, num_examples, reported)
        if self.admm:  # FedADMM: 1 = send z, this solve starts there (START_MARK)
            reported[START_MARK] = int(self._at_z and self.rho > 0)
        if self.admm and self.context is not None:
            keep_legacy(self.context, arrays, self.server_round)
        return list(arrays.values()), num_examples, reported

    def _client_duals_result(
        self, arrays: Named, n: int, reported: dict[str, Any]
    ) -> tuple[list[np.ndarray[Any, Any]], int, dict[str, Any]]:
        """Reply with Delta_i = n_i' (w_i' + u_i) - n_i c_i; keep C and the new pending P."""
        assert self._begin is not None and self._base is not None and self.context is not None
        w = [np.asarray(t, dtype=np.float64) for t in arrays.values()]
        state = self._base.state
        change = dual_math.contribution_change(state, w, self._begin.dual, n)
        residual = None if state is None else state.residual
        sent = client_duals.uplink_change(change, residual, None, np.random.default_rng(0))
        server_round = self.server_round if self.server_round is not None else 0
        pending = dual_math.DualState(w, self._begin.dual, n, server_round, sent.residual)
        if _flag(self.config, REBUILD):
            sent = client_duals.with_share(sent, pending.share)
        base = self._base
        reported.update(
            client_duals.reply_metrics(state, self._begin, w, n, base.resync, base.restored)
        )
        kept = client_duals.KeptDuals(base.own, pending)  # an offer is made again, not kept
        client_duals.save_states(self.context.state, kept)
        return list(sent.arrays), n, reported
