"""SCAFFOLD: stochastic controlled averaging (Karimireddy et al., ICML 2020).

Flower 1.42 ships no SCAFFOLD. Option II control variates, with x the global model,
c the server's control variate, c_i client i's (zero at first), S the round's clients:

    client:  y_i <- y_i - lr (grad f_i(y_i) - c_i + c)      K steps from y_i = x
             c_i+ = c_i - c + (x - y_i) / (K lr)
    server:  x  <- x + eta_g sum_{i in S} p_i (y_i - x)
             c   = sum_{i held} n_i c_i / sum_{i held} n_i   (c += that share of dc_i)

p_i = n_i / sum_{j in S} n_j (the weighting and the acknowledgement that keeps c the
mean of the clients' c_i through lost replies: `flwr_admm.rounds.peers`). Both
directions carry two model-sized blocks (x, c down; y_i, c_i+ - c_i up): twice
FedAvg's bytes per round.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from flwr.common import Scalar

from flwr_admm.core.types import Arrays
from flwr_admm.protocol import PEER_SCAFFOLD, SCAFFOLD_CONTROL_RECORD, SERVER_STEP
from flwr_admm.rounds.peers import PeerRound, Reply

__all__ = ["ScaffoldRound"]


class ScaffoldRound(PeerRound):
    """SCAFFOLD's server round (module docstring).

    `server_learning_rate` is eta_g > 0 (default 1, the paper's choice with full
    participation).
    """

    label = "SCAFFOLD"
    peer = PEER_SCAFFOLD
    reply_blocks: tuple[str, ...] = (SCAFFOLD_CONTROL_RECORD,)

    def __init__(self, server_learning_rate: float = 1.0) -> None:
        if (
            isinstance(server_learning_rate, bool)
            or not isinstance(server_learning_rate, int | float)
            or not math.isfinite(server_learning_rate)
            or server_learning_rate <= 0
        ):
            raise ValueError(
                f"server_learning_rate: must be a finite number > 0, got {server_learning_rate!r}"
            )
        super().__init__()
        self.server_learning_rate = float(server_learning_rate)

    def control(self) -> Arrays:
        """Return the server control variate c = sum_held n_i c_i / sum_held n_i (0 at first)."""
        return self.state_mean()

    def _blocks_down(self) -> dict[str, Arrays]:
        return {SCAFFOLD_CONTROL_RECORD: self.control()}

    def _settings(self) -> dict[str, Any]:
        return {"server_learning_rate": self.server_learning_rate}

    def _update(self, x: Arrays, replies: list[Reply]) -> tuple[Arrays, dict[str, Scalar]]:
        """X' = x + eta_g sum_S p_i (y_i - x); sum_held n_i c_i += n_i (c_i+ - c_i)."""
        half = len(x)
        step = [np.zeros_like(t) for t in x]
        control_sum = self.sums()
        for p, reply in zip(self.weights(replies), replies, strict=True):
            n, c_i, arrays = self.state_weight(reply.key), self.held(reply.key), reply.arrays
            for k, (xk, yk, dck) in enumerate(zip(x, arrays[:half], arrays[half:], strict=True)):
                step[k] += p * (yk - xk)  # sum_S p_i (y_i - x)
                control_sum[k] += n * dck  # n_i (c_i+ - c_i)
                c_i[k] = c_i[k] + dck  # c_i+, as the client computes it
        eta = self.server_learning_rate
        return [xk + eta * s for xk, s in zip(x, step, strict=True)], {SERVER_STEP: eta}
