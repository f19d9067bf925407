"""Arithmetic of consensus ADMM with client-held duals (numpy only).

Client i keeps w_i, its scaled dual u_i (before the pending update), n_i and the
round it last took part in (`DualState`). Round k, given z^k:

    if it took part before:  d2_i = ||w_i - z^k||^2,  u_i += w_i - z^k   (`start_round`)
    w_i' ~ argmin f_i(w) + rho/2 ||w - (z^k - u_i)||^2      (the caller's local solve)
    Delta_i = n_i' (w_i' + u_i) - n_i c_i,  c_i = w_i + u_i   (`contribution_change`)

The server side (`flwr_admm.server.FedADMMClientDuals`) keeps S = sum_i n_i c_i.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from flwr_admm.core.types import Arrays


@dataclass
class DualState:
    """What a client keeps: w_i, u_i (before its pending update), n_i, its last round.

    `residual` is the uplink compression residual e_i (None: zero).
    """

    w: Arrays
    u: Arrays
    num_examples: int
    server_round: int
    residual: Arrays | None = None

    @property
    def contribution(self) -> Arrays:
        """C_i = w_i + u_i, the share S holds (times n_i)."""
        return [w + u for w, u in zip(self.w, self.u, strict=True)]


@dataclass(frozen=True)
class DualStart:
    """The client's view of round k: its updated dual, center and delayed residual."""

    dual: Arrays
    center: Arrays
    delayed_sq_residual: float | None


def start_round(state: DualState | None, z: Arrays) -> DualStart:
    """U_i += w_i - z^k if it took part before (d2 = ||w_i - z^k||^2); center z^k - u_i."""
    if state is None:
        dual = [np.zeros_like(t) for t in z]
        return DualStart(dual, [t.copy() for t in z], None)
    diff = [w - t for w, t in zip(state.w, z, strict=True)]
    d2 = float(sum(np.vdot(d, d) for d in diff))
    dual = [u + d for u, d in zip(state.u, diff, strict=True)]
    return DualStart(dual, [t - u for t, u in zip(z, dual, strict=True)], d2)


def contribution_change(
    state: DualState | None, w: Arrays, dual: Arrays, num_examples: int
) -> Arrays:
    """Delta_i = n_i' (w_i' + u_i) - n_i c_i (n_i c_i = 0 before the first round)."""
    change = [float(num_examples) * (a + u) for a, u in zip(w, dual, strict=True)]
    if state is not None:
        for delta, old in zip(change, state.contribution, strict=True):
            delta -= float(state.num_examples) * old
    return change
