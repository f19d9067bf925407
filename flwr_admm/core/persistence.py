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

from flwr_admm.core.schedules import ScheduleState
from flwr_admm.core.sums import RunningSums
from flwr_admm.core.types import Arrays, ClientRecord, check_rho, natural_key

StateArrays = dict[str, NDArray[np.float64]]
# state_dtype="float32" is deleted; named in the error for a checkpoint written with it
DELETED_STATE_DTYPE = "float32 state ran slower than float64 in the server-cost benchmark"
# The accelerations, deleted because our benchmarks showed them losing; named in the
# error for a checkpoint written with one.
DELETED = {
    "anderson": "Anderson acceleration lost to the defaults in 3 of 4 benchmark settings",
    "goldstein": "its restart to the previous point stalls under partial participation",
    "nesterov": (
        "fast ADMM lost to the linearized form's convex recipe (form=LINEARIZED_CONVEX) "
        "on every convex benchmark task and diverged on the CNN task"
    ),
}


def deleted_message(acceleration: str, where: str) -> str:
    """Return the error for `where` (a checkpoint) written with a DELETED `acceleration`."""
    return (
        f"{where}: written with acceleration={acceleration!r}, which this version of "
        f"flwr-admm deleted ({DELETED[acceleration]}); resume it with the version that "
        "wrote it, or move it away to start fresh"
    )


def check_saved_acceleration(meta: dict[str, Any]) -> None:
    """Raise ValueError if `ConsensusADMM.state_dict` metadata holds a DELETED acceleration.

    The versions before wrote Anderson's memory under "anderson" and fast ADMM's
    momentum under "acceleration" ("to_previous" True for "goldstein").
    """
    if "anderson" in meta:
        raise ValueError(deleted_message("anderson", "checkpoint"))
    fast = meta.get("acceleration")
    if isinstance(fast, dict):
        raise ValueError(
            deleted_message("goldstein" if fast.get("to_previous") else "nesterov", "checkpoint")
        )


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


def state_dtype_message(state_dtype: object, where: str) -> str:
    """Return the error for `where` (a checkpoint) written with another ``state_dtype``."""
    return (
        f"{where}: written with state_dtype={state_dtype!r}, which this version of "
        f"flwr-admm deleted ({DELETED_STATE_DTYPE}; float64 is the only state dtype); "
        "resume it with the version that wrote it, or move it away to start fresh"
    )


def load_state(
    arrays: StateArrays, meta: dict[str, Any], shapes: list[tuple[int, ...]]
) -> SavedState:
    """Return the state `dump_state` wrote, in float64; ValueError unless `shapes` match.

    A state written with a deleted option (an acceleration, float32 w_i / y_i) is
    refused by its name.
    """
    check_saved_acceleration(meta)
    for name, array in arrays.items():
        if name.startswith(("w.", "y.")) and array.dtype != np.float64:
            raise ValueError(state_dtype_message(str(array.dtype), "checkpoint"))
    saved = [tuple(s) for s in meta["shapes"]]
    if saved != shapes:
        raise ValueError(
            f"checkpoint: model shapes {saved} differ from the current model's {shapes}"
        )

    def take(prefix: str) -> Arrays:
        return [np.array(arrays[f"{prefix}.{j}"], dtype=np.float64) for j in range(len(shapes))]

    z, sum_nsw, sum_ny = take("z"), take("sum_nsw"), take("sum_ny")
    records = {
        c["key"]: ClientRecord(
            take(f"w.{i}"),
            take(f"y.{i}"),
            int(c["num_examples"]),
            float(c["scale"]),
        )
        for i, c in enumerate(meta["clients"])
    }
    rho = check_rho(float(meta["rho"]), "checkpoint rho")
    sums = RunningSums(sum_nsw, sum_ny, float(meta["sum_ns"]), int(meta["sum_n"]))
    sums.moving = {k for k, r in records.items() if any(np.any(y) for y in r.y)}
    return SavedState(z, rho, meta["schedule_state"], records, sums)
