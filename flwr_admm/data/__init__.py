"""Offline federated data sets (generated or shipped inside installed packages)."""

from flwr_admm.data.registry import TASKS, Task, load_task
from flwr_admm.data.seed_logreg import FederatedData, seed_logreg

__all__ = ["TASKS", "FederatedData", "Task", "load_task", "seed_logreg"]
