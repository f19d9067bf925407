"""Legacy `flwr.server.strategy` adapters: FedADMM, FedADMMClientDuals and the baselines.

The baselines are FedNova, SCAFFOLD and FedDyn (their rounds: `flwr_admm.rounds`).

Thin translations between Flower's FitIns/FitRes and the numpy core
(`flwr_admm.core`). FedADMM and FedADMMClientDuals share one round skeleton
(`flwr_admm.server.base.ConsensusStrategy`: seeded sampling, reply order, duplicate
keys, checkpoints) and override only its hooks.
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
