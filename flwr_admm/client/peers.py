"""Client side of the peer baselines SCAFFOLD and FedDyn, run by `ADMMClient`.

The fit config's ``peer-algorithm`` picks the algorithm; the client's state lives in
its ``context.state`` (else in the client object) and is written last, after anything
that can fail, tagged with its round.

Acknowledgement (the math: `flwr_admm.rounds.peers`). The client keeps its newest
state P (under ``flwr_admm.scaffold.c`` / ``flwr_admm.feddyn.grad``, round p) and the
one before it C (``*.committed``, round a_c), and trains from the one the fit
config's ``admm-ack-round`` a names (`PeerState.start`): P if p == a, C if a_c == a,
else the zero state (a == 0: the server holds none of it; otherwise its state was
lost: it resyncs). Without an ``admm-ack-round`` it trains from P, as if its last
reply had been folded. The reply reports the round of the state it trained from
(``admm-previous-round``, 0: the zero state); the new state becomes P and the state
it trained from C.

SCAFFOLD (Karimireddy et al. 2020, option II). The parameters are x followed by c.
With c_i the client's control variate (zero at first), K local steps of size lr on
g = grad f_i(y) - c_i + c from y = x, then

    c_i+ = c_i - c + (x - y_i) / (K lr)

and the reply is y_i followed by c_i+ - c_i (K = 0: y_i = x and no change).

FedDyn (Acar et al. 2021). The parameters are x; with grad_i the client's linear term
(zero at first) and alpha from ``feddyn-alpha``, local steps from w = x on

    min_w  f_i(w) - <grad_i, w> + alpha/2 ||w - x||^2,     then
    grad_i <- grad_i - alpha (w_i - x)

and the reply is w_i.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
from flwr.common import ArrayRecord, ConfigRecord, Context, Scalar

from flwr_admm.core.local_solver import LocalPlan, LocalResult, penalized_local_solve
from flwr_admm.models.base import Model, Params
from flwr_admm.protocol import (
    ACK_ROUND,
    FEDDYN_ALPHA,
    FEDDYN_COMMITTED_GRAD,
    FEDDYN_STATE_GRAD,
    LOCAL_STEPS,
    LOSS,
    META_ROUND,
    PEER,
    PEER_COMMITTED_META,
    PEER_FEDDYN,
    PEER_SCAFFOLD,
    PEER_STATE_META,
    PREVIOUS_ROUND,
    SCAFFOLD_COMMITTED_C,
    SCAFFOLD_STATE_C,
)
from flwr_admm.uplink.channel import ClientUplink

PEERS = (PEER_SCAFFOLD, PEER_FEDDYN)


COMMITTED = {SCAFFOLD_STATE_C: SCAFFOLD_COMMITTED_C, FEDDYN_STATE_GRAD: FEDDYN_COMMITTED_GRAD}
Kept = tuple[Params, int]  # a kept state and its round (0: the zero state)


@dataclass
class PeerState:
    """Where a client keeps its peer states: a node's context, else this holder.

    `name` is the newest state's record (``flwr_admm.scaffold.c``,
    ``flwr_admm.feddyn.grad``); the committed one lives under ``COMMITTED[name]``.
    """

    context: Context | None
    kept: dict[str, Kept]

    def start(self, name: str, shapes: list[tuple[int, ...]], ack: object) -> Kept:
        """Return the state to train from and its round for ack round `ack` (module docstring).

        Raises ValueError naming ``admm-ack-round`` unless it is None or an integer >= 0.
        """
        if ack is not None and (isinstance(ack, bool) or not isinstance(ack, int) or ack < 0):
            raise ValueError(f"{ACK_ROUND}: must be an integer >= 0, got {ack!r}")
        newest = self._load(name, PEER_STATE_META, shapes)
        if ack is None and newest is not None:
            return newest
        for kept in (newest, self._load(COMMITTED[name], PEER_COMMITTED_META, shapes)):
            if kept is not None and kept[1] == ack:
                return kept
        return [np.zeros(shape) for shape in shapes], 0

    def save(self, name: str, arrays: Params, server_round: int, base: Kept) -> None:
        """Keep `arrays` as the newest state, `base` (what it trained from) as committed.

        Call last: a failed fit leaves the state as it was. A zero `base` (round 0) is
        not kept: the zero state needs no record.
        """
        self._store(name, PEER_STATE_META, (arrays, server_round))
        self._store(COMMITTED[name], PEER_COMMITTED_META, base if base[1] else None)

    def _load(self, name: str, meta: str, shapes: list[tuple[int, ...]]) -> Kept | None:
        """Return the kept arrays `name` and their round; None if absent or of other shapes."""
        if self.context is None:
            kept = self.kept.get(name)
            arrays, server_round = (None, 0) if kept is None else kept
        else:
            record = self.context.state.array_records.get(name)
            arrays = None if record is None else list(record.to_numpy_ndarrays())
            config = self.context.state.config_records.get(meta)
            value = 0 if config is None else config.get(META_ROUND, 0)
            server_round = value if isinstance(value, int) else 0
        if arrays is None or [np.shape(a) for a in arrays] != shapes:
            return None
        return [np.asarray(a, dtype=np.float64) for a in arrays], server_round

    def _store(self, name: str, meta: str, kept: Kept | None) -> None:
        if self.context is None:
            if kept is None:
                self.kept.pop(name, None)
            else:
                self.kept[name] = ([a.copy() for a in kept[0]], kept[1])
            return
        state = self.context.state
        if kept is None:
            state.array_records.pop(name, None)
            state.config_records.pop(meta, None)
            return
        state.array_records[name] = ArrayRecord([np.array(a) for a in kept[0]])
        state.config_records[meta] = ConfigRecord({META_ROUND: int(kept[1])})


@dataclass(frozen=True)
class LocalData:
    """What the local loop needs: model, data, plan and the step's random stream."""

    model: Model
    X: np.ndarray
    y: np.ndarray
    plan: LocalPlan
    rng: np.random.Generator


