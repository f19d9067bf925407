"""Legacy `NumPyClient` side: `ADMMClient` and the client half of client-held duals."""

from flwr_admm.client.admm_client import ADMMClient

__all__ = ["ADMMClient"]
