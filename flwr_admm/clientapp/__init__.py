"""Flower Message-API front end: helpers for ``@app.train()`` handlers, a ready ClientApp.

`ADMMTrainStep` (and, as functions, `received_arrays` and `build_reply`) serves a
user's own handler on the node rounds of `flwr_admm.node`; `make_client_app` serves
the legacy ``client_fn`` of an `ADMMClient` (the project's numpy models) through train
and evaluate handlers, for every strategy of `flwr_admm.serverapp`;
`received_control` and `build_scaffold_reply` serve a user's own SCAFFOLD handler.
"""

from flwr_admm.clientapp.app import make_client_app
from flwr_admm.clientapp.peers import build_scaffold_reply, received_control
from flwr_admm.clientapp.step import ADMMTrainStep, build_reply, received_arrays

__all__ = [
    "ADMMTrainStep",
    "build_reply",
    "build_scaffold_reply",
    "make_client_app",
    "received_arrays",
    "received_control",
]
