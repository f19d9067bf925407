"""MNIST and CIFAR-10 through ``flwr_datasets.FederatedDataset``, with an offline door.

Real runs: ``FederatedDataset(dataset=<hub id>, partitioners={"train": p}, seed=seed)``
downloads the data set from the Hugging Face Hub (``ylecun/mnist``,
``uoft-cs/cifar10``), shuffles every split with `seed`, and the partitioner `p`
(`flwr_admm.data.partition`) splits ``train`` among the clients; ``test`` becomes the
shared test set. `dataset` may also name any other `datasets.load_dataset` source
(e.g. ``"parquet"`` with ``load_kwargs={"data_files": {...}}``) with the same splits.

Offline / tests: pass an in-memory `datasets.DatasetDict` with ``train`` and ``test``
splits (or a single `Dataset`, whose seeded 20 % becomes ``test``). It goes through
the same steps: the seeded shuffle FederatedDataset applies, then the same partitioner.

Every image (8-bit pixels) is flattened to a float vector scaled to [0, 1]
(MNIST 784 features, CIFAR-10 3,072); each client holds out `client_test_fraction`
of its partition. Pixels share one fixed range, so per-client standardization is off
by default (``standardize=True`` turns it on). All clients' data are built in one
process: CIFAR-10 in float64 takes about 1.5 GB.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from flwr_admm.data.base import (
    FederatedData,
    FloatArray,
    LabelArray,
    assemble_clients,
    missing_extra,
)
from flwr_admm.data.partition import PartitionSpec, load_partitions

# task -> (hub id, image column, features, classes)
IMAGE_SETS: dict[str, tuple[str, str, int, int]] = {
    "mnist": ("ylecun/mnist", "image", 28 * 28, 10),
    "cifar10": ("uoft-cs/cifar10", "img", 32 * 32 * 3, 10),
}


def to_arrays(split: Any, image_column: str) -> tuple[FloatArray, LabelArray]:
    """Flatten a split's images to [0, 1] floats and return them with the labels."""
    if image_column not in split.column_names or "label" not in split.column_names:
        raise ValueError(
            f"dataset: needs columns {image_column!r} and 'label', got {split.column_names}"
        )
    table = split.with_format("numpy")[:]
    images = np.asarray(table[image_column])
    X = images.reshape(images.shape[0], -1).astype(np.float64) / 255.0
    return X, np.asarray(table["label"], dtype=np.int64)


def _from_hub(
    source: str, spec: PartitionSpec, seed: int, load_kwargs: dict[str, Any]
) -> tuple[list[Any], Any]:
    try:
        from flwr_datasets import FederatedDataset
    except ImportError as error:
        raise missing_extra("flwr-datasets", "the image tasks") from error

    built: list[Any] = []

    def attach(partitioner: Any) -> Callable[[int], Any]:
        fds = FederatedDataset(
            dataset=source,
            partitioners={"train": partitioner},
            shuffle=True,
            seed=seed,
            **load_kwargs,
        )
        built.append(fds)
        return lambda i: fds.load_partition(i, "train")

    parts = load_partitions(spec, seed, attach)
    return parts, built[-1].load_split("test")


def _in_memory(dataset: Any, spec: PartitionSpec, seed: int) -> tuple[list[Any], Any]:
    try:
        from datasets import Dataset, DatasetDict
    except ImportError as error:
        raise missing_extra("flwr-datasets", "the image tasks") from error

    if isinstance(dataset, Dataset):
        dataset = dataset.train_test_split(test_size=0.2, seed=seed)
    if not isinstance(dataset, DatasetDict) or not {"train", "test"} <= set(dataset):
        raise ValueError(
            "dataset: expected a hub id, a datasets.Dataset or a DatasetDict with "
            f"'train' and 'test' splits, got {type(dataset).__name__}"
        )
    dataset = dataset.shuffle(seed=seed)  # what FederatedDataset(shuffle=True) does

    def attach(partitioner: Any) -> Callable[[int], Any]:
        partitioner.dataset = dataset["train"]
        return partitioner.load_partition  # type: ignore[no-any-return]

    return load_partitions(spec, seed, attach), dataset["test"]


def image_federated(
    name: str,
    spec: PartitionSpec,
    *,
    seed: int = 42,
    dataset: Any = None,
    load_kwargs: dict[str, Any] | None = None,
    client_test_fraction: float = 0.2,
    standardize: bool = False,
) -> FederatedData:
    """Federated MNIST or CIFAR-10 (`name`), from the hub or from `dataset`."""
    if name not in IMAGE_SETS:
        raise ValueError(f"name: must be one of {sorted(IMAGE_SETS)}, got {name!r}")
    hub_id, image_column, n_features, _ = IMAGE_SETS[name]
    source = hub_id if dataset is None else dataset
    if isinstance(source, str):
        parts, test = _from_hub(source, spec, seed, dict(load_kwargs or {}))
    else:
        parts, test = _in_memory(source, spec, seed)
    arrays = [to_arrays(part, image_column) for part in parts]
    global_test = to_arrays(test, image_column)
    if global_test[0].shape[1] != n_features:
        raise ValueError(
            f"dataset: {name} images must flatten to {n_features} features, "
            f"got {global_test[0].shape[1]}"
        )
    return assemble_clients(
        arrays,
        seed=seed,
        test_fraction=client_test_fraction,
        standardize=standardize,
        global_test=global_test,
    )
