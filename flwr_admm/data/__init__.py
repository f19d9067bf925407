"""Offline federated data sets (generated or shipped inside installed packages)."""

from flwr_admm.data.seed_logreg import FederatedData, seed_logreg

__all__ = ["FederatedData", "seed_logreg"]
