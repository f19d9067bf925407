"""Helpers for a user's own ``@app.train()`` handler under `flwr_admm.serverapp.FedADMM`.

FedADMM sends each node its center v_i = z - u_i under ``arrays`` and rho_i under
``rho`` and ``proximal-mu`` in ``config``; the node approximately solves

    min_w  f_i(w) + rho_i/2 ||w - v_i||^2

and replies with w_i and ``num-examples``. An unmodified FedProx-style handler does
exactly this from the received arrays. Starting instead from the node's own previous
w_i (a warm start kept in ``context.state``) removes the bias that restarting an
inexact solve at v_i leaves. A handler using these helpers::

    @app.train()
    def train(msg: Message, context: Context) -> Message:
        step = ADMMTrainStep.from_message(msg, context)
        w = step.start()                       # dict name -> float64 array (init=...)
        ...                                    # local steps on f_i + step.rho/2 ||w - center||^2
        return step.reply(w, num_examples=n, metrics={"loss": loss}, context=context)

Under Flower's FedProx (``proximal-mu`` only) or FedAvg, `start` is the received
arrays and ``rho`` is mu or 0: the same handler serves every strategy. Under
`flwr_admm.serverapp.FedADMMClientDuals` (``admm-duals = "client"``) the same handler
runs the client-held-dual protocol: `from_message` picks the acknowledged state from
``context.state`` and updates u_i (``center`` = z^k - u_i, ``consensus`` = the received
z^k), and `reply` sends Delta_i and keeps the states (pass `context`).

Where the local solve starts is `ADMMClient`'s ``local_init`` (`start`'s ``init``,
`flwr_admm.client.local_init`): "previous" (w_i), "center" (v_i) or "consensus" (the
received z: FedADMM sends it under ``admm-start`` next to v_i, client-held duals send
z itself); "auto", the default, is "consensus" wherever z is received.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from flwr.app import Context, Message
from numpy.typing import NDArray

from flwr_admm.client.local_init import LOCAL_INITS, LocalInit, resolved_init
from flwr_admm.clientapp.duals import DualsRound, accel_z, client_held
from flwr_admm.clientapp.records import (
    Named,
    build_reply,
    key_metrics,
    plain,
    received_arrays,
    received_dual,
)
from flwr_admm.core.linearized import check_form, scale_of_budget, step_budget
from flwr_admm.protocol import (
    DP_CLIP,
    DP_NOISE,
    FORM,
    MESSAGE_PROXIMAL_MU,
    MESSAGE_SERVER_ROUND,
    MESSAGE_STATE_W,
    RHO,
    START_MARK,
    START_RECORD,
    STEP_BUDGET,
    UPLINK,
)

__all__ = [
    "ADMMTrainStep",
    "build_reply",
    "local_init_of",
    "read_rho",
    "received_arrays",
    "refuse_uplink",
    "start_source",
    "starts_at_z",
    "step_budget",
    "warm_start",
]


def refuse_uplink(config: Mapping[str, Any]) -> None:
    """Raise ValueError if the server asks for uplink compression or local DP.

    A handler built on `ADMMTrainStep` or `flwr_admm.torch.TorchADMM` replies with
    plain tensors: it neither compresses nor clips and noises. The ready client
    (`flwr_admm.clientapp.make_client_app`, `flwr_admm.ADMMClient`) does both; a
    silent plain reply would let the server report a privacy it did not get.
    """
    for key in config:
        if key.startswith(UPLINK) or key in (DP_CLIP, DP_NOISE):
            raise ValueError(
                f"{key}: the strategy asks for uplink compression or local DP, which this "
                "handler does not apply (ADMMTrainStep / TorchADMM reply with plain "
                "tensors); drop uplink / local_dp from the strategy, or serve the model "
                "with the ready client (make_client_app, ADMMClient)"
            )


def read_rho(config: Mapping[str, Any]) -> float:
    """Return rho_i: ``rho``, else ``proximal-mu`` (Flower's FedProx), else 0."""
    value = config.get(RHO, config.get(MESSAGE_PROXIMAL_MU, 0.0))
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"rho: must be a number >= 0, got {value!r}")
    if not (math.isfinite(value) and value >= 0):
        raise ValueError(f"rho: must be a finite number >= 0, got {value!r}")
    return float(value)


def warm_start(context: Context, like: Mapping[str, NDArray[Any]]) -> Named | None:
    """Return the w_i this node last replied with, if it has the names and shapes of `like`."""
    record = context.state.array_records.get(MESSAGE_STATE_W)
    if record is None or list(record.keys()) != list(like):
        return None
    previous = {name: np.asarray(record[name].numpy(), dtype=np.float64) for name in like}
    if any(previous[name].shape != np.shape(like[name]) for name in like):
        return None
    return previous


def local_init_of(init: str | None = None) -> LocalInit:
    """Return the start `init` names ("auto" for None); ValueError unless in LOCAL_INITS."""
    if init is None:
        return "auto"
    if init not in LOCAL_INITS:
        raise ValueError(f"init: must be one of {list(LOCAL_INITS)}, got {init!r}")
    return init  # type: ignore[return-value]


