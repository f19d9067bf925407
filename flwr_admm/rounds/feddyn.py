"""FedDyn: federated learning with dynamic regularization (Acar et al., ICLR 2021).

Flower 1.42 ships no FedDyn. With x the model sent this round, grad_i client i's
linear term (zero at first), h the server state (zero at first), S the round's clients:

    client:  w_i ~ argmin_w f_i(w) - <grad_i, w> + alpha/2 ||w - x||^2
             grad_i <- grad_i - alpha (w_i - x)
    server:  h  = sum_{i seen} n_i grad_i / sum_{i seen} n_i
                  (h <- h - alpha/m sum_{i in S} (w_i - x) in the paper)
             x' = sum_{i in S} p_i w_i - h / alpha

p_i = n_i / sum_{j in S} n_j (`flwr_admm.rounds.peers` on the weighting: with
equal n_i and every client seen this is the paper's). At a fixed point w_i = x and
grad_i = grad f_i(x), so h = 0 = sum_i p_i grad f_i(x): the pooled optimum, like
ADMM (FedDyn is ADMM-like with the duals -grad_i on the clients).
"""

from __future__ import annotations

import math

import numpy as np
from flwr.common import NDArrays, Scalar

from flwr_admm.protocol import FEDDYN_ALPHA, PEER_FEDDYN
from flwr_admm.rounds.peers import PeerRound, Reply

__all__ = ["FedDynRound"]


class FedDynRound(PeerRound):
    """FedDyn's server round: penalty alpha (> 0) and server state h.

    Sent: x (and ``feddyn-alpha`` in the config); a reply: w_i.

    Update: sum_seen n_i grad_i -= alpha n_i (w_i - x); x' = sum_S p_i w_i - h / alpha.
    """

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
        self.h_sum: NDArrays | None = None  # sum_{i seen} n_i grad_i

    def h(self) -> NDArrays:
        """Return the server state h = sum_seen n_i grad_i / sum_seen n_i (0 at first)."""
        assert self.current is not None
        if self.h_sum is None:
            return [np.zeros_like(t) for t in self.current]
        return [s / self.seen_examples() for s in self.h_sum]

    def _outgoing(self, x: NDArrays) -> NDArrays:
        return x

    def _blocks(self) -> int:
        return 1

    def _config(self) -> dict[str, Scalar]:
        return {FEDDYN_ALPHA: self.alpha}

    def _update(self, x: NDArrays, replies: list[Reply]) -> tuple[NDArrays, dict[str, Scalar]]:
        """Sum_seen n_i grad_i -= alpha n_i (w_i - x); x' = sum_S p_i w_i - h / alpha."""
        mean = [np.zeros_like(t) for t in x]
        h_sum = self.h_sum or [np.zeros_like(t) for t in x]
        for p, (key, w, _) in zip(self.weights(replies), replies, strict=True):
            n = self.state_weight(key)
            for k, (xk, wk) in enumerate(zip(x, w, strict=True)):
                mean[k] += p * wk  # sum_S p_i w_i
                h_sum[k] -= (self.alpha * n) * (wk - xk)  # n_i grad_i's change
        self.h_sum = h_sum
        h = self.h()
        return [m - hk / self.alpha for m, hk in zip(mean, h, strict=True)], {}
