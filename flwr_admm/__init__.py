"""flwr-admm: approximate (inexact) consensus ADMM for Flower.

`FedADMM` (strategy, server-held duals), `FedADMMClientDuals` (client-held duals:
the server keeps z and one running sum) + `ADMMClient` (penalized local loop), rho
schedules, server regularizers and numpy models; the math lives in `ConsensusADMM`.
Uplink compression (`StochasticQuantizer`, `TopK`) and local differential privacy
(`LocalDP`, `PrivacyLedger`) for FedADMM and, via `UplinkWrapper`, any legacy strategy.
"""

from flwr_admm.client import ADMMClient, evaluate_model
from flwr_admm.client_duals import FedADMMClientDuals
from flwr_admm.compression import Compressor, StochasticQuantizer, TopK
from flwr_admm.consensus import ConsensusADMM, Reply, RoundReport
from flwr_admm.fednova import FedNova
from flwr_admm.local_solver import LocalPlan, LocalResult, penalized_local_solve
from flwr_admm.privacy import LocalDP, PrivacyLedger
from flwr_admm.regularizers import L1, L2, Regularizer
from flwr_admm.schedules import (
    Constant,
    Geometric,
    ResidualBalancing,
    RhoSchedule,
    RoundResiduals,
    StallIncrease,
    make_schedule,
)
from flwr_admm.strategy import FedADMM
from flwr_admm.wrappers import UplinkWrapper

__all__ = [
    "L1",
    "L2",
    "ADMMClient",
    "Compressor",
    "ConsensusADMM",
    "Constant",
    "FedADMM",
    "FedADMMClientDuals",
    "FedNova",
    "Geometric",
    "LocalDP",
    "LocalPlan",
    "LocalResult",
    "PrivacyLedger",
    "Regularizer",
    "Reply",
    "ResidualBalancing",
    "RhoSchedule",
    "RoundReport",
    "RoundResiduals",
    "StallIncrease",
    "StochasticQuantizer",
    "TopK",
    "UplinkWrapper",
    "evaluate_model",
    "make_schedule",
    "penalized_local_solve",
]
__version__ = "0.1.0"