def starts_at_z(init: LocalInit) -> bool:
    """Return whether `init` starts the solve at z wherever z is received (START_MARK)."""
    return resolved_init(init, z_received=True) == "consensus"


def start_source(
    init: LocalInit,
    *,
    admm: bool,
    rho: float,
    center: Named,
    previous: Named | None,
    consensus: Named | None,
) -> Named:
    """Return the tensors the local solve starts from, for `init` (`ADMMClient`'s rule).

    FedADMM with rho > 0: the previous w_i ("previous", when kept), v_i ("center",
    and "previous" in a first round) or the received z ("consensus": `consensus`, sent
    by FedADMM under ``admm-start`` and by client-held duals); "auto" is "consensus"
    when `consensus` is given, else "previous". Otherwise (FedProx, FedAvg, rho = 0)
    the received arrays: no penalty ties w to z, so a warm start would ignore it.
    """
    if not (admm and rho > 0):
        return center
    init = resolved_init(init, z_received=consensus is not None)  # type: ignore[assignment]
    if init == "consensus":
        if consensus is None:
            raise ValueError(
                "local_init / init: 'consensus' starts the local solve at the received z, "
                f"which this message does not carry (no {START_RECORD!r} record and not "
                "client-held duals): use 'auto', 'previous' or 'center'"
            )
        return consensus
    if init == "previous" and previous is not None:
        return previous
    return center


