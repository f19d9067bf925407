"""Server regularizers g(z) and their proximal operators for the z-step.

z = prox_{g / rho}(a) = argmin_z g(z) + rho/2 ||z - a||^2.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from typing import Any

import numpy as np
from numpy.typing import NDArray

Arrays = list[NDArray[np.float64]]


class Regularizer(ABC):
    """A convex, separable server regularizer g with a closed-form prox."""

    def __init__(self, strength: float) -> None:
        if not (isinstance(strength, int | float) and math.isfinite(strength) and strength >= 0):
            raise ValueError(f"strength: must be a finite number >= 0, got {strength!r}")
        self.strength = float(strength)

    @abstractmethod
    def value(self, z: Arrays) -> float:
        """g(z)."""

    @abstractmethod
    def prox_(self, a: Arrays, rho: float) -> Arrays:
        """Overwrite `a` with prox_{g/rho}(a) and return it (in place, no copies)."""

    def describe(self) -> dict[str, Any]:
        """Name and strength, for config fingerprints."""
        return {"name": type(self).__name__, "strength": self.strength}

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.strength})"


class L1(Regularizer):
    """g(z) = strength * ||z||_1; prox = soft-threshold at strength / rho."""

    def value(self, z: Arrays) -> float:
        """Strength * sum |z|."""
        return self.strength * float(sum(np.abs(t).sum() for t in z))

    def prox_(self, a: Arrays, rho: float) -> Arrays:
        """sign(a) * max(|a| - strength / rho, 0)."""
        tau = self.strength / rho
        for t in a:
            magnitude = np.abs(t)
            np.subtract(magnitude, tau, out=magnitude)
            np.maximum(magnitude, 0.0, out=magnitude)
            np.copysign(magnitude, t, out=t)
        return a


class L2(Regularizer):
    """g(z) = strength/2 ||z||^2; prox = a * rho / (rho + strength)."""

    def value(self, z: Arrays) -> float:
        """strength/2 * sum z^2."""
        return 0.5 * self.strength * float(sum(np.vdot(t, t) for t in z))

    def prox_(self, a: Arrays, rho: float) -> Arrays:
        """Shrink towards zero by rho / (rho + strength)."""
        shrink = rho / (rho + self.strength)
        for t in a:
            t *= shrink
        return a
