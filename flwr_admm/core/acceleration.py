"""Fast ADMM with restart (Goldstein, O'Donoghue, Setzer & Baraniuk 2014, Alg. 8) for the server.

After round k produced z_k and the replying duals y_i,k from the extrapolated z^_k,
y^_i,k, the combined residual (p_i over the replies)

    c_k = rho_bar ( sum_i p_i ||w_i - z_k||^2 + ||z_k - z^_k||^2 )

decides the next point (a = 1 at the start):

    c_k < eta c_{k-1}:  a'   = (1 + sqrt(1 + 4 a^2)) / 2,   g = (a - 1) / a'
                        z^  = z_k + g (z_k - z_{k-1})
                        y^_i = y_i,k + g (y_i,k - y_i,prev)      (replying clients)
    otherwise (restart from the current point):
                        a' = 1,  z^ = z_k,  y^_i = y_i,k  (c_k kept)

Alg. 8 restarts to the previous point z_{k-1}, which throws the round's client work
away and stalls z under partial participation; restarting from the current point keeps
every round's plain ADMM step. y_i,prev is client i's unextrapolated dual after its
previous reply (0 before), so a dual moves only in the rounds its client replies.
rho = 0 turns acceleration off; a change of rho or a non-finite c_k restarts it.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from numpy.typing import NDArray

from flwr_admm.core.kernels import BLOCK, axpy, blocks
from flwr_admm.core.types import Arrays, ClientRecord

ACCELERATIONS = (None, "nesterov")
DEFAULT_ETA = 0.999
# Options deleted because our benchmarks showed them losing; named in the errors for
# them and for a checkpoint written with one.
DELETED = {
    "anderson": "Anderson acceleration lost to the defaults in 3 of 4 benchmark settings",
    "goldstein": "its restart to the previous point stalls under partial participation",
}


def check_acceleration(acceleration: object, eta: object) -> None:
    """Raise ValueError unless `acceleration` is in ACCELERATIONS and 0 < eta <= 1."""
    if acceleration not in ACCELERATIONS:
        deleted = DELETED.get(acceleration) if isinstance(acceleration, str) else None
        note = f" ({acceleration!r} was deleted: {deleted})" if deleted else ""
        raise ValueError(
            f"acceleration: must be one of {list(ACCELERATIONS)}, got {acceleration!r}{note}"
        )
    if isinstance(eta, bool) or not (isinstance(eta, int | float) and 0 < eta <= 1):
        raise ValueError(f"restart_eta: must be a number in (0, 1], got {eta!r}")


def deleted_message(acceleration: str, where: str) -> str:
    """Return the error for `where` (a checkpoint) written with a DELETED `acceleration`."""
    return (
        f"{where}: written with acceleration={acceleration!r}, which this version of "
        f"flwr-admm deleted ({DELETED[acceleration]}); resume it with the version that "
        "wrote it, or move it away to start fresh"
    )


def check_saved_acceleration(meta: dict[str, Any]) -> None:
    """Raise ValueError if `ConsensusADMM.state_dict` metadata comes from a DELETED option."""
    fast = meta.get("acceleration")
    if "anderson" in meta:
        raise ValueError(deleted_message("anderson", "checkpoint"))
    if isinstance(fast, dict) and fast.get("to_previous"):
        raise ValueError(deleted_message("goldstein", "checkpoint"))


@dataclass
class FastADMM:
    """Momentum state of fast ADMM with restart: a_k, c_{k-1}, z_{k-1}, each y_i,prev."""

    eta: float = DEFAULT_ETA
    a: float = 1.0
    c_prev: float | None = None
    z_prev: Arrays | None = None
    y_prev: dict[str, Arrays] = field(default_factory=dict)
    restarts: int = 0

    def step(
        self,
        z: Arrays,
        z_hat: Arrays,
        replied: Sequence[tuple[str, ClientRecord]],
        sum_ny: Arrays,
        *,
        c: float,
        rho_changed: bool,
    ) -> Arrays:
        """Return z^_{k+1}; move the replying duals to y^_i and S_y = sum n_i y_i with them.

        `z` is z_k (unextrapolated), `z_hat` the z^_k it was computed from (only read
        on the first round, as z_{k-1} = z^_0); `replied` the replying clients' records
        in key order, whose y hold y_i,k.
        """
        if self.z_prev is None:
            self.z_prev = [t.copy() for t in z_hat]
        restart = self.c_prev is not None and not c < self.eta * self.c_prev
        if rho_changed or not math.isfinite(c):
            self.a, self.c_prev = 1.0, None
            self._shift(z, replied, sum_ny, 0.0)
            return [t.copy() for t in z]
        if restart:  # from the current point: z^ = z_k, y^_i = y_i,k
            self.a, self.c_prev = 1.0, c
            self.restarts += 1
            self._shift(z, replied, sum_ny, 0.0)
            return [t.copy() for t in z]
        a_next = (1.0 + math.sqrt(1.0 + 4.0 * self.a * self.a)) / 2.0
        gamma = (self.a - 1.0) / a_next
        self.a, self.c_prev = a_next, c
        z_hat_next = [t + gamma * (t - p) for t, p in zip(z, self.z_prev, strict=True)]
        self._shift(z, replied, sum_ny, gamma)
        return z_hat_next

    def _shift(
        self,
        z: Arrays,
        replied: Sequence[tuple[str, ClientRecord]],
        sum_ny: Arrays,
        gamma: float,
    ) -> None:
        """Set z_{k-1} = z_k, y_i,prev = y_i,k and y_i += gamma (y_i,k - y_i,prev) (S_y too).

        One pass per reply, in place (y_i,prev's buffer takes y_i,k), blocks outer and
        replies inner.
        """
        if self.z_prev is not None:
            for prev_t, t in zip(self.z_prev, z, strict=True):
                prev_t[...] = t
        else:
            self.z_prev = [t.copy() for t in z]
        scratch = np.empty(min(BLOCK, max((t.size for t in z), default=1)))
        for key, record in replied:  # first reply: y_i,prev = 0
            if key not in self.y_prev:
                self.y_prev[key] = [np.zeros_like(y) for y in record.y]
        pairs = [(record, self.y_prev[key]) for key, record in replied]
        # Blocks outer, replies inner (each S_y block stays in cache); every element
        # takes the same steps in the same reply order as replies outer: same bits.
        for j, acc in enumerate(sum_ny):
            acc_flat = acc.reshape(-1)
            for block in blocks(acc_flat.size):
                step = scratch[: block.stop - block.start]
                for record, prev in pairs:
                    y_block = record.y[j].reshape(-1)[block]
                    p_block = prev[j].reshape(-1)[block]
                    np.subtract(y_block, p_block, out=step)  # y_i,k - y_i,prev
                    p_block[...] = y_block  # y_i,prev <- y_i,k
                    if gamma != 0.0:
                        step *= gamma
                        y_block += step  # y^_i = y_i,k + gamma (y_i,k - y_i,prev)
                        axpy(float(record.num_examples), step, acc_flat[block])  # S_y += ...

    def forget(self, keys: Collection[str]) -> None:
        """Drop the y_i,prev of evicted clients."""
        for key in keys:
            self.y_prev.pop(key, None)

    # ------------------------------------------------------------- checkpoint
    def dump(self, keys: Sequence[str]) -> tuple[dict[str, NDArray[np.float64]], dict[str, Any]]:
        """Return arrays (z_prev.j, y_prev.i.j for client i of `keys`) and JSON metadata."""
        arrays: dict[str, NDArray[np.float64]] = {}
        for j, t in enumerate(self.z_prev or []):
            arrays[f"accel_z_prev.{j}"] = t
        held = [k for k in keys if k in self.y_prev]
        for i, key in enumerate(held):
            for j, t in enumerate(self.y_prev[key]):
                arrays[f"accel_y_prev.{i}.{j}"] = t
        meta = {
            "a": self.a,
            "c_prev": self.c_prev,
            "restarts": self.restarts,
            "has_z_prev": self.z_prev is not None,
            "y_prev_keys": held,
        }
        return arrays, meta

    @classmethod
    def load(
        cls,
        arrays: dict[str, NDArray[Any]],
        meta: dict[str, Any],
        eta: float,
        count: int,
    ) -> FastADMM:
        """Return the state `dump` wrote (`count` arrays per model)."""

        def take(prefix: str) -> Arrays:
            return [np.array(arrays[f"{prefix}.{j}"], dtype=np.float64) for j in range(count)]

        state = cls(eta=eta, a=float(meta["a"]), restarts=int(meta["restarts"]))
        state.c_prev = None if meta["c_prev"] is None else float(meta["c_prev"])
        state.z_prev = take("accel_z_prev") if meta["has_z_prev"] else None
        state.y_prev = {k: take(f"accel_y_prev.{i}") for i, k in enumerate(meta["y_prev_keys"])}
        return state
