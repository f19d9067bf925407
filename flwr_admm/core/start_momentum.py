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

**Steady gate.** With ``steady`` = tau the gate opens after `STEADY_ROUNDS` rounds in
a row whose steps d_k = z_{k+1} - x_k kept their direction,

    cos(d_k, d_{k-1}) >= tau,   every cached client replied, none a stock handler,

and stays open, whatever the cosine, until a restart, a round in which not every cached
client replied, or a stock reply (`pause`) shuts it (x_{k+1} = z_{k+1}); it then opens
again only after `STEADY_ROUNDS` more steady rounds. Deterministic local solves and
small local steps keep the direction while the momentum is off (cosines 0.92-1.0 on
seed-logreg, synthetic and the digits MLP with every client); minibatch noise of large
local steps and partial participation do not (below 0.5 on most rounds of the CNN task,
spikes to 0.9), where an ungated start collapses runs (docs/tuning.md). Once the
momentum runs, consecutive steps turn even on the convex tasks (the restart test keeps
it in check), so the cosine decides only the opening. ``steady`` None: the restart test
alone.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import NDArray

from flwr_admm.core.types import Arrays

__all__ = ["STEADY_ROUNDS", "StartMomentum", "check_momentum", "check_steady"]

STEADY_ROUNDS = 2  # steady rounds in a row before the momentum start is used


def check_momentum(value: object, field_name: str = "momentum") -> float:
    """Return `value` as a float in [0, 1); ValueError naming `field_name` otherwise."""
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not (math.isfinite(value) and 0 <= value < 1)
    ):
        raise ValueError(f"{field_name}: must be a number in [0, 1), got {value!r}")
    return float(value)


def check_steady(value: object, field_name: str = "steady") -> float | None:
    """Return `value` as a float in (-1, 1), or None; ValueError naming `field_name` otherwise."""
    if value is None:
        return None
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not (math.isfinite(value) and -1 < value < 1)
    ):
        raise ValueError(f"{field_name}: must be None or a number in (-1, 1), got {value!r}")
    return float(value)


def _cosine(a: Arrays, b: Arrays) -> float:
    """Return cos(a, b) over all tensors (NaN when either is 0 or not finite)."""
    dot = aa = bb = 0.0
    for s, t in zip(a, b, strict=True):
        dot += float(np.vdot(s, t))
        aa += float(np.vdot(s, s))
        bb += float(np.vdot(t, t))
    with np.errstate(divide="ignore", invalid="ignore"):
        return float(np.float64(dot) / np.sqrt(np.float64(aa) * np.float64(bb)))


@dataclass
class StartMomentum:
    """beta, z_{k-1} and the steady gate; `start` gives x_k, `step` takes the tests.

    Attributes
    ----------
    beta : float
        The momentum in [0, 1); 0 sends z_k itself.
    steady : float or None
        tau of the steady gate (module docstring); None: no gate.
    previous : list of ndarray or None
        z_{k-1}: None in a first round and in the round after a restart.
    restarts : int
        Rounds whose restart test dropped the momentum (reported, checkpointed).
    last_step : list of ndarray or None
        d_{k-1} = z_k - x_{k-1}, kept with a gate.
    streak : int
        Steady rounds in a row (with a gate); an open gate counts every round it holds.

    """

    beta: float
    steady: float | None = None
    previous: Arrays | None = None
    restarts: int = 0
    last_step: Arrays | None = None
    streak: int = 0

    @property
    def open(self) -> bool:
        """Whether the gate lets the momentum through (always without one)."""
        return self.steady is None or self.streak >= STEADY_ROUNDS

    def start(self, z: Arrays) -> Arrays:
        """Return x_k = z_k + beta (z_k - z_{k-1}) (z_k itself without z_{k-1} or the gate)."""
        if self.previous is None or self.beta == 0.0 or not self.open:
            return z
        return [t + self.beta * (t - p) for t, p in zip(z, self.previous, strict=True)]

    def step(self, z: Arrays, z_next: Arrays, every_client: bool = True) -> bool:
        """Record the round z_k -> z_{k+1}; return True when its test restarts the momentum.

        `every_client`: whether every cached client replied (the gate counts no other round).
        """
        x = self.start(z)
        d = [np.subtract(n, s, dtype=np.float64) for n, s in zip(z_next, x, strict=True)]
        along = sum(
            float(np.vdot(e, n - t)) for e, n, t in zip(d, z_next, z, strict=True)
        )  # d_k . (z_{k+1} - z_k), d_k = z_{k+1} - x_k
        restart = x is not z and not along >= 0.0  # NaN restarts too
        if self.steady is not None:
            steady = (
                every_client
                and not restart
                and (
                    self.open  # an open gate holds until one of the tests above shuts it
                    or (
                        self.last_step is not None and _cosine(d, self.last_step) >= self.steady
                    )  # NaN: not steady
                )
            )
            self.streak = self.streak + 1 if steady else 0
            self.last_step = d
        self.previous = None if restart else [np.array(t, dtype=np.float64) for t in z]
        self.restarts += int(restart)
        return restart

    def pause(self) -> None:
        """Close the gate until `STEADY_ROUNDS` more steady rounds (a stock handler replied)."""
        self.streak = 0

    def dump(self) -> tuple[dict[str, NDArray[Any]], dict[str, Any]]:
        """Return the checkpoint arrays (momentum.previous.j, momentum.step.j) and metadata."""
        arrays = {} if self.previous is None else _named("previous", self.previous)
        if self.last_step is not None:
            arrays.update(_named("step", self.last_step))
        meta = {
            "beta": self.beta,
            "restarts": self.restarts,
            "has_previous": self.previous is not None,
            "has_step": self.last_step is not None,
            "streak": self.streak,
        }
        return arrays, meta

    def load(self, arrays: dict[str, NDArray[Any]], meta: dict[str, Any], count: int) -> None:
        """Restore what `dump` wrote (`count` consensus tensors)."""
        self.restarts = int(meta.get("restarts", 0))
        self.streak = int(meta.get("streak", 0))
        self.previous = _unnamed(arrays, "previous", count) if meta.get("has_previous") else None
        self.last_step = _unnamed(arrays, "step", count) if meta.get("has_step") else None


def _named(name: str, tensors: Arrays) -> dict[str, NDArray[Any]]:
    return {f"momentum.{name}.{j}": t for j, t in enumerate(tensors)}


def _unnamed(arrays: dict[str, NDArray[Any]], name: str, count: int) -> Arrays:
    return [np.array(arrays[f"momentum.{name}.{j}"]) for j in range(count)]
