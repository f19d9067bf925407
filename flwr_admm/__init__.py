"""flwr-admm: approximate (inexact) consensus ADMM for Flower.

The strategies here are Flower's Message API ones (``@app.main()`` ServerApps,
``strategy.start``; `flwr_admm.serverapp`): `FedADMM` (server-held duals),
`FedADMMClientDuals` (the duals on the nodes) and the peer baselines `FedNova`,
`SCAFFOLD` and `FedDyn`; their nodes run `flwr_admm.clientapp` (`ADMMTrainStep`,
`make_client_app`) or `flwr_admm.torch.TorchADMM`. The legacy API's classes
(``ServerApp(server_fn=...)``, `NumPyClient`) are `flwr_admm.server.FedADMM` etc. and
`flwr_admm.client.ADMMClient`, as Flower keeps `flwr.server.strategy` beside
`flwr.serverapp.strategy`. The math lives in `ConsensusADMM` (`flwr_admm.core`); every
`FedADMM(form=Linearized(...))` is the linearized (Scaffnew) form with its server steps;
every strategy stops a diverging or stalled run with `RunDivergedError` (thresholds:
`HealthCheck`, the ``health`` keyword).
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
