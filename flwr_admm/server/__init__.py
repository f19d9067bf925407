"""Legacy `flwr.server.strategy` adapters: FedADMM, FedADMMClientDuals, FedNova.

Thin translations between Flower's FitIns/FitRes and the numpy core
(`flwr_admm.core`), plus checkpoint I/O and seeded client sampling.
"""

from flwr_admm.server.client_duals import FedADMMClientDuals
from flwr_admm.server.fedadmm import FedADMM
from flwr_admm.server.fednova import FedNova

__all__ = ["FedADMM", "FedADMMClientDuals", "FedNova"]
