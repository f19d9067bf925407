"""Client side of consensus ADMM with client-held duals (`FedADMMClientDuals`).

Client i keeps w_i, its scaled dual u_i (before the pending update), n_i and the
round it last took part in, in its ``context.state`` (`DualState`), and with uplink
compression its residual e_i (zero at first). It keeps two such states (`KeptDuals`):
the committed one (what the server's S holds) and the pending one (after its last
reply), and trains from the one the fit config's ``admm-ack-round`` names
(`flwr_admm.core.client_duals.acknowledged`). Round k, given z^k:

    if it took part before:  d2_i = ||w_i - z^k||^2,  u_i += w_i - z^k   (`start_round`)
    w_i' ~ argmin f_i(w) + rho/2 ||w - (z^k - u_i)||^2      (the caller's local solve)
    Delta_i = n_i' (w_i' + u_i) - n_i c_i,  c_i = w_i + u_i   (`contribution_change`)

With a compressor in the fit config (`uplink_change`, error feedback): x = Delta_i +
e_i, payload = encode(x), e_i' = x - decode(payload); the reply is the payload and the
server adds decode(payload) to S, so S = sum_i n_i c_i - sum_i e_i at all times.
Without one, a kept residual is flushed: x = Delta_i + e_i is sent in full, e_i' = 0.
With ``admm-rebuild = 1`` the reply also carries the full new share sigma_i' =
n_i' c_i' - e_i' in full precision, as a second block of tensors (`with_share`).

With fast ADMM (``admm-accel-gamma`` in the fit config, `FedADMMClientDuals(
acceleration=...)`) the received tensors are z^_{k+1} followed by z_k, and the client
extrapolates its own dual (`extrapolation`, `flwr_admm.core.client_duals`), keeping
u_i,prev in both states.

The reply carries Delta_i (or its payload) as its parameters and the protocol metrics
(`reply_metrics`): the previous round (0: none), the change of n_i, ||w_i'||^2,
||u_i||^2, d2_i when it took part before, and ``admm-resync``. The states are stored
last (`save_states`), after anything that can fail.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any, NamedTuple

import numpy as np
from flwr.common import ArrayRecord, ConfigRecord, Parameters, RecordDict, Scalar, ndarray_to_bytes
from numpy.typing import NDArray

from flwr_admm.core.client_duals import DualStart, DualState, Extrapolation
from flwr_admm.core.types import Arrays
from flwr_admm.protocol import (
    ACCEL_GAMMA,
    DELAYED_SQ_RESIDUAL,
    DUALS_PENDING_META,
    DUALS_PENDING_RESIDUAL,
    DUALS_PENDING_U,
    DUALS_PENDING_U_PREV,
    DUALS_PENDING_W,
    DUALS_STATE_META,
    DUALS_STATE_RESIDUAL,
    DUALS_STATE_U,
    DUALS_STATE_U_PREV,
    DUALS_STATE_W,
    EXAMPLES_CHANGE,
    HAT_SQ_RESIDUAL,
    META_BUDGET,
    META_NUM_EXAMPLES,
    META_ROUND,
    MODE_CLIENT,
    MODE_KEY,
    PREVIOUS_ROUND,
    RESTORED,
    RESYNC,
    U_SQ_NORM,
    W_SQ_NORM,
)
from flwr_admm.uplink.channel import ClientUplink
from flwr_admm.uplink.compression import Compressor


class Slot(NamedTuple):
    """The ``context.state`` records of one kept state: w, u, meta, residual."""

    w: str
    u: str
    meta: str
    residual: str
    u_prev: str


COMMITTED = Slot(
    DUALS_STATE_W, DUALS_STATE_U, DUALS_STATE_META, DUALS_STATE_RESIDUAL, DUALS_STATE_U_PREV
)
PENDING = Slot(
    DUALS_PENDING_W,
    DUALS_PENDING_U,
    DUALS_PENDING_META,
    DUALS_PENDING_RESIDUAL,
    DUALS_PENDING_U_PREV,
)


class KeptDuals(NamedTuple):
    """A client's two states: what S holds (committed), and after its last reply."""

    committed: DualState | None
    pending: DualState | None


