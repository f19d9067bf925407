"""Legacy ``NumPyClient`` front end: `ADMMClient`, on the node rounds of `flwr_admm.node`."""

from flwr_admm.client.admm_client import ADMMClient

__all__ = ["ADMMClient"]