class PeerClient(Protocol):
    """What `client_fit` reads of an `ADMMClient`."""

    model: Model
    X: np.ndarray
    y: np.ndarray
    seed: int
    partition_id: Any
    _peers: PeerState

    def _key_metrics(self) -> dict[str, Scalar]: ...


def client_fit(
    client: PeerClient,
    received: Params,
    config: dict[str, Scalar],
    plan: LocalPlan,
    server_round: int,
    uplink: ClientUplink,
) -> tuple[Params, int, dict[str, Scalar]]:
    """Run `fit_peer` for an ADMMClient; return its (arrays, num_examples, metrics) reply."""
    stream = [client.seed, int(client.partition_id or 0), server_round]
    data = LocalData(client.model, client.X, client.y, plan, np.random.default_rng(stream))
    compressed = uplink.compressor is not None or uplink.local_dp is not None
    arrays, metrics = fit_peer(data, received, config, client._peers, server_round, compressed)
    return arrays, int(client.X.shape[0]), {**metrics, **client._key_metrics()}


def peer_of(config: dict[str, Scalar]) -> str:
    """Return the config's ``peer-algorithm``; ValueError naming it when unknown."""
    value = config[PEER]
    if value not in PEERS:
        raise ValueError(f"{PEER}: must be one of {list(PEERS)}, got {value!r}")
    return str(value)


