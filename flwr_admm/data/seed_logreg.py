"""Seed 000's synthetic non-IID logistic regression task.

theta_true ~ N(0, I_d); client i (1-based) draws X_i ~ N(0, I) of shape (m, d),
theta_i = theta_true + 0.3 (i - 1) / N * N(0, I_d), p = sigmoid(X_i theta_i) and
y = +1 if p > U(0, 1) else -1. MATLAB's rng(42) stream cannot be reproduced in numpy,
so the draws come from ``numpy.random.default_rng(seed)`` in the seed's order.
"""

from __future__ import annotations

import numpy as np
from scipy.special import expit

from flwr_admm.data.base import FederatedData

__all__ = ["FederatedData", "seed_logreg"]


def seed_logreg(
    num_clients: int = 10, n_features: int = 20, samples: int = 500, seed: int = 42
) -> FederatedData:
    """Seed 000's data: labels in {-1, +1}, equal client sizes."""
    rng = np.random.default_rng(seed)
    theta_true = rng.standard_normal(n_features)
    X, y = [], []
    for i in range(1, num_clients + 1):
        Xi = rng.standard_normal((samples, n_features))
        theta_i = theta_true + 0.3 * (i - 1) / num_clients * rng.standard_normal(n_features)
        p = expit(Xi @ theta_i)
        y.append(np.where(p > rng.random(samples), 1, -1).astype(np.int64))
        X.append(Xi)
    return FederatedData(X=X, y=y)
