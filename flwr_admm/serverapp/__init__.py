"""Flower Message-API side: the strategies for ``@app.main()`` ServerApps and ``strategy.start``.

`FedADMM` subclasses `flwr.serverapp.strategy.FedAvg` and runs the same numpy core
(`flwr_admm.core.ConsensusADMM`) as the legacy `flwr_admm.server.FedADMM`. Swap it in
for Flower's ``FedProx`` in one line; a FedProx-style ``@app.train()`` handler then
runs ADMM's local step (`flwr_admm.clientapp` has helpers for warm starts and
replies). `FedADMMClientDuals` keeps the duals on the nodes (the legacy protocol,
with acknowledgement, resync and rebuild sweep); its nodes run `flwr_admm.clientapp`.
The peer baselines `FedNova`, `SCAFFOLD` and `FedDyn` run the rounds of
`flwr_admm.rounds` on this API; `flwr_admm.clientapp.make_client_app` serves them.
"""

from flwr_admm.serverapp.client_duals import FedADMMClientDuals
from flwr_admm.serverapp.fedadmm import FedADMM
from flwr_admm.serverapp.peers import SCAFFOLD, FedDyn, FedNova

__all__ = ["SCAFFOLD", "FedADMM", "FedADMMClientDuals", "FedDyn", "FedNova"]
