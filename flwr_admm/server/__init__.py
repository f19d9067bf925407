"""Flower's legacy-API strategies (``ServerApp(server_fn=...)``), as in `flwr_admm.serverapp`.

Translators (`strategy.RoundStrategy`, Flower's legacy `FedAvg`) over the rounds of
`flwr_admm.rounds`, the same the Message-API classes run: `FedADMM`,
`FedADMMClientDuals`, `FedADMMClientDualsSecAgg` (client-held duals under SecAgg+; this
API only) and the peer baselines `FedNova`, `SCAFFOLD` and `FedDyn`. Their clients run
`flwr_admm.client.ADMMClient`.
"""

from flwr_admm.server.client_duals import FedADMMClientDuals
from flwr_admm.server.client_duals_secagg import FedADMMClientDualsSecAgg
from flwr_admm.server.fedadmm import FedADMM
from flwr_admm.server.peers import SCAFFOLD, FedDyn, FedNova

__all__ = [
    "SCAFFOLD",
    "FedADMM",
    "FedADMMClientDuals",
    "FedADMMClientDualsSecAgg",
    "FedDyn",
    "FedNova",
]