@dataclass(frozen=True)
class UplinkChange:
    """What the client sends for Delta_i: the arrays the server rebuilds, the payload."""

    arrays: Arrays  # decode(payload), or x in full precision
    payload: Parameters | None  # None: send `arrays` as plain numpy
    residual: Arrays | None  # e_i' to keep (None: zero)


def split_accelerated(
    received: list[NDArray[np.float64]], config: Mapping[str, Scalar]
) -> tuple[list[NDArray[np.float64]], list[NDArray[np.float64]] | None]:
    """Split legacy parameters into z^_{k+1} and z_k under fast ADMM; else (all, None)."""
    if config.get(MODE_KEY) != MODE_CLIENT or ACCEL_GAMMA not in config:
        return received, None
    half = len(received) // 2
    return received[:half], received[half:]


def extrapolation(
    config: Mapping[str, Scalar], z_hat: Arrays, z: Arrays | None, secure: bool = False
) -> Extrapolation | None:
    """Return fast ADMM's round message (z_k, g), None without acceleration.

    `z_hat` is the received z^_{k+1}, `z` the received z_k (None if none was sent).
    Refused under SecAgg+ (`secure`).
    """
    if ACCEL_GAMMA not in config:
        return None
    if secure:
        raise ValueError(f"{ACCEL_GAMMA}: fast ADMM is not supported under SecAgg+")
    gamma = config[ACCEL_GAMMA]
    if isinstance(gamma, bool) or not isinstance(gamma, int | float) or not 0 <= gamma < 1:
        raise ValueError(f"{ACCEL_GAMMA}: must be a number in [0, 1), got {gamma!r}")
    if z is None or [t.shape for t in z] != [t.shape for t in z_hat]:
        raise ValueError(f"{ACCEL_GAMMA}: needs z_k after z^_(k+1), shaped like it")
    return Extrapolation([np.asarray(t, dtype=np.float64) for t in z], float(gamma))


def check_uplink(uplink: ClientUplink, *, secure: bool) -> None:
    """Refuse local DP, compression without error feedback, and compression under SecAgg+."""
    if uplink.local_dp is not None:
        raise ValueError(
            "dp: local DP is not supported with client-held duals (admm-duals = 'client'); "
            "use FedADMM"
        )
    if uplink.compressor is not None and secure:
        raise ValueError("uplink: compression is not supported under SecAgg+ (admm-secagg-*)")
    if uplink.compressor is not None and not uplink.compressor.error_feedback:
        raise ValueError(
            "uplink-error-feedback: client-held duals need error feedback "
            "(S would keep every compression error)"
        )


def uplink_change(
    change: Arrays,
    residual: Arrays | None,
    compressor: Compressor | None,
    rng: np.random.Generator,
) -> UplinkChange:
    """Send x = Delta_i + e_i; compressed: payload = encode(x), e_i' = x - decode(payload).

    Without a compressor x is sent in full and e_i' = 0 (a kept residual is flushed).
    """
    x = change if residual is None else [d + e for d, e in zip(change, residual, strict=True)]
    if compressor is None:
        return UplinkChange(x, None, None)
    payload = compressor.encode(x, rng)
    sent = compressor.decode(payload, [t.shape for t in x])
    return UplinkChange(sent, payload, [a - b for a, b in zip(x, sent, strict=True)])


def with_share(sent: UplinkChange, share: Arrays) -> UplinkChange:
    """Append sigma_i' (full-precision ``.npy`` tensors) after the change's own tensors."""
    payload = sent.payload
    if payload is not None:
        tensors = [*payload.tensors, *(ndarray_to_bytes(t) for t in share)]
        payload = Parameters(tensors=tensors, tensor_type=payload.tensor_type)
    return replace(sent, arrays=[*sent.arrays, *share], payload=payload)


