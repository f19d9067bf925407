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
import numbers
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict
from numpy.typing import NDArray

from flwr_admm.client.local_init import LOCAL_INITS, LocalInit, resolved_init
from flwr_admm.clientapp.duals import DualsRound, accel_z, client_held
from flwr_admm.protocol import (
    CLIENT_KEY,
    DP_CLIP,
    DP_NOISE,
    MESSAGE_PROXIMAL_MU,
    MESSAGE_SERVER_ROUND,
    MESSAGE_STATE_META,
    MESSAGE_STATE_W,
    META_ROUND,
    NUM_EXAMPLES,
    PARTITION_ID,
    RHO,
    START_MARK,
    START_RECORD,
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
    "warm_start",
]

Named = dict[str, NDArray[Any]]


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


def received_arrays(message: Message, arrayrecord_key: str = "arrays") -> Named:
    """Return the received tensors by name, as sent (dtypes and shapes kept).

    The ArrayRecord under `arrayrecord_key`, else the message's only one.
    """
    records = message.content.array_records
    if arrayrecord_key in records:
        record = records[arrayrecord_key]
    elif len(records) == 1:
        record = next(iter(records.values()))
    else:
        raise ValueError(f"{arrayrecord_key}: no such ArrayRecord in the message")
    return {name: array.numpy() for name, array in record.items()}


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


def build_reply(
    message: Message,
    arrays: Mapping[str, NDArray[Any]] | Sequence[NDArray[Any]],
    num_examples: int,
    metrics: Mapping[str, Any] | None = None,
    context: Context | None = None,
    *,
    arrayrecord_key: str = "arrays",
    configrecord_key: str = "config",
    weighted_by_key: str = NUM_EXAMPLES,
) -> Message:
    """Return the reply to `message`: w_i under the received names and dtypes, and metrics.

    The MetricRecord holds `metrics` (plain ints and floats), `weighted_by_key` =
    `num_examples` and, unless `metrics` has them, the node's ``partition-id`` and
    ``client-key`` (integers from ``context.node_config``). With a `context`, w_i (in
    float64) is then saved in ``context.state`` as the next warm start: last, so a
    handler that fails before never leaves a half-written state.
    """
    received = received_arrays(message, arrayrecord_key)
    names = list(received)
    values = [arrays[n] for n in names] if isinstance(arrays, Mapping) else list(arrays)
    if len(values) != len(names):
        raise ValueError(f"arrays: expected {len(names)} tensors {names}, got {len(values)}")
    if isinstance(num_examples, bool) or not isinstance(num_examples, numbers.Integral):
        raise ValueError(f"num_examples: must be an integer > 0, got {num_examples!r}")
    if num_examples <= 0:
        raise ValueError(f"num_examples: must be an integer > 0, got {num_examples!r}")
    w = {n: np.asarray(v, dtype=np.float64) for n, v in zip(names, values, strict=True)}
    record = ArrayRecord({n: Array(np.asarray(w[n], dtype=received[n].dtype)) for n in names})
    reported = _key_metrics(context) if context is not None else {}
    reported.update({name: _plain(value, name) for name, value in (metrics or {}).items()})
    reported[weighted_by_key] = int(num_examples)
    reply = Message(
        RecordDict({arrayrecord_key: record, "metrics": MetricRecord(reported)}), reply_to=message
    )
    if context is not None:
        config = message.content.config_records.get(configrecord_key, ConfigRecord())
        _keep_warm_start(context, w, config.get(MESSAGE_SERVER_ROUND))
    return reply


def _keep_warm_start(context: Context, w: Named, server_round: Any) -> None:
    """Save w_i (float64, named) and its round in ``context.state``, if w_i is finite."""
    if not all(np.all(np.isfinite(t)) for t in w.values()):
        return  # a NaN warm start would poison every later round
    context.state.array_records[MESSAGE_STATE_W] = ArrayRecord({n: Array(t) for n, t in w.items()})
    if isinstance(server_round, int) and not isinstance(server_round, bool):
        context.state.config_records[MESSAGE_STATE_META] = ConfigRecord({META_ROUND: server_round})


def _key_metrics(context: Context) -> dict[str, Any]:
    """Return ``partition-id`` / ``client-key`` of the node config (integers only)."""
    found = {}
    for name in (PARTITION_ID, CLIENT_KEY):
        value = context.node_config.get(name)
        if isinstance(value, int) and not isinstance(value, bool):
            found[name] = value
    return found


def _plain(value: Any, name: str) -> Any:
    """Return `value` as a MetricRecord accepts it (int, float or a list of them)."""
    if isinstance(value, list):
        return [_plain(v, name) for v in value]
    if isinstance(value, bool | np.bool_):
        return int(value)
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, numbers.Real):
        return float(value)
    raise ValueError(f"metrics[{name!r}]: must be a number (MetricRecord), got {value!r}")


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
        consensus = None
        if client_held(config):
            if rho <= 0 or server_round is None:
                raise ValueError(
                    "client-held duals need rho > 0 and an integer server-round in the "
                    f"config, got rho={rho!r}, server-round={config.get(MESSAGE_SERVER_ROUND)!r}"
                )
            names = list(center)
            z_k = accel_z(message, names) or None  # fast ADMM only
            duals = DualsRound.open(context.state, list(center.values()), config, server_round, z_k)
            state = duals.state
            previous = None if state is None else dict(zip(names, state.w, strict=True))
            consensus = center  # z^k (z^_(k+1) under fast ADMM): init="consensus"
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
        )

    def start(self, *, init: LocalInit | None = None) -> Named:
        """Return where the local solve starts (copies), `start_source`'s rule.

        `init` is `ADMMClient`'s ``local_init``: "previous" (the node's previous w_i
        under FedADMM with rho > 0; v_i in a first round), "center" (v_i), "consensus"
        (the received z; ValueError if the message has none) or "auto" (default:
        "consensus" when z is received, else "previous"). FedProx, FedAvg and
        rho = 0 start at the received arrays.
        """
        chosen = local_init_of(init)
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
    ) -> Message:
        """Return the reply (`build_reply`); with `context`, keep w_i as the next warm start.

        With client-held duals the reply carries Delta_i (and sigma_i' when asked) and
        the protocol metrics, and both dual states are kept in ``context.state``
        (required then).
        """
        if self.duals is not None:
            if context is None:
                raise ValueError("context: required with client-held duals (states live there)")
            reported = _key_metrics(context)
            reported.update({name: _plain(value, name) for name, value in (metrics or {}).items()})
            return self.duals.answer(
                self.message,
                list(self.center),
                arrays,
                num_examples,
                reported,
                context.state,
                arrayrecord_key=self.arrayrecord_key,
            )
        return build_reply(
            self.message,
            arrays,
            num_examples,
            self.mark(metrics),
            context,
            arrayrecord_key=self.arrayrecord_key,
            configrecord_key=self.configrecord_key,
        )
