"""The adaptive dual step: gamma grows while the replies keep pulling their duals one way.

The dual step y_i += gamma rho_i (w_i - z') has the same fixed point for every gamma in
(0, 1]. The textbook gamma = 1 is the fastest with deterministic local solves and blows
up a CNN trained by momentum SGD on minibatches; a damped gamma = 0.2 survives the CNN
and costs up to 4.6x the rounds on seed-logreg (docs/options.md). Which one a run
needs shows in the alignment of each reply's residual with its own dual,

    c_k = sum_i p_i rho_i <w_i - z', y_i> / sqrt(sum_i p_i rho_i^2 ||w_i - z'||^2
                                                 sum_i p_i ||y_i||^2)

over the round's replies, y_i before the step. A damped step on a deterministic solve
leaves most of each correction for the next round, so the next residual points along
the dual again (c_k of 0.95-1 on seed-logreg and digits at gamma 0.2); with minibatch
noise the residuals are mostly noise (c_k of 0.3-0.6 on the CNN task). The rule

    gamma_{k+1} = clip(gamma_k exp(rate (c_k - threshold)), floor, 1)

moves gamma toward 1 on the first kind of run and keeps it at ``floor`` on the second.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from flwr_admm.core.types import Arrays, ClientRecord, Reply, check_dual_step

__all__ = [
    "AdaptiveDualStep",
    "DualStep",
    "alignment",
    "check_dual_step_spec",
    "first_gamma",
    "saved_gamma",
]


@dataclass(frozen=True)
class AdaptiveDualStep:
    """The adaptive dual step rule (module docstring), for ``dual_step=``.

    Parameters
    ----------
    floor : float
        The first and the smallest gamma, in (0, 1].
    threshold : float
        The alignment c_k in (-1, 1) above which gamma grows and below which it shrinks.
    rate : float
        How fast: gamma changes by the factor exp(rate (c_k - threshold)) a round, rate > 0.

    """

    floor: float = 0.2
    threshold: float = 0.7
    rate: float = 1.0

    def __post_init__(self) -> None:
        object.__setattr__(self, "floor", check_dual_step(self.floor, "floor"))
        if isinstance(self.threshold, bool) or not (
            isinstance(self.threshold, int | float) and -1.0 < self.threshold < 1.0
        ):
            raise ValueError(f"threshold: must be a number in (-1, 1), got {self.threshold!r}")
        if isinstance(self.rate, bool) or not (
            isinstance(self.rate, int | float) and math.isfinite(self.rate) and self.rate > 0
        ):
            raise ValueError(f"rate: must be a finite number > 0, got {self.rate!r}")
        object.__setattr__(self, "threshold", float(self.threshold))
        object.__setattr__(self, "rate", float(self.rate))

    def next(self, gamma: float, c: float | None) -> float:
        """Return gamma_{k+1} from gamma_k and the round's alignment (None: unchanged)."""
        if c is None:
            return gamma
        return min(1.0, max(self.floor, gamma * math.exp(self.rate * (c - self.threshold))))

    def describe(self) -> dict[str, Any]:
        """Return the rule as JSON (for settings fingerprints)."""
        return {"adaptive": {"floor": self.floor, "threshold": self.threshold, "rate": self.rate}}


DualStep = float | AdaptiveDualStep  # what ``dual_step`` takes


def check_dual_step_spec(value: object) -> DualStep:
    """Return a dual step: a number in (0, 1] as a float, or an `AdaptiveDualStep`.

    Raises
    ------
    ValueError
        Naming ``dual_step`` and its allowed values.

    """
    if isinstance(value, AdaptiveDualStep):
        return value
    if isinstance(value, bool) or not (isinstance(value, int | float) and 0 < value <= 1):
        raise ValueError(
            f"dual_step: must be a number in (0, 1] or an AdaptiveDualStep(...), got {value!r}"
        )
    return float(value)


def first_gamma(step: DualStep) -> float:
    """Return gamma of the first round: the number itself, or the rule's floor."""
    return step.floor if isinstance(step, AdaptiveDualStep) else step


def saved_gamma(meta: dict[str, Any]) -> float:
    """Return the gamma a checkpoint's metadata holds; ValueError naming ``gamma`` if none."""
    gamma = meta.get("gamma")
    if isinstance(gamma, bool) or not isinstance(gamma, int | float):
        raise ValueError(f"gamma: the checkpoint holds no dual step, got {gamma!r}")
    return check_dual_step(gamma, "gamma")


def alignment(
    replies: Sequence[Reply], records: dict[str, ClientRecord], z_new: Arrays, rho: float
) -> float | None:
    """Return c_k over `replies` in their order (module docstring); None if undefined.

    Call it after the z-step and before the dual step: records hold the replies' w_i
    and the duals they were sent with. rho_i = rho s_i. None when rho = 0, or when
    every residual or every dual is zero (the first round: y_i = 0).
    """
    if rho == 0.0:
        return None
    total = float(sum(records[reply.key].num_examples for reply in replies))
    along = residual_sq = dual_sq = 0.0
    for reply in replies:
        record = records[reply.key]
        p, rho_i = record.num_examples / total, rho * record.scale
        for w, y, z in zip(record.w, record.y, z_new, strict=True):
            d = (w - z).reshape(-1)
            flat = y.reshape(-1)
            along += p * rho_i * float(np.dot(d, flat))
            residual_sq += p * rho_i * rho_i * float(np.dot(d, d))
            dual_sq += p * float(np.dot(flat, flat))
    if residual_sq == 0.0 or dual_sq == 0.0:
        return None
    return along / math.sqrt(residual_sq * dual_sq)