def fit_peer(
    data: LocalData,
    received: Params,
    config: dict[str, Scalar],
    state: PeerState,
    server_round: int,
    compressed: bool = False,
) -> tuple[Params, dict[str, Scalar]]:
    """Run one round of the peer algorithm the config names; return (reply, metrics).

    Raises ValueError when the config also asks for uplink compression or local DP
    (`compressed`): the peers send full-precision replies only.
    """
    if compressed:
        raise ValueError(
            f"{PEER}: uplink compression and local DP are not supported with "
            f"{config[PEER]!r}; drop the uplink*/dp-* entries"
        )
    ack = config.get(ACK_ROUND)
    if peer_of(config) == PEER_SCAFFOLD:
        return scaffold_fit(data, received, state, server_round, ack)
    return feddyn_fit(data, received, _alpha(config), state, server_round, ack)


def scaffold_fit(
    data: LocalData, received: Params, state: PeerState, server_round: int, ack: object = None
) -> tuple[Params, dict[str, Scalar]]:
    """Run SCAFFOLD's local round on [x, c] from the state `ack` names; reply [y_i, c_i+ - c_i]."""
    half = len(received) // 2
    x, c = received[:half], received[half:]
    shapes = [t.shape for t in x]
    if len(received) % 2 or [t.shape for t in c] != shapes:
        raise ValueError("parameters: SCAFFOLD sends x and c, two blocks of the same shapes")
    data.model.check_params(x, field="parameters")
    base = state.start(SCAFFOLD_STATE_C, shapes, ack)
    c_i = base[0]
    correction = [ck - cik for ck, cik in zip(c, c_i, strict=True)]  # g - c_i + c
    result = penalized_local_solve(
        data.model, x, data.X, data.y, data.plan, rng=data.rng, linear=correction
    )
    y = [np.asarray(t, dtype=np.float64) for t in result.params]
    scale = 1.0 / (result.steps * data.plan.learning_rate) if result.steps else 0.0
    # c_i+ - c_i = -c + (x - y_i) / (K lr)   (option II); K = 0: no change
    change = [
        scale * (xk - yk) - ck if result.steps else np.zeros_like(ck)
        for xk, yk, ck in zip(x, y, c, strict=True)
    ]
    c_plus = [a + d for a, d in zip(c_i, change, strict=True)]
    state.save(SCAFFOLD_STATE_C, c_plus, server_round, base)
    return [*y, *change], _metrics(result, base)


def feddyn_fit(
    data: LocalData,
    received: Params,
    alpha: float,
    state: PeerState,
    server_round: int,
    ack: object = None,
) -> tuple[Params, dict[str, Scalar]]:
    """Run FedDyn's local round around x from the state `ack` names; reply w_i.

    The new state is grad_i - alpha (w_i - x).
    """
    x = received
    data.model.check_params(x, field="parameters")
    base = state.start(FEDDYN_STATE_GRAD, [t.shape for t in x], ack)
    grad_i = base[0]
    result = penalized_local_solve(
        data.model,
        x,
        data.X,
        data.y,
        data.plan,
        center=x,
        rho=alpha,
        rng=data.rng,
        linear=[-g for g in grad_i],
    )
    w = [np.asarray(t, dtype=np.float64) for t in result.params]
    new_grad = [g - alpha * (wk - xk) for g, wk, xk in zip(grad_i, w, x, strict=True)]
    state.save(FEDDYN_STATE_GRAD, new_grad, server_round, base)
    return w, _metrics(result, base)


def _alpha(config: dict[str, Scalar]) -> float:
    """Return ``feddyn-alpha``: a finite number > 0 (ValueError naming the key otherwise)."""
    value = config.get(FEDDYN_ALPHA)
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"{FEDDYN_ALPHA}: must be a finite number > 0, got {value!r}")
    if not math.isfinite(float(value)) or value <= 0:
        raise ValueError(f"{FEDDYN_ALPHA}: must be a finite number > 0, got {value!r}")
    return float(value)


def _metrics(result: LocalResult, base: Kept) -> dict[str, Scalar]:
    """Return the loss, the steps and the round of the state trained from (0: zero)."""
    return {LOSS: float(result.loss), LOCAL_STEPS: int(result.steps), PREVIOUS_ROUND: base[1]}
