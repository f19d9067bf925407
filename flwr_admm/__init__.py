"""flwr-admm: approximate (inexact) consensus ADMM for Flower.

`FedADMM` (strategy, server-held duals), `FedADMMClientDuals` (client-held duals:
the server keeps z and one running sum; `FedADMMClientDualsSecAgg` under Flower's
SecAgg+) + `ADMMClient` (penalized local loop), rho
schedules, server regularizers and numpy models; the math lives in `ConsensusADMM`.
The peer baselines `FedNova`, `SCAFFOLD` and `FedDyn` run with the same client.
Uplink compression (`StochasticQuantizer`, `TopK`) and local differential privacy
(`LocalDP`, `PrivacyLedger`) for FedADMM and, via `UplinkWrapper`, any legacy strategy.
Every strategy stops a diverging or stalled run with `RunDivergedError` (thresholds:
`HealthCheck`, the ``health`` keyword).
"""

from flwr_admm.client import ADMMClient, evaluate_model
from flwr_admm.core import (
    L1,
    L2,
    ConsensusADMM,
    Constant,
    Geometric,
    HealthCheck,
    LocalPlan,
    LocalResult,
    Regularizer,
    Reply,
    ResidualBalancing,
    RhoSchedule,
    RoundReport,
    RoundResiduals,
    RunDivergedError,
    StallIncrease,
    make_schedule,
    penalized_local_solve,
)
from flwr_admm.server import (
    SCAFFOLD,
    FedADMM,
    FedADMMClientDuals,
    FedADMMClientDualsSecAgg,
    FedDyn,
    FedNova,
)
from flwr_admm.uplink import (
    Compressor,
    LocalDP,
    PrivacyLedger,
    StochasticQuantizer,
    TopK,
    UplinkWrapper,
)

__all__ = [
    "L1",
    "L2",
    "SCAFFOLD",
    "ADMMClient",
    "Compressor",
    "ConsensusADMM",
    "Constant",
    "FedADMM",
    "FedADMMClientDuals",
    "FedADMMClientDualsSecAgg",
    "FedDyn",
    "FedNova",
    "Geometric",
    "HealthCheck",
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
    "RunDivergedError",
    "StallIncrease",
    "StochasticQuantizer",
    "TopK",
    "UplinkWrapper",
    "evaluate_model",
    "make_schedule",
    "penalized_local_solve",
]
__version__ = "0.1.0"
