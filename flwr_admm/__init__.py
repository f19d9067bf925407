"""flwr-admm: inexact consensus ADMM for Flower.

The strategies are Flower's Message-API ones (``@app.main()`` ServerApps,
``strategy.start``; `flwr_admm.serverapp`): `FedADMM` (server-held duals; its docstring
states the round), `FedADMMClientDuals` (the duals on the nodes) and the peer baselines
`FedNova`, `SCAFFOLD` and `FedDyn`; their nodes run `flwr_admm.clientapp` or
`flwr_admm.torch.TorchADMM`. The legacy API's classes (``ServerApp(server_fn=...)``,
`NumPyClient`) are in `flwr_admm.server` and `flwr_admm.client`, as Flower keeps
`flwr.server.strategy` beside `flwr.serverapp.strategy`. Exported with them: the option
values of `flwr_admm.options`, `Linearized` (FedADMM's ``form``), `HealthCheck` (the
``health`` keyword) and `RunDivergedError`, which every strategy raises to stop a
diverging or stalled run. The math is `flwr_admm.core` (no `flwr` import).
"""

from flwr_admm.core import HealthCheck, Linearized, RunDivergedError
from flwr_admm.options import Checkpointing, ClientPolicy, Convergence, Uplink
from flwr_admm.serverapp import SCAFFOLD, FedADMM, FedADMMClientDuals, FedDyn, FedNova

__all__ = [
    "SCAFFOLD",
    "Checkpointing",
    "ClientPolicy",
    "Convergence",
    "FedADMM",
    "FedADMMClientDuals",
    "FedDyn",
    "FedNova",
    "HealthCheck",
    "Linearized",
    "RunDivergedError",
    "Uplink",
]
__version__ = "0.1.0"
