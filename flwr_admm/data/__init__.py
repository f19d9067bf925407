"""Offline federated data sets (generated or shipped inside installed packages).

Tasks: ``seed-logreg``, ``synthetic`` (FedProx's Synthetic(alpha, beta)), ``digits``
(scikit-learn), ``credit`` (Lending Club loans split into three banks), ``mnist`` and
``cifar10`` (Flower Datasets' `FederatedDataset`, or an in-memory stand-in).
"""

from flwr_admm.data.registry import Task, load_task

__all__ = ["Task", "load_task"]
