"""FedDyn on Flower's legacy API: `flwr_admm.rounds.feddyn` behind `PeerStrategy`.

The math (Acar et al., ICLR 2021), the server state h and the update are
`flwr_admm.rounds.feddyn.FedDynRound`'s, which the Message-API
`flwr_admm.serverapp.feddyn.FedDyn` runs too.
"""

from __future__ import annotations

from typing import Any

from flwr.common import NDArrays

from flwr_admm.rounds.feddyn import FedDynRound
from flwr_admm.server.peer_base import PeerStrategy

__all__ = ["FedDyn"]


class FedDyn(PeerStrategy):
    """FedDyn with penalty alpha and server state h.

    Takes every keyword of Flower's `FedAvg` plus `alpha` (> 0, required: the paper
    tunes it over 0.1, 0.01, 0.001) and ``health`` (the divergence watchdog,
    `PeerStrategy`; None: off). Clients MUST follow the ``peer-algorithm =
    "feddyn"`` contract: from the received x, approximately minimize f_i(w) -
    <grad_i, w> + alpha/2 ||w - x||^2 with alpha from ``feddyn-alpha``, update
    grad_i <- grad_i - alpha (w_i - x), reply w_i and commit grad_i once acknowledged
    (``admm-ack-round``, `flwr_admm.rounds.peers`). `flwr_admm.client.ADMMClient` does,
    keeping grad_i in its ``context.state``. Bad replies (layout, NaN/inf,
    num_examples <= 0, out of sync with the acknowledgement, refused by the key binding
    ``key_binding`` as in `FedADMM`) are rejected and counted in ``num_rejected``
    (``num_state_mismatch``, ``num_key_conflicts``); they leave the state untouched.

    Update: sum_held n_i grad_i -= alpha n_i (w_i - x); x' = sum_S p_i w_i - h / alpha.
    """

    def __init__(self, *, alpha: float, key_binding: str = "node", **fedavg_kwargs: Any) -> None:
        algorithm = FedDynRound(alpha, key_binding)
        super().__init__(algorithm, **fedavg_kwargs)
        self.alpha = algorithm.alpha
        self.key_binding = algorithm.binding.policy

    def __repr__(self) -> str:
        return f"FedDyn(alpha={self.alpha!r})"

    def h(self) -> NDArrays:
        """Return the server state h = sum_held n_i grad_i / sum_held n_i (0 at first)."""
        assert isinstance(self.algorithm, FedDynRound)
        return self.algorithm.h()
