"""Label partitioning with Flower Datasets' partitioners, deterministic given a seed.

``partitioner`` is one of

- ``"iid"``: `IidPartitioner`, equal random shares;
- ``"dirichlet"``: `DirichletPartitioner(partition_by="label", alpha)`: for every class
  a share vector p ~ Dir(alpha 1_N) splits that class's rows among the N clients
  (alpha -> 0: each class lives on few clients; alpha -> inf: IID);
- ``"pathological"``: `PathologicalPartitioner(num_classes_per_partition=2)`: each
  client holds rows of at most two classes (McMahan et al.'s shards).

The Dirichlet draw is repeated (inside the partitioner) until every client holds at
least `min_partition_size` rows; if it still fails, the whole partitioner is rebuilt
with the derived seeds ``seed + 1, seed + 2, ...`` in turn, so the outcome is a pure
function of the seed. Flower Datasets is imported lazily: it costs about a second.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
from numpy.typing import NDArray

from flwr_admm.data.base import missing_extra

if TYPE_CHECKING:
    from datasets import Dataset
    from flwr_datasets.partitioner import Partitioner

PARTITIONERS = ("iid", "dirichlet", "pathological")
SEED_RETRIES = 5


@dataclass(frozen=True)
class PartitionSpec:
    """Which partitioner, and its parameters, validated on construction."""

    kind: str = "iid"
    num_clients: int = 10
    dirichlet_alpha: float = 0.5
    min_partition_size: int = 10
    classes_per_client: int = 2

    def __post_init__(self) -> None:
        if self.kind not in PARTITIONERS:
            raise ValueError(f"partitioner: must be one of {list(PARTITIONERS)}, got {self.kind!r}")
        for name in ("num_clients", "min_partition_size", "classes_per_client"):
            value = getattr(self, name)
            if isinstance(value, bool) or int(value) != value or value < 1:
                raise ValueError(f"{name}: must be an integer >= 1, got {value!r}")
        alpha = self.dirichlet_alpha
        if isinstance(alpha, bool) or not (math.isfinite(alpha) and alpha > 0):
            raise ValueError(f"dirichlet_alpha: must be a finite number > 0, got {alpha!r}")

    def build(self, seed: int) -> Partitioner:
        """Return a fresh, unassigned Flower Datasets partitioner for this spec."""
        try:
            from flwr_datasets.partitioner import (
                DirichletPartitioner,
                IidPartitioner,
                PathologicalPartitioner,
            )
        except ImportError as error:
            raise missing_extra("flwr-datasets", "partitioning") from error

        if self.kind == "iid":
            return IidPartitioner(num_partitions=self.num_clients)
        if self.kind == "dirichlet":
            return DirichletPartitioner(
                num_partitions=self.num_clients,
                partition_by="label",
                alpha=float(self.dirichlet_alpha),
                min_partition_size=self.min_partition_size,
                self_balancing=False,
                seed=seed,
            )
        return PathologicalPartitioner(
            num_partitions=self.num_clients,
            partition_by="label",
            num_classes_per_partition=self.classes_per_client,
            class_assignment_mode="random",
            seed=seed,
        )


def load_partitions(
    spec: PartitionSpec,
    seed: int,
    attach: Callable[[Partitioner], Callable[[int], Dataset]],
) -> list[Dataset]:
    """Partition with `spec`; `attach(partitioner)` returns a partition loader.

    `attach` gives the partitioner its data (``p.dataset = ds`` for in-memory data,
    or a `FederatedDataset` built around it) and returns ``partition_id -> Dataset``.
    Only the Dirichlet partitioner is retried with derived seeds.
    """
    retries = SEED_RETRIES if spec.kind == "dirichlet" else 1
    failure: ValueError | None = None
    for attempt in range(retries):
        partitioner = spec.build(seed + attempt)
        try:
            with warnings.catch_warnings():
                # the Dirichlet partitioner warns on every internal re-draw
                warnings.simplefilter("ignore", UserWarning)
                load = attach(partitioner)
                return [load(i) for i in range(spec.num_clients)]
        except ValueError as err:
            failure = err
    raise ValueError(
        f"partitioner: {spec.kind!r} could not give every one of {spec.num_clients} "
        f"clients >= {spec.min_partition_size} rows with seeds {seed}..."
        f"{seed + retries - 1} (lower num_clients or raise dirichlet_alpha): {failure}"
    )


def partition_in_memory(dataset: Dataset, spec: PartitionSpec, seed: int) -> list[Dataset]:
    """Partition an in-memory `datasets.Dataset` with a ``label`` column."""

    def attach(partitioner: Any) -> Callable[[int], Dataset]:
        partitioner.dataset = dataset
        return partitioner.load_partition  # type: ignore[no-any-return]

    return load_partitions(spec, seed, attach)


def partition_rows(
    labels: NDArray[np.int64], spec: PartitionSpec, seed: int
) -> list[NDArray[np.int64]]:
    """Row indices of each client: the partitioner runs on a (row, label) `Dataset`.

    The rows are shuffled with `seed` first, as ``FederatedDataset(shuffle=True)`` does
    (`IidPartitioner` cuts contiguous shards). Only the labels travel through Arrow;
    the features stay in numpy untouched.
    """
    try:
        from datasets import Dataset
    except ImportError as error:
        raise missing_extra("flwr-datasets", "partitioning") from error

    order = np.random.default_rng(seed).permutation(labels.shape[0]).astype(np.int64)
    table = Dataset.from_dict({"row": order, "label": labels[order]})
    parts = partition_in_memory(table, spec, seed)
    return [np.asarray(part["row"], dtype=np.int64) for part in parts]
