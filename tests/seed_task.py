"""Seed 000's task pooled on one machine: its optimum and the relative gap of a run."""

from __future__ import annotations

from functools import cache

import numpy as np
from centralized import Pooled, ridge_optimum
from flower_run import C, seed_data


@cache
def pooled() -> Pooled:
    data = seed_data()
    return Pooled.of(data.X, data.y, C)


@cache
def optimum() -> tuple[np.ndarray, float]:
    w = ridge_optimum(pooled())
    return w, pooled().objective(w)


def gaps(z_per_round: np.ndarray) -> np.ndarray:
    _, f_star = optimum()
    return np.array([(pooled().objective(z) - f_star) / abs(f_star) for z in z_per_round])


def first_round_below(gap: np.ndarray, tol: float) -> int | None:
    hits = np.nonzero(gap <= tol)[0]
    return int(hits[0]) + 1 if hits.size else None
