"""The linearized form's momentum start with restart: where the clients start each round.

With momentum beta the clients of round k start at the extrapolated point

    x_k = z_k + beta (z_k - z_{k-1})                (x_k = z_k in a first round)

instead of z_k, and the server restarts the momentum (x_{k+1} = z_{k+1}) after a
round whose step went against it,

    (z_{k+1} - x_k) . (z_{k+1} - z_k) < 0,

O'Donoghue and Candes' gradient restart with x_k in the role of the extrapolated
point: z_{k+1} - x_k is the round's step from where the clients started. The z-step
and the dual step are the linearized form's (`flwr_admm.core.linearized`); only the
start moves, so the fixed point is the same (at consensus z_k = z_{k-1}, x_k = z_k).
The state is z_{k-1} (None after a restart or before the second round).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import NDArray

from flwr_admm.core.types import Arrays

__all__ = ["StartMomentum", "check_momentum"]


def check_momentum(value: object, field_name: str = "momentum") -> float:
    """Return `value` as a float in [0, 1); ValueError naming `field_name` otherwise."""
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not (math.isfinite(value) and 0 <= value < 1)
    ):
        raise ValueError(f"{field_name}: must be a number in [0, 1), got {value!r}")
    return float(value)


@dataclass
class StartMomentum:
    """beta and z_{k-1}; `start` gives x_k, `step` takes the restart test.

    Attributes
    ----------
    beta : float
        The momentum in [0, 1); 0 sends z_k itself.
    previous : list of ndarray or None
        z_{k-1}: None in a first round and in the round after a restart.
    restarts : int
        Rounds whose restart test dropped the momentum (reported, checkpointed).

    """

    beta: float
    previous: Arrays | None = None
    restarts: int = 0

    def start(self, z: Arrays) -> Arrays:
        """Return x_k = z_k + beta (z_k - z_{k-1}) (z_k itself without z_{k-1})."""
        if self.previous is None or self.beta == 0.0:
            return z
        return [t + self.beta * (t - p) for t, p in zip(z, self.previous, strict=True)]

    def step(self, z: Arrays, z_next: Arrays) -> bool:
        """Record the round z_k -> z_{k+1}; return True when its test restarts the momentum."""
        x = self.start(z)
        along = sum(
            float(np.vdot(n - s, n - t)) for n, s, t in zip(z_next, x, z, strict=True)
        )  # (z_{k+1} - x_k) . (z_{k+1} - z_k)
        restart = x is not z and not along >= 0.0  # NaN restarts too
        self.previous = None if restart else [np.array(t, dtype=np.float64) for t in z]
        self.restarts += int(restart)
        return restart

    def dump(self) -> tuple[dict[str, NDArray[Any]], dict[str, Any]]:
        """Return the checkpoint arrays (momentum.previous.j) and metadata."""
        arrays = (
            {}
            if self.previous is None
            else {f"momentum.previous.{j}": t for j, t in enumerate(self.previous)}
        )
        return arrays, {"beta": self.beta, "restarts": self.restarts, "has_previous": bool(arrays)}

    def load(self, arrays: dict[str, NDArray[Any]], meta: dict[str, Any], count: int) -> None:
        """Restore what `dump` wrote (`count` consensus tensors)."""
        self.restarts = int(meta.get("restarts", 0))
        if not meta.get("has_previous"):
            self.previous = None
            return
        self.previous = [np.array(arrays[f"momentum.previous.{j}"]) for j in range(count)]
