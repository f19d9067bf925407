"""What a node keeps between rounds in ``context.state``, one slot per protocol.

The record names are in `flwr_admm.protocol`. FedADMM keeps w_i and its round (legacy
API: in wire order, with the fit count and the compression residual; Message API: by
tensor name); client-held duals keep the committed and the pending `DualState`;
SCAFFOLD and FedDyn keep the newest state (c_i or grad_i) and the one before it.

A state whose shapes differ from the received model's reads as None. Writers are
called last, after all that can fail, so a failed round leaves the state as it was
(Flower's deployment keeps what a failed handler wrote).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple

import numpy as np
from flwr.common import Array, ArrayRecord, ConfigRecord, RecordDict
from numpy.typing import NDArray

from flwr_admm.core.client_duals import DualState
from flwr_admm.core.types import Arrays
from flwr_admm.protocol import (
    DUALS_PENDING_META,
    DUALS_PENDING_RESIDUAL,
    DUALS_PENDING_U,
    DUALS_PENDING_W,
    DUALS_STATE_META,
    DUALS_STATE_RESIDUAL,
    DUALS_STATE_U,
    DUALS_STATE_W,
    MESSAGE_STATE_META,
    MESSAGE_STATE_W,
    META_BUDGET,
    META_FITS,
    META_NUM_EXAMPLES,
    META_ROUND,
    STATE_META,
    STATE_RESIDUAL,
    STATE_W,
)

__all__ = [
    "COMMITTED",
    "PENDING",
    "KeptDuals",
    "finite",
    "fit_count",
    "keep_legacy",
    "keep_message",
    "keep_residual",
    "legacy_previous",
    "legacy_residual",
    "load_kept",
    "load_states",
    "message_previous",
    "save_states",
    "store_kept",
]

Named = dict[str, NDArray[Any]]
Shapes = list[tuple[int, ...]]


def _arrays(records: RecordDict, name: str, shapes: Shapes) -> Arrays | None:
    """Return the float64 arrays of `name`, or None (absent, or of other shapes)."""
    record = records.array_records.get(name)
    if record is None:
        return None
    arrays = [np.asarray(a, dtype=np.float64) for a in record.to_numpy_ndarrays()]
    return arrays if [a.shape for a in arrays] == shapes else None


def _record(arrays: Arrays) -> ArrayRecord:
    # np.array, not .copy(): w + u of 0-d tensors is a numpy scalar, which ArrayRecord refuses
    return ArrayRecord([np.array(t) for t in arrays])


def finite(arrays: Arrays) -> bool:
    """Return whether every entry is finite (a NaN warm start would poison every later round)."""
    return all(bool(np.all(np.isfinite(t))) for t in arrays)


# --------------------------------------------------------------- legacy FedADMM
def fit_count(records: RecordDict) -> int:
    """Return the fits kept so far (``flwr_admm.meta``; 0 without it)."""
    meta = records.config_records.get(STATE_META)
    value = 0 if meta is None else meta.get(META_FITS, 0)
    return value if isinstance(value, int) else 0


def legacy_previous(records: RecordDict, shapes: Shapes) -> Arrays | None:
    """Return the w_i last kept under ``flwr_admm.w``, if it has `shapes`."""
    return _arrays(records, STATE_W, shapes)


def keep_legacy(records: RecordDict, w: Arrays | None, server_round: int | None) -> None:
    """Keep w_i (if given), its round (else the fit count) and one more fit."""
    fits = fit_count(records) + 1
    if w is not None:
        records.array_records[STATE_W] = _record(w)
    round_kept = fits if server_round is None else int(server_round)
    records.config_records[STATE_META] = ConfigRecord({META_ROUND: round_kept, META_FITS: fits})


def legacy_residual(records: RecordDict, shapes: Shapes) -> Arrays | None:
    """Return the uplink residual of the last compressed reply, if it has `shapes`."""
    return _arrays(records, STATE_RESIDUAL, shapes)


def keep_residual(records: RecordDict, residual: Arrays | None) -> None:
    """Keep the uplink residual (None: drop it)."""
    if residual is None:
        records.array_records.pop(STATE_RESIDUAL, None)
    else:
        records.array_records[STATE_RESIDUAL] = _record(residual)


# ---------------------------------------------------------- Message-API FedADMM
def message_previous(records: RecordDict, like: Mapping[str, NDArray[Any]]) -> Named | None:
    """Return the w_i this node last replied with, if it has the names and shapes of `like`."""
    record = records.array_records.get(MESSAGE_STATE_W)
    if record is None or list(record.keys()) != list(like):
        return None
    previous = {name: np.asarray(record[name].numpy(), dtype=np.float64) for name in like}
    if any(previous[name].shape != np.shape(like[name]) for name in like):
        return None
    return previous


def keep_message(records: RecordDict, w: Named, server_round: object) -> None:
    """Keep w_i (float64, by name) and its round (if an integer); a non-finite w_i is not kept."""
    if not finite(list(w.values())):
        return
    records.array_records[MESSAGE_STATE_W] = ArrayRecord({n: Array(t) for n, t in w.items()})
    if isinstance(server_round, int) and not isinstance(server_round, bool):
        records.config_records[MESSAGE_STATE_META] = ConfigRecord({META_ROUND: server_round})


# ------------------------------------------------------------- client-held duals
class Slot(NamedTuple):
    """The ``context.state`` records of one kept `DualState`."""

    w: str
    u: str
    meta: str
    residual: str


COMMITTED = Slot(DUALS_STATE_W, DUALS_STATE_U, DUALS_STATE_META, DUALS_STATE_RESIDUAL)
PENDING = Slot(DUALS_PENDING_W, DUALS_PENDING_U, DUALS_PENDING_META, DUALS_PENDING_RESIDUAL)


class KeptDuals(NamedTuple):
    """A node's two states: what the server's S holds (committed), and after its last reply."""

    committed: DualState | None
    pending: DualState | None


def load_states(records: RecordDict, shapes: Shapes) -> KeptDuals:
    """Return the committed and pending states kept in `records`."""
    return KeptDuals(_load(records, shapes, COMMITTED), _load(records, shapes, PENDING))


def save_states(records: RecordDict, kept: KeptDuals) -> None:
    """Keep both states in `records` (call last: after anything can fail)."""
    _save(records, kept.committed, COMMITTED)
    _save(records, kept.pending, PENDING)


def _load(records: RecordDict, shapes: Shapes, slot: Slot) -> DualState | None:
    """Return one kept state, or None (absent, incomplete, or shapes differ)."""
    meta = records.config_records.get(slot.meta)
    w, u = _arrays(records, slot.w, shapes), _arrays(records, slot.u, shapes)
    if meta is None or w is None or u is None:
        return None
    residual = _arrays(records, slot.residual, shapes)
    if residual is None and slot.residual in records.array_records:
        return None  # kept, but of other shapes
    n, k = int(meta[META_NUM_EXAMPLES]), int(meta[META_ROUND])  # type: ignore[arg-type]
    budget = meta.get(META_BUDGET)  # the linearized form's b_i
    budget = float(budget) if isinstance(budget, int | float) else None
    return DualState(w, u, n, k, residual, budget)


def _save(records: RecordDict, state: DualState | None, slot: Slot) -> None:
    """Write one state into its slot; None clears the slot."""
    arrays = records.array_records
    if state is None:
        for name in (slot.w, slot.u, slot.residual):
            arrays.pop(name, None)
        records.config_records.pop(slot.meta, None)
        return
    arrays[slot.w], arrays[slot.u] = _record(state.w), _record(state.u)
    if state.residual is None:
        arrays.pop(slot.residual, None)
    else:
        arrays[slot.residual] = _record(state.residual)
    meta: dict[str, Any] = {
        META_NUM_EXAMPLES: int(state.num_examples),
        META_ROUND: int(state.server_round),
    }
    if state.budget is not None:
        meta[META_BUDGET] = float(state.budget)
    records.config_records[slot.meta] = ConfigRecord(meta)


# --------------------------------------------------------------- SCAFFOLD, FedDyn
def load_kept(
    records: RecordDict, name: str, meta: str, shapes: Shapes
) -> tuple[Arrays, int] | None:
    """Return the arrays kept under `name` and their round (`meta`); None if absent or reshaped."""
    arrays = _arrays(records, name, shapes)
    if arrays is None:
        return None
    config = records.config_records.get(meta)
    value = 0 if config is None else config.get(META_ROUND, 0)
    return arrays, value if isinstance(value, int) else 0


def store_kept(records: RecordDict, name: str, meta: str, kept: tuple[Arrays, int] | None) -> None:
    """Keep `kept` (arrays and round) under `name` and `meta`; None drops both."""
    if kept is None:
        records.array_records.pop(name, None)
        records.config_records.pop(meta, None)
        return
    records.array_records[name] = _record(kept[0])
    records.config_records[meta] = ConfigRecord({META_ROUND: int(kept[1])})
