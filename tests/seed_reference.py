"""Independent numpy port of seed 000's MATLAB loops (sections 3.2 and 3.3).

Written from the seed's formulas, on purpose without any flwr_admm code, so the
Flower adapters can be checked against it. Matrices are laid out as in MATLAB:
w, u have shape (d, N), column i belongs to client i.

Approximate ADMM (3.2), one round k:

    for i: repeat L times: w_i <- w_i - eta (grad f_i(w_i) + rho (w_i - z + u_i))
    z <- mean_i (w_i + u_i)
    u_i <- u_i + (w_i - z)

f_i(w) = mean log-loss on client i + C/2 ||w||^2 with labels in {-1, +1}; the
gradient is X^T (p - (y + 1) / 2) / m + C w with p = 1 / (1 + exp(-X w)).

Extensions, all optional and off by default (= the literal seed):

- ``local_init="center"``: every local loop starts at z - u_i instead of the
  client's own previous w_i. With "previous" a client starts at z - u_i the first
  time it takes part (for full participation that is the seed's w = 0 start).
- ``prox="exact"``: the penalized step solved in closed form,
  w <- (w - eta grad f_i(w) + eta rho (z - u_i)) / (1 + eta rho).
- ``participation``: the clients that take part in each round. The z-step averages
  w_i + u_i over every client seen so far (stale values for the absent ones); only
  participants update their dual. Full participation is the seed.

FedAvg control (3.3): w_i <- w_i - eta (grad f_i(w_i) + lambda (w_i - z)),
z <- mean_i w_i. The seed warm-starts each w_i from its own previous value
(``start="previous"``); Flower's FedAvg / FedProx clients start from the received z
(``start="z"``). lambda = 0 is plain FedAvg, lambda = mu is FedProx.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
from numpy.typing import NDArray

Matrix = NDArray[np.float64]


def labels_pm1(y: NDArray[np.generic]) -> Matrix:
    """Labels as floats in {-1, +1} (accepts {0, 1} too)."""
    y = np.asarray(y)
    return np.where(y > 0, 1.0, -1.0)


def logistic_grad(w: Matrix, X: Matrix, y: Matrix, C: float) -> Matrix:
    """The seed's ``logistic_grad``: X' (p - (y + 1) / 2) / m + C w."""
    p = 1.0 / (1.0 + np.exp(-(X @ w)))
    return X.T @ (p - (y + 1.0) / 2.0) / X.shape[0] + C * w


def logistic_loss(w: Matrix, X: Matrix, y: Matrix, C: float) -> float:
    """The seed's ``logistic_loss`` in an overflow-free form.

    -mean(log p(y_j)) + C/2 ||w||^2 with -log p(y_j) = log(1 + exp(-y_j x_j^T w)).
    """
    margin = y * (X @ w)
    return float(np.mean(np.logaddexp(0.0, -margin)) + 0.5 * C * (w @ w))


def pooled_objective(w: Matrix, X: Sequence[Matrix], y: Sequence[Matrix], C: float) -> float:
    """F(w) = sum_i p_i f_i(w), p_i = m_i / sum_j m_j (the seed's mean over clients)."""
    sizes = np.array([Xi.shape[0] for Xi in X], dtype=np.float64)
    losses = np.array([logistic_loss(w, Xi, yi, C) for Xi, yi in zip(X, y, strict=True)])
    return float(sizes @ losses / sizes.sum())


@dataclass
class ADMMTrace:
    """Iterates after every round: z[k] (d,), w[k] and u[k] (d, N), residuals."""

    z: list[Matrix] = field(default_factory=list)
    w: list[Matrix] = field(default_factory=list)
    u: list[Matrix] = field(default_factory=list)
    primal: list[float] = field(default_factory=list)
    dual: list[float] = field(default_factory=list)
    eps_primal: list[float] = field(default_factory=list)
    eps_dual: list[float] = field(default_factory=list)
    participants: list[list[int]] = field(default_factory=list)


def _local_loop(
    w: Matrix,
    X: Matrix,
    y: Matrix,
    z: Matrix,
    u_i: Matrix,
    *,
    rho: float,
    L: int,
    eta: float,
    C: float,
    prox: str,
) -> Matrix:
    for _ in range(L):
        g = logistic_grad(w, X, y, C)
        if prox == "gradient":
            g = g + rho * (w - z + u_i)
            w = w - eta * g
        else:
            w = (w - eta * g + eta * rho * (z - u_i)) / (1.0 + eta * rho)
    return w


def seed_admm(
    X: Sequence[Matrix],
    y: Sequence[NDArray[np.generic]],
    *,
    rho: float = 0.1,
    L: int = 5,
    eta: float = 0.02,
    C: float = 0.01,
    rounds: int = 200,
    local_init: str = "previous",
    prox: str = "gradient",
    participation: Sequence[Sequence[int]] | None = None,
    eps_abs: float = 1e-6,
    eps_rel: float = 1e-4,
) -> ADMMTrace:
    """Run the seed's approximate ADMM loop (section 3.2); see the module docstring.

    Residuals, for the participants P of the round with weights p_i = 1/|P|
    (equal sizes), y_i = rho u_i and n = d:
    r = sqrt(sum p_i ||w_i - z||^2), s = rho ||z - z_old||,
    eps_pri = sqrt(n) eps_abs + eps_rel max(sqrt(sum p_i ||w_i||^2), ||z||),
    eps_dual = sqrt(n) eps_abs + eps_rel sqrt(sum p_i ||y_i||^2).
    """
    if local_init not in ("previous", "center") or prox not in ("gradient", "exact"):
        raise ValueError("local_init / prox: unknown variant")
    N, d = len(X), X[0].shape[1]
    ys = [labels_pm1(yi) for yi in y]
    sizes = np.array([Xi.shape[0] for Xi in X], dtype=np.float64)
    if not np.all(sizes == sizes[0]):
        raise ValueError("the seed port assumes equal client sizes")
    w = np.zeros((d, N))
    z = np.zeros(d)
    u = np.zeros((d, N))
    seen = np.zeros(N, dtype=bool)
    trace = ADMMTrace()
    for k in range(rounds):
        active = sorted(participation[k]) if participation is not None else list(range(N))
        for i in active:
            fresh = local_init == "center" or (participation is not None and not seen[i])
            start = z - u[:, i] if fresh else w[:, i]
            w[:, i] = _local_loop(
                start, X[i], ys[i], z, u[:, i], rho=rho, L=L, eta=eta, C=C, prox=prox
            )
        seen[active] = True
        z_old = z
        z = np.mean(w[:, seen] + u[:, seen], axis=1)
        u[:, active] += w[:, active] - z[:, None]
        trace.z.append(z.copy())
        trace.w.append(w.copy())
        trace.u.append(u.copy())
        trace.participants.append(active)
        wa, ya = w[:, active], rho * u[:, active]
        trace.primal.append(float(np.sqrt(np.mean(np.sum((wa - z[:, None]) ** 2, axis=0)))))
        trace.dual.append(float(rho * np.linalg.norm(z - z_old)))
        w_norm = float(np.sqrt(np.mean(np.sum(wa**2, axis=0))))
        y_norm = float(np.sqrt(np.mean(np.sum(ya**2, axis=0))))
        trace.eps_primal.append(np.sqrt(d) * eps_abs + eps_rel * max(w_norm, np.linalg.norm(z)))
        trace.eps_dual.append(np.sqrt(d) * eps_abs + eps_rel * y_norm)
    return trace


@dataclass
class FedAvgTrace:
    """Iterates of the FedAvg control after every round."""

    z: list[Matrix] = field(default_factory=list)
    w: list[Matrix] = field(default_factory=list)


def seed_fedavg(
    X: Sequence[Matrix],
    y: Sequence[NDArray[np.generic]],
    *,
    lam: float = 1.0,
    L: int = 5,
    eta: float = 0.02,
    C: float = 0.01,
    rounds: int = 200,
    start: str = "previous",
) -> FedAvgTrace:
    """The seed's FedAvg control with proximal lambda (section 3.3).

    ``start="previous"`` is the literal seed (w_fed warm-starts from its own last
    value); ``start="z"`` starts every local loop at the broadcast z_fed, as Flower's
    FedAvg (lam = 0) and FedProx (lam = proximal_mu) clients do.
    """
    if start not in ("previous", "z"):
        raise ValueError("start: must be 'previous' or 'z'")
    N, d = len(X), X[0].shape[1]
    ys = [labels_pm1(yi) for yi in y]
    w_fed = np.zeros((d, N))
    z_fed = np.zeros(d)
    trace = FedAvgTrace()
    for _ in range(rounds):
        for i in range(N):
            if start == "z":
                w_fed[:, i] = z_fed
            for _ in range(L):
                g = logistic_grad(w_fed[:, i], X[i], ys[i], C)
                g = g + lam * (w_fed[:, i] - z_fed)
                w_fed[:, i] = w_fed[:, i] - eta * g
        z_fed = np.mean(w_fed, axis=1)
        trace.z.append(z_fed.copy())
        trace.w.append(w_fed.copy())
    return trace
