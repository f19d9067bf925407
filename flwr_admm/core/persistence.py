"""Checkpoints of the consensus ADMM server state: named arrays plus JSON metadata.

Arrays: z, the running sums S_w and S_y, every cached w_i, y_i (clients in natural key
order). Metadata: rho, the schedule state, n_i, s_i, S_s, N and the model shapes. The
sums are stored, not recomputed, so a resumed run sums in the same order as an
unbroken one.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np
from numpy.typing import NDArray

from flwr_admm.core.acceleration import check_saved_acceleration
from flwr_admm.core.schedules import ScheduleState
from flwr_admm.core.sums import RunningSums
from flwr_admm.core.types import Arrays, ClientRecord, check_rho, natural_key

StateArrays = dict[str, NDArray[np.float64]]


class SavedState(NamedTuple):
    """What a checkpoint restores: z, rho, schedule state, records and running sums."""

    z: Arrays
    rho: float
    schedule_state: ScheduleState
    records: dict[str, ClientRecord]
    sums: RunningSums


def dump_state(state: SavedState) -> tuple[StateArrays, dict[str, Any]]:
    """Return the arrays (the live ones, not copies) and JSON metadata of `state`."""
    keys = sorted(state.records, key=natural_key)
    arrays: StateArrays = {}
    for j in range(len(state.z)):
        arrays[f"z.{j}"] = state.z[j]
        arrays[f"sum_nsw.{j}"] = state.sums.nsw[j]
        arrays[f"sum_ny.{j}"] = state.sums.ny[j]
        for i, key in enumerate(keys):
            arrays[f"w.{i}.{j}"] = state.records[key].w[j]
            arrays[f"y.{i}.{j}"] = state.records[key].y[j]
    meta = {
        "rho": state.rho,
        "schedule_state": state.schedule_state,
        "clients": [
            {
                "key": k,
                "num_examples": state.records[k].num_examples,
                "scale": state.records[k].scale,
            }
            for k in keys
        ],
        "sum_ns": state.sums.ns,
        "sum_n": state.sums.n,
        "shapes": [list(t.shape) for t in state.z],
    }
    return arrays, meta


def load_state(
    arrays: StateArrays,
    meta: dict[str, Any],
    shapes: list[tuple[int, ...]],
    state_dtype: str = "float64",
) -> SavedState:
    """Return the state `dump_state` wrote; ValueError unless its model `shapes` match.

    z and the sums come back as float64, w_i and y_i as `state_dtype`. A state written
    with a deleted acceleration option is refused by its name.
    """
    check_saved_acceleration(meta)
    saved = [tuple(s) for s in meta["shapes"]]
    if saved != shapes:
        raise ValueError(
            f"checkpoint: model shapes {saved} differ from the current model's {shapes}"
        )

    def take(prefix: str, dtype: str = "float64") -> Arrays:
        return [np.array(arrays[f"{prefix}.{j}"], dtype=dtype) for j in range(len(shapes))]

    z, sum_nsw, sum_ny = take("z"), take("sum_nsw"), take("sum_ny")
    records = {
        c["key"]: ClientRecord(
            take(f"w.{i}", state_dtype),
            take(f"y.{i}", state_dtype),
            int(c["num_examples"]),
            float(c["scale"]),
        )
        for i, c in enumerate(meta["clients"])
    }
    rho = check_rho(float(meta["rho"]), "checkpoint rho")
    sums = RunningSums(sum_nsw, sum_ny, float(meta["sum_ns"]), int(meta["sum_n"]))
    return SavedState(z, rho, meta["schedule_state"], records, sums)
