"""Persistence of the consensus ADMM server state: arrays plus JSON metadata.

`state_dict` returns z, the running sums S_w = sum_i n_i s_i w_i and
S_y = sum_i n_i y_i, every cached w_i, y_i (clients in natural key order) and the
metadata (rho, schedule state, n_i, s_i, sum_i n_i s_i, sum_i n_i, shapes) that
restore `ConsensusADMM` bit for bit; `load_state_dict` restores them. The sums are
stored, not recomputed, so a resumed run sums in the same order as an unbroken one.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from numpy.typing import NDArray

from flwr_admm.core.schedules import ScheduleState
from flwr_admm.core.types import Arrays, ClientRecord, check_rho, natural_key


class ConsensusPersistence:
    """`state_dict` / `load_state_dict` of `ConsensusADMM` (mixed into it)."""

    z: Arrays
    rho: float
    records: dict[str, ClientRecord]
    schedule_state: ScheduleState
    _sum_nsw: Arrays
    _sum_ny: Arrays
    _sum_ns: float
    _sum_n: int

    def state_dict(self) -> tuple[dict[str, NDArray[np.float64]], dict[str, Any]]:
        """Arrays and JSON metadata that restore this state bit for bit."""
        keys = sorted(self.records, key=natural_key)
        arrays: dict[str, NDArray[np.float64]] = {}
        for j in range(len(self.z)):
            arrays[f"z.{j}"] = self.z[j]
            arrays[f"sum_nsw.{j}"] = self._sum_nsw[j]
            arrays[f"sum_ny.{j}"] = self._sum_ny[j]
            for i, key in enumerate(keys):
                arrays[f"w.{i}.{j}"] = self.records[key].w[j]
                arrays[f"y.{i}.{j}"] = self.records[key].y[j]
        meta = {
            "rho": self.rho,
            "schedule_state": self.schedule_state,
            "clients": [
                {
                    "key": k,
                    "num_examples": self.records[k].num_examples,
                    "scale": self.records[k].scale,
                }
                for k in keys
            ],
            "sum_ns": self._sum_ns,
            "sum_n": self._sum_n,
            "shapes": [list(t.shape) for t in self.z],
        }
        return arrays, meta

    def load_state_dict(self, arrays: dict[str, NDArray[np.float64]], meta: dict[str, Any]) -> None:
        """Restore what `state_dict` wrote; the model shapes must match."""
        shapes = [tuple(s) for s in meta["shapes"]]
        if shapes != [t.shape for t in self.z]:
            raise ValueError(
                f"checkpoint: model shapes {shapes} differ from the current model's "
                f"{[t.shape for t in self.z]}"
            )
        count = len(self.z)

        def take(prefix: str) -> Arrays:
            return [np.array(arrays[f"{prefix}.{j}"], dtype=np.float64) for j in range(count)]

        self.z, self._sum_nsw, self._sum_ny = take("z"), take("sum_nsw"), take("sum_ny")
        self.records = {
            c["key"]: ClientRecord(
                take(f"w.{i}"), take(f"y.{i}"), int(c["num_examples"]), float(c["scale"])
            )
            for i, c in enumerate(meta["clients"])
        }
        self.rho = check_rho(float(meta["rho"]), "checkpoint rho")
        self.schedule_state = meta["schedule_state"]
        self._sum_ns, self._sum_n = float(meta["sum_ns"]), int(meta["sum_n"])
