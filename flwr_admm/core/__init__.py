"""Framework-free numpy core of inexact consensus ADMM (no `flwr` import).

`ConsensusADMM` holds the server state and runs a round (begin, absorb, finish),
`settings` the checked settings it is built from (`ConsensusSettings`);
`schedules` (rho rules), `regularizers` (prox of g), `local_solver` (the penalized
local loop), `client_duals` (client-held-dual arithmetic), `acceleration` (fast
ADMM), `kernels` (one-pass array updates), `types` (value types and errors),
`validation` (reply checks), `health` (the divergence watchdog every strategy's round
layer feeds).
"""

from flwr_admm.core.consensus import ConsensusADMM
from flwr_admm.core.health import DEFAULT_HEALTH, HealthCheck, RunHealth
from flwr_admm.core.local_solver import LocalPlan, LocalResult, penalized_local_solve
from flwr_admm.core.regularizers import L1, L2, Regularizer
from flwr_admm.core.schedules import (
    Constant,
    Geometric,
    ResidualBalancing,
    RhoSchedule,
    RoundResiduals,
    StallIncrease,
    make_schedule,
)
from flwr_admm.core.settings import ConsensusSettings
from flwr_admm.core.types import (
    Arrays,
    NonFiniteReplyError,
    Reply,
    RoundReport,
    RunDivergedError,
)

__all__ = [
    "DEFAULT_HEALTH",
    "L1",
    "L2",
    "Arrays",
    "ConsensusADMM",
    "ConsensusSettings",
    "Constant",
    "Geometric",
    "HealthCheck",
    "LocalPlan",
    "LocalResult",
    "NonFiniteReplyError",
    "Regularizer",
    "Reply",
    "ResidualBalancing",
    "RhoSchedule",
    "RoundReport",
    "RoundResiduals",
    "RunDivergedError",
    "RunHealth",
    "StallIncrease",
    "make_schedule",
    "penalized_local_solve",
]
