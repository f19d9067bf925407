"""Framework-free numpy core of inexact consensus ADMM (no `flwr` import).

`ConsensusADMM` (`consensus`) holds the server state and runs a round in its general
form; `steps` has the z-step and dual step, `sums` the running sums, `kernels` the
in-place passes, `settings` the checked settings, `schedules` the rho and dual step rules,
`regularizers` the prox of g, `tensor_policy` which tensors are consensus variables,
`linearized` the step-budget form and `start_momentum` its momentum start,
`client_duals` the client-held-dual arithmetic, `secure_sum` SecAgg+'s exact sums,
`local_solver` the clients' penalized loop, `persistence` and `snapshot` checkpoints,
`health` the divergence watchdog, `types` the value types, reply checks and errors.
"""

from flwr_admm.core.consensus import ConsensusADMM
from flwr_admm.core.health import HealthCheck
from flwr_admm.core.linearized import Linearized
from flwr_admm.core.regularizers import L1, L2
from flwr_admm.core.schedules import (
    AdaptiveDualStep,
    Constant,
    ResidualBalancing,
    RhoSchedule,
)
from flwr_admm.core.types import RunDivergedError

__all__ = [
    "L1",
    "L2",
    "AdaptiveDualStep",
    "ConsensusADMM",
    "Constant",
    "HealthCheck",
    "Linearized",
    "ResidualBalancing",
    "RhoSchedule",
    "RunDivergedError",
]
