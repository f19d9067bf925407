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

from flwr_admm.core.client_duals import DualStart, DualState
from flwr_admm.core.types import Arrays
from flwr_admm.protocol import (
    DELAYED_SQ_RESIDUAL,
    EXAMPLES_CHANGE,
    META_NUM_EXAMPLES,
    META_ROUND,
    PREVIOUS_ROUND,
    U_SQ_NORM,
    W_SQ_NORM,
)
from flwr_admm.protocol import (
    DUALS_STATE_META as STATE_META,
)
from flwr_admm.protocol import (
    DUALS_STATE_RESIDUAL as STATE_RESIDUAL,
)
from flwr_admm.protocol import (
    DUALS_STATE_U as STATE_U,
)
from flwr_admm.protocol import (
    DUALS_STATE_W as STATE_W,
)
from flwr_admm.uplink.compression import Compressor


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
    return DualState(w, u, int(meta[META_NUM_EXAMPLES]), int(meta[META_ROUND]), residual)  # type: ignore[arg-type]


def save_state(records: RecordDict, state: DualState) -> None:
    """Store the state in a context's RecordDict (call last: after anything can fail)."""
    records.array_records[STATE_W] = ArrayRecord([t.copy() for t in state.w])
    records.array_records[STATE_U] = ArrayRecord([t.copy() for t in state.u])
    if state.residual is not None:
        records.array_records[STATE_RESIDUAL] = ArrayRecord([t.copy() for t in state.residual])
    elif STATE_RESIDUAL in records.array_records:
        del records.array_records[STATE_RESIDUAL]
    records.config_records[STATE_META] = ConfigRecord(
        {META_NUM_EXAMPLES: int(state.num_examples), META_ROUND: int(state.server_round)}
    )
