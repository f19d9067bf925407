"""FedDyn on Flower's Message API: the round of `flwr_admm.rounds.feddyn.FedDynRound`.

Dynamic regularization (Acar et al., ICLR 2021), with x the model sent this round,
grad_i node i's linear term (zero at first), h the server state (zero at first):

    node:    w_i ~ argmin_w f_i(w) - <grad_i, w> + alpha/2 ||w - x||^2
             grad_i <- grad_i - alpha (w_i - x)
    server:  h  = sum_{i held} n_i grad_i / sum_{i held} n_i
             x' = sum_{i in S} p_i w_i - h / alpha

p_i = n_i / sum_{j in S} n_j (``num-examples``). Wire: x under ``arrays`` and
``peer-algorithm = "feddyn"``, ``feddyn-alpha`` in the config; a node replies w_i
under ``arrays`` with ``num-examples`` in its one MetricRecord: FedAvg's messages.
The state and the update are the round's, as in the legacy
`flwr_admm.server.feddyn.FedDyn`, so identical replies give identical x' and h.
"""

from __future__ import annotations

from typing import Any

from flwr.common import NDArrays

from flwr_admm.rounds.feddyn import FedDynRound
from flwr_admm.serverapp.peer_base import PeerFedAvg

__all__ = ["FedDyn"]


class FedDyn(PeerFedAvg):
    """FedDyn with penalty alpha and server state h.

    Takes every keyword of Flower's Message-API `FedAvg` plus `alpha` (> 0,
    required), ``key_binding`` (who may speak for a client key, as in `FedADMM`) and
    ``health`` (the divergence watchdog, `PeerFedAvg`; None: off). Nodes MUST follow
    the ``peer-algorithm = "feddyn"`` contract above and commit grad_i only once
    acknowledged (``admm-ack-round``, `flwr_admm.rounds.peers`);
    `flwr_admm.clientapp.make_client_app` around an `ADMMClient` does, keeping grad_i
    in ``context.state``. Bad replies are rejected and counted in ``num_rejected``;
    they leave x and h untouched.

    Update: sum_held n_i grad_i -= alpha n_i (w_i - x); x' = sum_S p_i w_i - h / alpha.
    """

    def __init__(self, *, alpha: float, key_binding: str = "node", **fedavg_kwargs: Any) -> None:
        algorithm = FedDynRound(alpha, key_binding)
        super().__init__(algorithm, (), **fedavg_kwargs)
        self.alpha = algorithm.alpha
        self.key_binding = algorithm.binding.policy

    def __repr__(self) -> str:
        return f"FedDyn(alpha={self.alpha!r})"

    def h(self) -> NDArrays:
        """Return the server state h (float64, model order; 0 at first)."""
        assert isinstance(self.algorithm, FedDynRound)
        return self.algorithm.h()
