"""Server half of fast ADMM with restart for client-held duals (`FedADMMClientDuals`).

The method and its restart test on c_k are `flwr_admm.core.acceleration`'s. With the
duals on the clients the server keeps a_k, c_{k-1}, z_{k-1} and ||z_k - z^_k||^2,
extrapolates z itself and sends z_k and g in the next fit config; each client
extrapolates its own dual (`flwr_admm.core.client_duals`):

    no restart:   a' = (1 + sqrt(1 + 4 a^2)) / 2,  g = (a - 1) / a'
                  z^_{k+1} = z_k + g (z_k - z_{k-1}),  u^_i = u_i + g (u_i - u_i,prev)
    restart:      a' = 1, g = 0:  z^_{k+1} = z_k,    u^_i = u_i

The dual part sum_i p_i ||w_i - z_k||^2 of c_k needs z_k, which a client sees only in
its next round. Two ways to get it from the scalar sums the clients report (all that
SecAgg+ reveals):

- In time, while every client S holds replies in every round with an unchanged n_i
  (`RoundSums.complete`): the duals' sums follow from the server's own state,
  U_k = sum n_i u_i,k = S_k - N z_k and, the clients' extrapolation being linear,
  U^_k = (1 + g) U_{k-1} - g UP_{k-1} (UP: sum of the u_i,prev; 0 in the first
  round). With V = sum n_i (w_i,k - z^_k) = S_k - U^_k - N z^_k and each client's
  h_i = ||w_i,k - z^_k||^2:

      sum n_i ||w_i,k - z_k||^2 = sum n_i h_i - 2 <V, z_k - z^_k> + N ||z_k - z^_k||^2

  so c_k is server-held fast ADMM's (up to rounding) and so is every restart.
- Lagged, once a round was not complete (partial participation, a lost reply, a new
  or resynchronizing client; tracking does not resume): c_{k-1} = rho (sum n_i d2_i /
  sum n_i + ||z_{k-1} - z^_{k-1}||^2) from the d2_i = ||w_i,k-1 - z_{k-1}||^2 of this
  round's replies that took part before, tested against eta c_{k-2}; until a first c
  is known the momentum grows untested.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from flwr_admm.core.acceleration import DEFAULT_ETA
from flwr_admm.core.client_duals import Extrapolation
from flwr_admm.core.types import Arrays
from flwr_admm.protocol import ACCEL_GAMMA

__all__ = ["DualMomentum", "RoundSums", "extrapolate", "fast_config", "momentum_for"]


def momentum_for(acceleration: str | None, eta: float) -> DualMomentum | None:
    """Return the momentum state of `acceleration` (None: plain ADMM)."""
    if acceleration is None:
        return None
    return DualMomentum(eta=float(eta))


@dataclass(frozen=True)
class RoundSums:
    """What the server knows after round k's z-step, for the restart test's c."""

    contribution_sum: Arrays  # S_k = sum_i n_i (w_i,k + u^_i,k)
    total: float  # N
    n_delayed: float  # sum n_i over the replies with d2_i
    n_d2: float  # sum n_i d2_i (their ||w_i,k-1 - z_{k-1}||^2)
    hat_sq: float  # sum n_i ||w_i,k - z^_k||^2 over the replies
    complete: bool  # every client S holds replied, with its n_i and ||w_i - z^||^2
    all_returning: bool  # every reply had taken part before
    all_new: bool  # no reply had


def extrapolate(
    momentum: DualMomentum, z: Arrays, z_hat: Arrays, dz_sq: float, sums: RoundSums, rho: float
) -> tuple[Arrays, Arrays]:
    """Return (z_k, z^_{k+1}) after the z-step z_k = `z` from z^_k = `z_hat`.

    c_k in time while every client has replied in every round (`_in_time`), else the
    lagged c_{k-1} = rho (sum n_i d2_i / sum n_i + ||z_{k-1} - z^_{k-1}||^2).
    """
    c = _in_time(momentum, z, z_hat, dz_sq, sums, rho)
    if c is None:
        lagged = momentum.residual(rho, sums.n_delayed, sums.n_d2)
        c = None if momentum.c_current else lagged  # c_{k-1} was already tested
        momentum.c_current = False
    fast = momentum.step(z, z_hat, dz_sq, c)
    momentum.last = fast
    return fast.z, momentum.extrapolated(fast)


def _in_time(
    momentum: DualMomentum, z: Arrays, z_hat: Arrays, dz_sq: float, sums: RoundSums, rho: float
) -> float | None:
    """Return c_k in time (the module's first way); None, and tracking stops, otherwise."""
    fresh = momentum.last is None and sums.all_new
    tracked = momentum.u_sum is not None and momentum.u_prev_sum is not None
    if not sums.complete or not (fresh or (tracked and sums.all_returning)):
        momentum.u_sum = momentum.u_prev_sum = None
        return None
    if fresh:
        u_hat = [np.zeros_like(t) for t in z]
        u_prev: Arrays = [np.zeros_like(t) for t in z]
    else:
        assert momentum.last is not None
        assert momentum.u_sum is not None and momentum.u_prev_sum is not None
        g, u, up = momentum.last.gamma, momentum.u_sum, momentum.u_prev_sum
        # u^_i = u_i + g (u_i - u_i,prev), u_i,prev' = u_i
        u_hat = [(1.0 + g) * a - g * b for a, b in zip(u, up, strict=True)]
        u_prev = u
    n = sums.total
    cross = 0.0
    for s, uh, zh, zk in zip(sums.contribution_sum, u_hat, z_hat, z, strict=True):
        v = s - uh - n * zh  # V
        cross += float(np.vdot(v, zk - zh))
    primal = max(sums.hat_sq - 2.0 * cross + n * dz_sq, 0.0) / n
    momentum.u_sum = [s - n * t for s, t in zip(sums.contribution_sum, z, strict=True)]  # U_k
    momentum.u_prev_sum = u_prev
    momentum.c_current = True
    return rho * (primal + dz_sq)


def fast_config(momentum: DualMomentum) -> dict[str, float]:
    """Return the fit-config entry of the last step: g."""
    fast = momentum.last
    return {ACCEL_GAMMA: 0.0 if fast is None else float(fast.gamma)}


@dataclass
class DualMomentum:
    """Momentum state: a, c_{k-1}, z_{k-1}, ||z_k - z^_k||^2 and the restart count."""

    eta: float = DEFAULT_ETA
    a: float = 1.0
    c_prev: float | None = None
    z_prev: Arrays | None = None
    dz_sq: float | None = None  # ||z_k - z^_k||^2 of the last z-step
    restarts: int = 0
    last: Extrapolation | None = None  # the last step's (z_k, g)
    u_sum: Arrays | None = None  # U_{k-1} = sum n_i u_i (None: not tracked)
    u_prev_sum: Arrays | None = None  # UP_{k-1} = sum n_i u_i,prev
    c_current: bool = False  # c_prev is the last round's own (in time), not c_{k-2}

    def residual(self, rho: float, n: float, n_d2: float) -> float | None:
        """Return c_{k-1} = rho (n_d2 / n + ||z_{k-1} - z^_{k-1}||^2); None if unknown."""
        if n <= 0 or self.dz_sq is None:
            return None
        return rho * (n_d2 / n + self.dz_sq)

    def step(self, z: Arrays, z_hat: Arrays, dz_sq: float, c: float | None) -> Extrapolation:
        """Return z_k with g; z^_{k+1} is `extrapolated(...)`.

        `z` is z_k, `z_hat` the z^_k it came from (read on the first round only, as
        z_{k-1} = z^_0), `dz_sq` = ||z_k - z^_k||^2, `c` the lagged c_{k-1} (None: none).
        """
        if self.z_prev is None:
            self.z_prev = [t.copy() for t in z_hat]
        z_k = [t.copy() for t in z]
        self.dz_sq = dz_sq
        if c is not None and not math.isfinite(c):
            self.a, self.c_prev, self.z_prev = 1.0, None, z_k
            return Extrapolation(z_k, 0.0)
        restart = c is not None and self.c_prev is not None and not c < self.eta * self.c_prev
        if restart:  # from the current point: g = 0
            self.a, self.c_prev, self.z_prev = 1.0, c, z_k
            self.restarts += 1
            return Extrapolation(z_k, 0.0)
        a_next = (1.0 + math.sqrt(1.0 + 4.0 * self.a * self.a)) / 2.0
        gamma = (self.a - 1.0) / a_next
        self.a = a_next
        if c is not None:
            self.c_prev = c
        return Extrapolation(z_k, gamma)

    def extrapolated(self, fast: Extrapolation) -> Arrays:
        """Return z^_{k+1} for the `step` result `fast`; then z_{k-1} := z_k."""
        assert self.z_prev is not None
        z_hat = [t + fast.gamma * (t - p) for t, p in zip(fast.z, self.z_prev, strict=True)]
        self.z_prev = fast.z
        return z_hat

    # ------------------------------------------------------------- checkpoint
    def dump(self) -> tuple[dict[str, Any], dict[str, Any]]:
        """Return arrays (``accel_z_prev.j``) and JSON metadata."""
        arrays = {f"accel_z_prev.{j}": t for j, t in enumerate(self.z_prev or [])}
        if self.last is not None:
            arrays.update({f"accel_z.{j}": t for j, t in enumerate(self.last.z)})
        if self.u_sum is not None and self.u_prev_sum is not None:
            arrays.update({f"accel_u_sum.{j}": t for j, t in enumerate(self.u_sum)})
            arrays.update({f"accel_u_prev_sum.{j}": t for j, t in enumerate(self.u_prev_sum)})
        meta = {
            "a": self.a,
            "c_prev": self.c_prev,
            "dz_sq": self.dz_sq,
            "restarts": self.restarts,
            "has_z_prev": self.z_prev is not None,
            "c_current": self.c_current,
            "tracked": self.u_sum is not None and self.u_prev_sum is not None,
            "gamma": None if self.last is None else self.last.gamma,
        }
        return arrays, meta

    def load(self, arrays: dict[str, Any], meta: dict[str, Any], count: int) -> None:
        """Restore what `dump` wrote (`count` arrays per model)."""
        self.a, self.restarts = float(meta["a"]), int(meta["restarts"])
        self.c_prev = None if meta["c_prev"] is None else float(meta["c_prev"])
        self.dz_sq = None if meta["dz_sq"] is None else float(meta["dz_sq"])
        self.z_prev = (
            [arrays[f"accel_z_prev.{j}"].astype(float) for j in range(count)]
            if meta["has_z_prev"]
            else None
        )
        self.c_current = bool(meta["c_current"])
        self.u_sum = self.u_prev_sum = None
        if meta["tracked"]:
            self.u_sum = [arrays[f"accel_u_sum.{j}"].astype(float) for j in range(count)]
            self.u_prev_sum = [arrays[f"accel_u_prev_sum.{j}"].astype(float) for j in range(count)]
        self.last = None
        if meta["gamma"] is not None:
            z = [arrays[f"accel_z.{j}"].astype(float) for j in range(count)]
            self.last = Extrapolation(z, float(meta["gamma"]))
