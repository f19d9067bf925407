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
from flwr_admm.core.health import HealthCheck
from flwr_admm.core.linearized import Linearized
from flwr_admm.core.regularizers import L1, L2
from flwr_admm.core.schedules import (
    Constant,
    ResidualBalancing,
    RhoSchedule,
)
from flwr_admm.core.types import RunDivergedError

__all__ = [
    "L1",
    "L2",
    "ConsensusADMM",
    "Constant",
    "HealthCheck",
    "Linearized",
    "ResidualBalancing",
    "RhoSchedule",
    "RunDivergedError",
]
