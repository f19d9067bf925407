"""Flower Message-API client side: helpers for ``@app.train()`` handlers, a ready ClientApp.

`ADMMTrainStep` (and, as functions, `received_arrays` and `build_reply`; `read_rho`
and `warm_start` in `flwr_admm.clientapp.step`) serves a user's own handler;
`make_client_app` wraps the legacy ``client_fn`` of an `ADMMClient` (the project's
numpy models) into a ClientApp with train and evaluate handlers (also under the
Message-API `SCAFFOLD` / `FedDyn`); `received_control` and `build_scaffold_reply`
serve a user's own SCAFFOLD handler.
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
