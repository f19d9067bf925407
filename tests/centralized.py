"""Centralized reference solutions on pooled data (scipy), independent of flwr_admm.

Pooled objective of the seed task (equal client sizes, so the seed's mean over
clients is the mean over all samples):

    F(w) = 1/n sum_j log(1 + exp(-y_j x_j^T w)) + C/2 ||w||^2

Solutions are computed with scipy's L-BFGS(-B) at tight tolerances and then polished
with a few Newton steps (on the support, for L1), so they are accurate to machine
precision; callers check optimality (gradient / KKT) rather than trusting them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray
from scipy.optimize import minimize
from scipy.special import expit

Vector = NDArray[np.float64]


@dataclass(frozen=True)
class Pooled:
    """All clients' data stacked, labels in {-1, +1}."""

    X: NDArray[np.float64]
    y: Vector
    C: float

    @classmethod
    def of(
        cls, X: Sequence[NDArray[np.float64]], y: Sequence[NDArray[np.generic]], C: float
    ) -> Pooled:
        """Stack per-client data."""
        labels = np.concatenate([np.where(np.asarray(v) > 0, 1.0, -1.0) for v in y])
        return cls(np.vstack(X), labels, C)

    def objective(self, w: Vector) -> float:
        """F(w), overflow-free."""
        margin = self.y * (self.X @ w)
        return float(np.mean(np.logaddexp(0.0, -margin)) + 0.5 * self.C * (w @ w))

    def gradient(self, w: Vector) -> Vector:
        """grad F(w) = X^T (sigma(Xw) - t) / n + C w, t = (y + 1) / 2."""
        residual = expit(self.X @ w) - (self.y + 1.0) / 2.0
        return self.X.T @ residual / self.X.shape[0] + self.C * w

    def hessian(self, w: Vector) -> NDArray[np.float64]:
        """X^T diag(p (1 - p)) X / n + C I."""
        p = expit(self.X @ w)
        return (self.X.T * (p * (1.0 - p))) @ self.X / self.X.shape[0] + self.C * np.eye(w.size)


def ridge_optimum(pooled: Pooled) -> Vector:
    """argmin F by L-BFGS (ftol 1e-15, gtol 1e-12) polished by Newton steps."""
    d = pooled.X.shape[1]
    result = minimize(
        pooled.objective,
        np.zeros(d),
        jac=pooled.gradient,
        method="L-BFGS-B",
        options={"ftol": 1e-15, "gtol": 1e-12, "maxiter": 2000},
    )
    w = result.x
    for _ in range(4):
        w = w - np.linalg.solve(pooled.hessian(w), pooled.gradient(w))
    return w


def l1_optimum(pooled: Pooled, strength: float) -> Vector:
    """argmin F(w) + strength ||w||_1.

    L-BFGS-B on the split w = w_plus - w_minus (both >= 0) finds the support and the
    signs; Newton steps on the support (signs fixed) then polish the nonzeros.
    """
    d = pooled.X.shape[1]

    def split_objective(v: Vector) -> float:
        return pooled.objective(v[:d] - v[d:]) + strength * float(v.sum())

    def split_gradient(v: Vector) -> Vector:
        g = pooled.gradient(v[:d] - v[d:])
        return np.concatenate([g + strength, -g + strength])

    result = minimize(
        split_objective,
        np.zeros(2 * d),
        jac=split_gradient,
        method="L-BFGS-B",
        bounds=[(0.0, None)] * (2 * d),
        options={"ftol": 1e-16, "gtol": 1e-13, "maxiter": 5000},
    )
    w = result.x[:d] - result.x[d:]
    support = np.abs(w) > 1e-8
    signs = np.sign(w[support])
    w = np.where(support, w, 0.0)
    for _ in range(4):
        g = pooled.gradient(w)[support] + strength * signs
        H = pooled.hessian(w)[np.ix_(support, support)]
        w[support] -= np.linalg.solve(H, g)
    return w
