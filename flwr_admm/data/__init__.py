"""Offline federated data sets (generated or shipped inside installed packages).

Tasks: ``seed-logreg``, ``synthetic`` (FedProx's Synthetic(alpha, beta)), ``digits``
(scikit-learn), ``credit`` (Lending Club loans split into three banks), ``mnist`` and
``cifar10`` (Flower Datasets' `FederatedDataset`, or an in-memory stand-in).
"""

from flwr_admm.data.base import (
    FederatedData,
    apply_standardizer,
    fit_standardizer,
    standardize_per_client,
)
from flwr_admm.data.credit import BANKS, credit_banks
from flwr_admm.data.digits import digits_federated
from flwr_admm.data.images import IMAGE_SETS, image_federated
from flwr_admm.data.partition import PARTITIONERS, PartitionSpec, partition_rows
from flwr_admm.data.registry import TASKS, Task, load_task, task_options
from flwr_admm.data.seed_logreg import seed_logreg
from flwr_admm.data.synthetic import fedprox_synthetic

__all__ = [
    "BANKS",
    "IMAGE_SETS",
    "PARTITIONERS",
    "TASKS",
    "FederatedData",
    "PartitionSpec",
    "Task",
    "apply_standardizer",
    "credit_banks",
    "digits_federated",
    "fedprox_synthetic",
    "fit_standardizer",
    "image_federated",
    "load_task",
    "partition_rows",
    "seed_logreg",
    "standardize_per_client",
    "task_options",
]
