"""Framework-free numpy core of inexact consensus ADMM (no `flwr` import).

`ConsensusADMM` holds the server state and runs a round; `steps` has the z-step and
dual step, `sums` the running sums, `settings` the checked settings, `schedules` the
rho rules, `regularizers` the prox of g, `linearized` the step-budget form,
`client_duals` the client-held-dual arithmetic, `acceleration` fast ADMM, `health`
the divergence watchdog, `types` the value types, reply checks and errors.
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