def reply_metrics(
    state: DualState | None,
    start: DualStart,
    w: Arrays,
    num_examples: int,
    resync: bool,
    restored: bool = False,
) -> dict[str, Scalar]:
    """Return the protocol metrics of a reply (see `FedADMMClientDuals`).

    `restored`: `state` is the server's offer (``admm-restored`` = 1, no d2_i).
    """
    metrics: dict[str, Scalar] = {
        PREVIOUS_ROUND: 0 if state is None else int(state.server_round),
        EXAMPLES_CHANGE: int(num_examples) - (0 if state is None else int(state.num_examples)),
        W_SQ_NORM: float(sum(np.vdot(t, t) for t in w)),
        U_SQ_NORM: float(sum(np.vdot(u, u) for u in start.dual)),
        RESYNC: int(resync),
    }
    if restored:
        metrics[RESTORED] = 1
    elif start.delayed_sq_residual is not None:
        metrics[DELAYED_SQ_RESIDUAL] = start.delayed_sq_residual
    if start.z_hat is not None:  # fast ADMM: ||w_i' - z^||^2 for the restart test
        diff = [a - b for a, b in zip(w, start.z_hat, strict=True)]
        metrics[HAT_SQ_RESIDUAL] = float(sum(np.vdot(d, d) for d in diff))
    return metrics


def load_states(records: RecordDict, shapes: list[tuple[int, ...]]) -> KeptDuals:
    """Return the committed and pending states kept in a context's RecordDict."""
    return KeptDuals(_load(records, shapes, COMMITTED), _load(records, shapes, PENDING))


def save_states(records: RecordDict, kept: KeptDuals) -> None:
    """Store both states in a context's RecordDict (call last: after anything can fail)."""
    _save(records, kept.committed, COMMITTED)
    _save(records, kept.pending, PENDING)


def _arrays(records: RecordDict, name: str) -> Arrays:
    return [
        np.asarray(a, dtype=np.float64) for a in records.array_records[name].to_numpy_ndarrays()
    ]


def _load(records: RecordDict, shapes: list[tuple[int, ...]], slot: Slot) -> DualState | None:
    """Return one kept state, or None (absent, incomplete, or shapes differ)."""
    arrays = records.array_records
    if slot.meta not in records.config_records or slot.w not in arrays or slot.u not in arrays:
        return None
    meta = records.config_records[slot.meta]
    w, u = _arrays(records, slot.w), _arrays(records, slot.u)
    residual = _arrays(records, slot.residual) if slot.residual in arrays else None
    u_prev = _arrays(records, slot.u_prev) if slot.u_prev in arrays else None
    if any([t.shape for t in a] != shapes for a in (w, u, residual or w, u_prev or w)):
        return None
    n, k = int(meta[META_NUM_EXAMPLES]), int(meta[META_ROUND])  # type: ignore[arg-type]
    budget = meta.get(META_BUDGET)  # the linearized form's b_i
    budget = float(budget) if isinstance(budget, int | float) else None
    return DualState(w, u, n, k, residual, u_prev, budget)


def _save(records: RecordDict, state: DualState | None, slot: Slot) -> None:
    """Write one state into its slot; None clears the slot."""
    arrays = records.array_records
    if state is None:
        for name in (slot.w, slot.u, slot.residual, slot.u_prev):
            arrays.pop(name, None)
        records.config_records.pop(slot.meta, None)
        return
    # np.array, not .copy(): w + u of 0-d tensors is a numpy scalar, which ArrayRecord refuses
    arrays[slot.w] = ArrayRecord([np.array(t) for t in state.w])
    arrays[slot.u] = ArrayRecord([np.array(t) for t in state.u])
    if state.residual is not None:
        arrays[slot.residual] = ArrayRecord([np.array(t) for t in state.residual])
    else:
        arrays.pop(slot.residual, None)
    if state.dual_prev is not None:
        arrays[slot.u_prev] = ArrayRecord([np.array(t) for t in state.dual_prev])
    else:
        arrays.pop(slot.u_prev, None)
    meta: dict[str, Any] = {
        META_NUM_EXAMPLES: int(state.num_examples),
        META_ROUND: int(state.server_round),
    }
    if state.budget is not None:
        meta[META_BUDGET] = float(state.budget)
    records.config_records[slot.meta] = ConfigRecord(meta)
