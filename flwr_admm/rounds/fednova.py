"""FedNova's server update: normalized averaging of local SGD (Wang et al., NeurIPS 2020).

Flower ships no FedNova; this is the plain local-SGD case of the paper (no momentum,
no proximal term), where client i's normalizing vector a_i is all ones and
||a_i||_1 = tau_i, its number of local steps. With x the global model sent this
round, w_i client i's returned model and p_i = n_i / sum_j n_j over the replies,

    d_i     = (x - w_i) / tau_i                 (client i's average step, lr included)
    tau_eff = sum_i p_i tau_i
    x'      = x - tau_eff * sum_i p_i d_i

When every tau_i is equal this is FedAvg's x' = sum_i p_i w_i; when they differ it
removes the objective inconsistency of FedAvg, which over-weights clients that take
more steps.
"""

from __future__ import annotations

import math

import numpy as np
from flwr.common import NDArrays

from flwr_admm.protocol import LOCAL_STEPS

__all__ = ["MAX_LOCAL_STEPS", "local_steps_problem", "normalized_average"]

# tau_eff scales the whole update: one reply claiming 1e300 steps would ruin x for
# good. No local loop of a federated round takes more steps than this.
MAX_LOCAL_STEPS = 1_000_000


def local_steps_problem(tau: object) -> str | None:
    """Why a reported ``local_steps`` value is unusable, or None (an integer in [0, 1e6])."""
    if tau is None:
        return f"missing the {LOCAL_STEPS!r} fit metric (FedNova needs tau_i)"
    if isinstance(tau, bool) or not isinstance(tau, int | float | np.integer | np.floating):
        return f"{LOCAL_STEPS} must be an integer >= 0, got {tau!r}"
    if not math.isfinite(float(tau)) or float(tau) != int(tau) or tau < 0:
        return f"{LOCAL_STEPS} must be an integer >= 0, got {tau!r}"
    if tau > MAX_LOCAL_STEPS:
        return f"{LOCAL_STEPS} must be at most {MAX_LOCAL_STEPS:,}, got {tau!r}"
    return None


def normalized_average(
    x: NDArrays, replies: list[tuple[NDArrays, int, int]]
) -> tuple[NDArrays, float]:
    """FedNova's update from x and replies (w_i, n_i, tau_i); returns (x', tau_eff).

    x' = x - tau_eff * sum_i p_i (x - w_i) / tau_i, p_i = n_i / sum_j n_j,
    tau_eff = sum_i p_i tau_i; a reply with tau_i = 0 contributes d_i = 0.
    """
    total = float(sum(n for _, n, _ in replies))
    weights = [n / total for _, n, _ in replies]
    tau_eff = float(sum(p * tau for p, (_, _, tau) in zip(weights, replies, strict=True)))
    direction = [np.zeros_like(t, dtype=np.float64) for t in x]
    for p, (w, _, tau) in zip(weights, replies, strict=True):
        if tau == 0:
            continue
        for d, xk, wk in zip(direction, x, w, strict=True):
            d += (p / tau) * (xk - np.asarray(wk, dtype=np.float64))
    return [xk - tau_eff * d for xk, d in zip(x, direction, strict=True)], tau_eff
