"""Client side of consensus ADMM with client-held duals (`FedADMMClientDuals`).

Client i keeps w_i, its scaled dual u_i (before the pending update), n_i and the
round it last took part in, in its ``context.state`` (`DualState`), and with uplink
compression its residual e_i (zero at first). Round k, given z^k:

    if it took part before:  d2_i = ||w_i - z^k||^2,  u_i += w_i - z^k   (`start_round`)
    w_i' ~ argmin f_i(w) + rho/2 ||w - (z^k - u_i)||^2      (the caller's local solve)
    Delta_i = n_i' (w_i' + u_i) - n_i c_i,  c_i = w_i + u_i   (`contribution_change`)

With a compressor in the fit config (`uplink_change`, error feedback): x = Delta_i +
e_i, payload = encode(x), e_i' = x - decode(payload); the reply is the payload and the
server adds decode(payload) to S, so S = sum_i n_i c_i - sum_i e_i at all times.
Without one, a kept residual is flushed: x = Delta_i + e_i is sent in full, e_i' = 0.

The reply carries Delta_i (or its payload) as its parameters and the protocol metrics
(`reply_metrics`): the previous round (0: none), the change of n_i, ||w_i'||^2,
||u_i||^2 and d2_i when it took part before. The state is stored last
(`save_state`), after anything that can fail.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from flwr.common import ArrayRecord, ConfigRecord, Parameters, RecordDict, Scalar
from numpy.typing import NDArray

from flwr_admm.compression import Compressor

Arrays = list[NDArray[np.float64]]

MODE_KEY = "admm-duals"  # fit config: "client" switches ADMMClient to this protocol
MODE_CLIENT = "client"
PREVIOUS_ROUND = "admm-previous-round"  # reply metrics from here on
EXAMPLES_CHANGE = "admm-examples-change"
DELAYED_SQ_RESIDUAL = "admm-delayed-sq-residual"  # d2_i = ||w_i - z^k||^2
W_SQ_NORM = "admm-w-sq-norm"
U_SQ_NORM = "admm-u-sq-norm"
STATE_W = "flwr_admm.duals.w"
STATE_U = "flwr_admm.duals.u"
STATE_META = "flwr_admm.duals.meta"
STATE_RESIDUAL = "flwr_admm.duals.uplink_residual"


@dataclass
class DualState:
    """What a client keeps: w_i, u_i (before its pending update), n_i, its last round.

    `residual` is the uplink compression residual e_i (None: zero).
    """

    w: Arrays
    u: Arrays
    num_examples: int
    server_round: int
    residual: Arrays | None = None

    @property
    def contribution(self) -> Arrays:
        """C_i = w_i + u_i, the share S holds (times n_i)."""
        return [w + u for w, u in zip(self.w, self.u, strict=True)]


@dataclass(frozen=True)
class DualStart:
    """The client's view of round k: its updated dual, center and delayed residual."""

    dual: Arrays
    center: Arrays
    delayed_sq_residual: float | None


def start_round(state: DualState | None, z: Arrays) -> DualStart:
    """U_i += w_i - z^k if it took part before (d2 = ||w_i - z^k||^2); center z^k - u_i."""
    if state is None:
        dual = [np.zeros_like(t) for t in z]
        return DualStart(dual, [t.copy() for t in z], None)
    diff = [w - t for w, t in zip(state.w, z, strict=True)]
    d2 = float(sum(np.vdot(d, d) for d in diff))
    dual = [u + d for u, d in zip(state.u, diff, strict=True)]
    return DualStart(dual, [t - u for t, u in zip(z, dual, strict=True)], d2)


def contribution_change(
    state: DualState | None, w: Arrays, dual: Arrays, num_examples: int
) -> Arrays:
    """Delta_i = n_i' (w_i' + u_i) - n_i c_i (n_i c_i = 0 before the first round)."""
    change = [float(num_examples) * (a + u) for a, u in zip(w, dual, strict=True)]
    if state is not None:
        for delta, old in zip(change, state.contribution, strict=True):
            delta -= float(state.num_examples) * old
    return change


@dataclass(frozen=True)
class UplinkChange:
    """What the client sends for Delta_i: the arrays the server rebuilds, the payload."""

    arrays: Arrays  # decode(payload), or x in full precision
    payload: Parameters | None  # None: send `arrays` as plain numpy
    residual: Arrays | None  # e_i' to keep (None: zero)


def uplink_change(
    change: Arrays,
    residual: Arrays | None,
    compressor: Compressor | None,
    rng: np.random.Generator,
) -> UplinkChange:
    """X = Delta_i + e_i; compressed: payload = encode(x), e_i' = x - decode(payload).

    Without a compressor x is sent in full and e_i' = 0 (a kept residual is flushed).
    """
    x = change if residual is None else [d + e for d, e in zip(change, residual, strict=True)]
    if compressor is None:
        return UplinkChange(x, None, None)
    payload = compressor.encode(x, rng)
    sent = compressor.decode(payload, [t.shape for t in x])
    return UplinkChange(sent, payload, [a - b for a, b in zip(x, sent, strict=True)])


def reply_metrics(
    state: DualState | None, start: DualStart, w: Arrays, num_examples: int
) -> dict[str, Scalar]:
    """The protocol metrics of a reply (see `FedADMMClientDuals`)."""
    metrics: dict[str, Scalar] = {
        PREVIOUS_ROUND: 0 if state is None else int(state.server_round),
        EXAMPLES_CHANGE: int(num_examples) - (0 if state is None else int(state.num_examples)),
        W_SQ_NORM: float(sum(np.vdot(t, t) for t in w)),
        U_SQ_NORM: float(sum(np.vdot(u, u) for u in start.dual)),
    }
    if start.delayed_sq_residual is not None:
        metrics[DELAYED_SQ_RESIDUAL] = start.delayed_sq_residual
    return metrics


def load_state(records: RecordDict, shapes: list[tuple[int, ...]]) -> DualState | None:
    """The kept state from a context's RecordDict, or None (also if shapes differ)."""
    if STATE_META not in records.config_records or STATE_W not in records.array_records:
        return None
    meta = records.config_records[STATE_META]
    w = [
        np.asarray(a, dtype=np.float64) for a in records.array_records[STATE_W].to_numpy_ndarrays()
    ]
    u = [
        np.asarray(a, dtype=np.float64) for a in records.array_records[STATE_U].to_numpy_ndarrays()
    ]
    if [t.shape for t in w] != shapes or [t.shape for t in u] != shapes:
        return None
    residual = None
    if STATE_RESIDUAL in records.array_records:
        kept = records.array_records[STATE_RESIDUAL].to_numpy_ndarrays()
        residual = [np.asarray(a, dtype=np.float64) for a in kept]
        if [t.shape for t in residual] != shapes:
            return None
    return DualState(w, u, int(meta["num_examples"]), int(meta["round"]), residual)  # type: ignore[arg-type]


def save_state(records: RecordDict, state: DualState) -> None:
    """Store the state in a context's RecordDict (call last: after anything can fail)."""
    records.array_records[STATE_W] = ArrayRecord([t.copy() for t in state.w])
    records.array_records[STATE_U] = ArrayRecord([t.copy() for t in state.u])
    if state.residual is not None:
        records.array_records[STATE_RESIDUAL] = ArrayRecord([t.copy() for t in state.residual])
    elif STATE_RESIDUAL in records.array_records:
        del records.array_records[STATE_RESIDUAL]
    records.config_records[STATE_META] = ConfigRecord(
        {"num_examples": int(state.num_examples), "round": int(state.server_round)}
    )
