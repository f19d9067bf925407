"""Legacy `NumPyClient` side: `ADMMClient` and the client half of client-held duals."""

from flwr_admm.client.admm_client import ADMMClient
from flwr_admm.client.evaluation import evaluate_model

__all__ = ["ADMMClient", "evaluate_model"]
