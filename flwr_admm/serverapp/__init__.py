"""Flower's Message-API strategies, for ``@app.main()`` ServerApps and ``strategy.start``.

Translators (`strategy.RoundStrategy`, Flower's `FedAvg`) over the rounds of
`flwr_admm.rounds`: `FedADMM` (server-held duals, a drop-in for Flower's ``FedProx``;
its docstring states the round), `FedADMMClientDuals` (the duals on the nodes) and the
peer baselines `FedNova`, `SCAFFOLD` and `FedDyn`. Their nodes run `flwr_admm.clientapp`
(`ADMMTrainStep` for a user's handler, `make_client_app` for the numpy models) or
`flwr_admm.torch.TorchADMM`; a stock FedProx handler runs too, its dual held at 0.
`testing` runs a strategy against a ClientApp in process.
"""

from flwr_admm.serverapp.client_duals import FedADMMClientDuals
from flwr_admm.serverapp.fedadmm import FedADMM
from flwr_admm.serverapp.peers import SCAFFOLD, FedDyn, FedNova

__all__ = ["SCAFFOLD", "FedADMM", "FedADMMClientDuals", "FedDyn", "FedNova"]
