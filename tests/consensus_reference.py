"""Independent references for the ConsensusADMM tests: ridge data solved in closed form.

- `clients`: non-IID linear data, every client with its own true weight vector;
- `ridge_local_argmin`, `pooled_ridge`: the exact local solve and the pooled ridge
  optimum, both from the normal equations (numpy only);
- `ridge_round`: one round of exact local solves, fed to a ConsensusADMM;
- `ScaledReference`: textbook consensus ADMM in scaled form over every client seen so far.
"""

from __future__ import annotations

import numpy as np

from flwr_admm.core import ConsensusADMM
from flwr_admm.core.schedules import RhoSchedule, RoundResiduals, ScheduleState
from flwr_admm.core.types import Reply


def rel(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


def clients(sizes: list[int], d: int, seed: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """Non-IID linear data: every client has its own true weight vector."""
    rng = np.random.default_rng(seed)
    base = rng.normal(size=d)
    data = []
    for n in sizes:
        X = rng.normal(loc=rng.normal(), size=(n, d))
        theta = base + rng.normal(scale=1.0, size=d)
        data.append((X, X @ theta + 0.1 * rng.normal(size=n)))
    return data


def ridge_local_argmin(X, y, lam: float, rho: float, v: np.ndarray) -> np.ndarray:
    """argmin_w 1/(2n)||X w - y||^2 + lam/2||w||^2 + rho/2||w - v||^2 (normal equations)."""
    n, d = X.shape
    return np.linalg.solve(X.T @ X / n + (lam + rho) * np.eye(d), X.T @ y / n + rho * v)


def pooled_ridge(data, lam: float) -> np.ndarray:
    """argmin_w sum_i p_i f_i(w) = 1/(2N)||X w - y||^2 + lam/2||w||^2 on the pooled data."""
    X = np.vstack([X for X, _ in data])
    y = np.concatenate([y for _, y in data])
    N, d = X.shape
    return np.linalg.solve(X.T @ X / N + lam * np.eye(d), X.T @ y / N)


def ridge_round(admm: ConsensusADMM, data, lam: float, keys, server_round: int):
    replies = []
    for key in keys:
        X, y = data[int(key[1:])]
        rho_i = admm.rho_for(key)
        v = admm.center(key)[0]
        replies.append(Reply(key, [ridge_local_argmin(X, y, lam, rho_i, v)], X.shape[0]))
    return admm.step(replies, server_round)


class ScaledReference:
    """Textbook consensus ADMM in scaled form over all clients seen so far (Boyd 7.1).

    z = sum_i p_i (w_i + u_i), u_i += w_i - z for repliers, then u *= rho_old / rho_new.
    """

    def __init__(self, d: int) -> None:
        self.w: dict[str, np.ndarray] = {}
        self.u: dict[str, np.ndarray] = {}
        self.n: dict[str, int] = {}
        self.z = np.zeros(d)

    def step(self, replies: dict[str, tuple[np.ndarray, int]], rho_old: float, rho_new: float):
        for key, (w, n) in replies.items():
            self.w[key], self.n[key] = w, n
            self.u.setdefault(key, np.zeros_like(w))
        total = sum(self.n.values())
        self.z = sum(self.n[k] * (self.w[k] + self.u[k]) for k in self.w) / total
        for key in replies:
            self.u[key] = self.u[key] + self.w[key] - self.z
        for key in self.u:
            self.u[key] = self.u[key] * (rho_old / rho_new)

    def center(self, key: str) -> np.ndarray:
        return self.z - self.u[key] if key in self.u else self.z


class Stepped(RhoSchedule):
    """A test schedule: every `every` rounds rho *= factor, clipped below at rho_min.

    Drives the rho changes whose dual rescaling the tests check (the library's schedules
    change rho only on residual imbalance).
    """

    def __init__(self, factor: float, every: int = 1, rho_min: float = 1e-6) -> None:
        self.factor, self.every, self.rho_min = float(factor), int(every), float(rho_min)

    def update(
        self, rho: float, state: ScheduleState, residuals: RoundResiduals
    ) -> tuple[float, ScheduleState]:
        """Multiply by `factor` on rounds divisible by `every`."""
        if residuals.server_round % self.every == 0:
            rho = max(rho * self.factor, self.rho_min)
        return rho, state
