"""FedDyn: federated learning with dynamic regularization (Acar et al., ICLR 2021).

Flower 1.42 ships no FedDyn. With x the model sent this round, grad_i client i's
linear term (zero at first), h the server state (zero at first), S the round's clients:

    client:  w_i ~ argmin_w f_i(w) - <grad_i, w> + alpha/2 ||w - x||^2
             grad_i <- grad_i - alpha (w_i - x)
    server:  h  = sum_{i held} n_i grad_i / sum_{i held} n_i
                  (h <- h - alpha/m sum_{i in S} (w_i - x) in the paper)
             x' = sum_{i in S} p_i w_i - h / alpha

p_i = n_i / sum_{j in S} n_j (the weighting and the acknowledgement:
`flwr_admm.rounds.peers`). At a fixed point w_i = x and grad_i = grad f_i(x), so
h = 0 = sum_i p_i grad f_i(x): the pooled optimum, as in ADMM with the duals -grad_i
on the clients. The wire is FedAvg's, with ``feddyn-alpha`` in the config.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from flwr.common import Scalar

from flwr_admm.core.types import Arrays
from flwr_admm.protocol import FEDDYN_ALPHA, PEER_FEDDYN
from flwr_admm.rounds.peers import PeerRound, Reply

__all__ = ["FedDynRound"]


class FedDynRound(PeerRound):
    """FedDyn's server round (module docstring) with penalty alpha > 0."""

    label = "FedDyn"
    peer = PEER_FEDDYN

    def __init__(self, alpha: float) -> None:
        if (
            isinstance(alpha, bool)
            or not isinstance(alpha, int | float)
            or not math.isfinite(alpha)
            or alpha <= 0
        ):
            raise ValueError(f"alpha: must be a finite number > 0, got {alpha!r}")
        super().__init__()
        self.alpha = float(alpha)

    def h(self) -> Arrays:
        """Return the server state h = sum_held n_i grad_i / sum_held n_i (0 at first)."""
        return self.state_mean()

    def _config(self) -> dict[str, Scalar]:
        return {FEDDYN_ALPHA: self.alpha}

    def _settings(self) -> dict[str, Any]:
        return {"alpha": self.alpha}

    def _update(self, x: Arrays, replies: list[Reply]) -> tuple[Arrays, dict[str, Scalar]]:
        """Sum_held n_i grad_i -= alpha n_i (w_i - x); x' = sum_S p_i w_i - h / alpha."""
        mean = [np.zeros_like(t) for t in x]
        h_sum = self.sums()
        for p, reply in zip(self.weights(replies), replies, strict=True):
            n, grad_i = self.state_weight(reply.key), self.held(reply.key)
            for k, (xk, wk) in enumerate(zip(x, reply.arrays, strict=True)):
                mean[k] += p * wk  # sum_S p_i w_i
                h_sum[k] -= (self.alpha * n) * (wk - xk)  # n_i grad_i's change
                grad_i[k] = grad_i[k] - self.alpha * (wk - xk)  # as the client computes it
        h = self.h()
        return [m - hk / self.alpha for m, hk in zip(mean, h, strict=True)], {}