@dataclass(frozen=True)
class ADMMTrainStep:
    """What a train handler needs for one local ADMM step, read from the message.

    Attributes
    ----------
    message : Message
        The received message (the reply answers it).
    center : dict
        v_i by name, as float64 (the received arrays).
    rho : float
        rho_i (``rho``, else ``proximal-mu``, else 0).
    admm : bool
        True when the server is FedADMM (``rho`` in the config).
    server_round : int or None
        ``server-round`` of the config.
    config : dict
        The received config (a copy).
    previous : dict or None
        The node's last w_i from ``context.state`` (names and shapes match), else None.
    duals : DualsRound or None
        Under `flwr_admm.serverapp.FedADMMClientDuals` (``admm-duals = "client"``): the
        acknowledged state and the updated dual u_i; `center` is then z^k - u_i,
        `previous` the acknowledged w_i, and `reply` sends Delta_i and keeps the states.
    form : {"prox", "linearized"}
        ``admm-form`` of the config. Under FedADMM's linearized form
        (`flwr_admm.core.linearized`) `center` and `consensus` are the received z, rho
        is 0 and `correction` is y_i: run K steps w <- w - lr (grad f_i(w) + y_i) from
        `start` (z), no prox term, and pass ``step_budget=step_budget(K, lr)`` (with
        momentum: ``step_budget(K, lr, momentum)``) to `reply`: rho_i = 1 / b_i.
    correction : dict or None
        y_i by name (float64) under the linearized form (the ``admm-dual`` record, or
        u_i / b_i from the node's kept state under client-held duals), else None.
    consensus : dict or None
        The received z^k by name, float64 (the start of ``init="consensus"``): the
        ``admm-start`` record under FedADMM, the received arrays under client-held
        duals; None when the message carries no z.

    """

    message: Message
    center: Named
    rho: float
    admm: bool
    server_round: int | None
    config: dict[str, Any]
    previous: Named | None
    arrayrecord_key: str = "arrays"
    configrecord_key: str = "config"
    duals: DualsRound | None = None
    consensus: Named | None = None
    form: str = "prox"
    correction: Named | None = None
    started: dict[str, bool] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_message(
        cls,
        message: Message,
        context: Context,
        *,
        arrayrecord_key: str = "arrays",
        configrecord_key: str = "config",
    ) -> ADMMTrainStep:
        """Read the center, rho, the round and the warm start of one train message."""
        received = received_arrays(message, arrayrecord_key)
        center = {name: np.asarray(a, dtype=np.float64) for name, a in received.items()}
        record = message.content.config_records.get(configrecord_key)
        config = dict(record.items()) if record is not None else {}
        refuse_uplink(config)
        server_round = config.get(MESSAGE_SERVER_ROUND)
        server_round = server_round if isinstance(server_round, int) else None
        rho, duals, previous = read_rho(config), None, warm_start(context, center)
        consensus, form, correction = None, check_form(config.get(FORM, "prox")), None
        if form == "linearized" and not client_held(config):  # z, y_i under admm-dual
            consensus, correction = center, received_dual(message, list(center))
        elif client_held(config):
            if rho <= 0 or server_round is None:
                raise ValueError(
                    "client-held duals need rho > 0 and an integer server-round in the "
                    f"config, got rho={rho!r}, server-round={config.get(MESSAGE_SERVER_ROUND)!r}"
                )
            names = list(center)
            z_k = accel_z(message, names) or None  # fast ADMM only
            duals = DualsRound.open(context.state, list(center.values()), config, server_round, z_k)
            state = duals.own  # a restored state has no w_i
            previous = None if state is None else dict(zip(names, state.w, strict=True))
            consensus = center  # z^k (z^_(k+1) under fast ADMM): init="consensus"
            if form == "linearized":  # from z^k, y_i = u_i / b_i kept by the node
                correction = dict(zip(names, duals.correction, strict=True))
            else:
                center = dict(zip(names, duals.center, strict=True))  # v_i = z^k - u_i
        elif START_RECORD in message.content.array_records:  # server-held: z next to v_i
            start = message.content.array_records[START_RECORD]
            if list(start.keys()) != list(center):
                raise ValueError(
                    f"{START_RECORD}: expected tensors {list(center)}, got {list(start.keys())}"
                )
            consensus = {n: np.asarray(start[n].numpy(), dtype=np.float64) for n in center}
            for name, value in consensus.items():
                if value.shape != center[name].shape:
                    raise ValueError(
                        f"{START_RECORD}[{name!r}]: expected shape {center[name].shape}, "
                        f"got {value.shape}"
                    )
        return cls(
            message=message,
            center=center,
            rho=rho,
            admm=RHO in config,
            server_round=server_round,
            config=config,
            previous=previous,
            arrayrecord_key=arrayrecord_key,
            configrecord_key=configrecord_key,
            duals=duals,
            consensus=consensus,
            form=form,
            correction=correction,
        )

    def start(self, *, init: LocalInit | None = None) -> Named:
        """Return where the local solve starts (copies), `start_source`'s rule.

        `init` is `ADMMClient`'s ``local_init``: "previous" (the node's previous w_i
        under FedADMM with rho > 0; v_i in a first round), "center" (v_i), "consensus"
        (the received z; ValueError if the message has none) or "auto" (default:
        "consensus" when z is received, else "previous"). FedProx, FedAvg and
        rho = 0 start at the received arrays. The linearized form starts at z ("auto"
        or "consensus"; any other `init`: ValueError).
        """
        chosen = local_init_of(init)
        if self.form == "linearized":
            if chosen not in ("auto", "consensus"):
                raise ValueError(f"init: the linearized form starts at z, got {chosen!r}")
            return {name: a.copy() for name, a in self.center.items()}
        source = start_source(
            chosen,
            admm=self.admm,
            rho=self.rho,
            center=self.center,
            previous=self.previous,
            consensus=self.consensus,
        )
        self.started["at_z"] = starts_at_z(chosen)  # the reply's START_MARK
        return {name: a.copy() for name, a in source.items()}

    def mark(self, metrics: Mapping[str, Any] | None) -> dict[str, Any]:
        """Return `metrics` with START_MARK under server-held FedADMM (1: started at z).

        A FedADMM reply without the mark comes from a stock FedProx handler, whose dual
        the server holds at 0 (`flwr_admm.serverapp.FedADMM`).
        """
        marked = dict(metrics or {})
        if self.admm and self.duals is None:
            marked[START_MARK] = int(self.started.get("at_z", False))
        return marked

    def reply(
        self,
        arrays: Mapping[str, NDArray[Any]] | Sequence[NDArray[Any]],
        num_examples: int,
        metrics: Mapping[str, Any] | None = None,
        context: Context | None = None,
        *,
        step_budget: float | None = None,
    ) -> Message:
        """Return the reply (`build_reply`); with `context`, keep w_i as the next warm start.

        Under the linearized form `step_budget` b_i (`step_budget`) is required and sent
        as ``admm-step-budget``. With client-held duals the reply carries Delta_i (and
        sigma_i' when asked) and the protocol metrics, and both dual states are kept in
        ``context.state`` (required then).
        """
        if self.duals is not None:
            if context is None:
                raise ValueError("context: required with client-held duals (states live there)")
            reported = key_metrics(context)
            reported.update({name: plain(value, name) for name, value in (metrics or {}).items()})
            if self.form == "linearized":
                reported[STEP_BUDGET] = _budget_given(step_budget)
            return self.duals.answer(
                self.message,
                list(self.center),
                arrays,
                num_examples,
                reported,
                context.state,
                arrayrecord_key=self.arrayrecord_key,
                budget=step_budget if self.form == "linearized" else None,
            )
        marked = self.mark(metrics)
        if self.form == "linearized":
            marked[STEP_BUDGET] = _budget_given(step_budget)
        return build_reply(
            self.message,
            arrays,
            num_examples,
            marked,
            context,
            arrayrecord_key=self.arrayrecord_key,
            configrecord_key=self.configrecord_key,
        )


def _budget_given(step_budget: float | None) -> float:
    """Return the linearized form's b_i; ValueError naming ``step_budget`` unless > 0."""
    if step_budget is None:
        raise ValueError(
            "step_budget: the linearized form needs the local step budget "
            "K lr (K lr / (1 - momentum) with momentum SGD): rho_i = 1 / b_i"
        )
    scale_of_budget(step_budget, "step_budget")  # ValueError unless finite and > 0
    return float(step_budget)
