"""Legacy `flwr.server.strategy` adapters: FedADMM, FedADMMClientDuals and the baselines.

The baselines are FedNova, SCAFFOLD and FedDyn (their rounds: `flwr_admm.rounds`).

Thin translations between Flower's FitIns/FitRes and the rounds of `flwr_admm.rounds`:
FedADMM and FedADMMClientDuals are keyword front-ends over one translator
(`flwr_admm.server.strategy.RoundStrategy`) driving their round
(`flwr_admm.rounds.fedadmm`, `flwr_admm.rounds.client_duals`) through the round layer
(`flwr_admm.rounds.layer`: seeded sampling, reply order, duplicate keys, checkpoints).
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
