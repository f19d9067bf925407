"""SCAFFOLD on Flower's Message API: the round of `flwr_admm.rounds.scaffold.ScaffoldRound`.

Option II control variates (Karimireddy et al., ICML 2020), with x the global model,
c the server's control variate, c_i node i's (zero at first), S the round's nodes:

    node:    y_i <- y_i - lr (grad f_i(y_i) - c_i + c)      K steps from y_i = x
             c_i+ = c_i - c + (x - y_i) / (K lr)
    server:  x  <- x + eta_g sum_{i in S} p_i (y_i - x)
             c   = sum_{i held} n_i c_i / sum_{i held} n_i

p_i = n_i / sum_{j in S} n_j (``num-examples``). Wire: x travels under ``arrays`` and
c under ``scaffold-control`` (`flwr_admm.protocol.SCAFFOLD_CONTROL_RECORD`), both with
the model's tensor names and dtypes, and the config holds ``peer-algorithm =
"scaffold"``; a node replies y_i under ``arrays`` and c_i+ - c_i under
``scaffold-control`` (same names), with ``num-examples`` in its one MetricRecord.
Twice FedAvg's bytes each way. The state and the update are the round's, as in the
legacy `flwr_admm.server.scaffold.SCAFFOLD`, so identical replies give identical x'
and c.
"""

from __future__ import annotations

from typing import Any

from flwr.common import NDArrays

from flwr_admm.protocol import SCAFFOLD_CONTROL_RECORD
from flwr_admm.rounds.scaffold import ScaffoldRound
from flwr_admm.serverapp.peer_base import PeerFedAvg

__all__ = ["SCAFFOLD"]


class SCAFFOLD(PeerFedAvg):
    """SCAFFOLD with option II control variates and server step size eta_g.

    Takes every keyword of Flower's Message-API `FedAvg` plus `server_learning_rate`
    (eta_g > 0, default 1), ``key_binding`` (who may speak for a client key, as in
    `FedADMM`) and ``health`` (the divergence watchdog, `PeerFedAvg`; None: off). Nodes
    MUST follow the ``peer-algorithm = "scaffold"`` contract above and commit c_i+ only
    once acknowledged (``admm-ack-round``, `flwr_admm.rounds.peers`);
    `flwr_admm.clientapp.make_client_app` around an `ADMMClient` does, keeping c_i in
    ``context.state`` (a user's handler: `flwr_admm.clientapp.received_control` and
    `build_scaffold_reply`). Bad replies are rejected and counted in ``num_rejected``;
    they leave x and c untouched.

    Update: x' = x + eta_g sum_S p_i (y_i - x); c = sum_held n_i c_i / sum_held n_i.
    """

    def __init__(
        self, *, server_learning_rate: float = 1.0, key_binding: str = "node", **fedavg_kwargs: Any
    ) -> None:
        algorithm = ScaffoldRound(server_learning_rate, key_binding)
        super().__init__(algorithm, (SCAFFOLD_CONTROL_RECORD,), **fedavg_kwargs)
        self.server_learning_rate = algorithm.server_learning_rate
        self.key_binding = algorithm.binding.policy

    def __repr__(self) -> str:
        return f"SCAFFOLD(server_learning_rate={self.server_learning_rate!r})"

    def control(self) -> NDArrays:
        """Return the server control variate c (float64, model order; 0 at first)."""
        assert isinstance(self.algorithm, ScaffoldRound)
        return self.algorithm.control()
