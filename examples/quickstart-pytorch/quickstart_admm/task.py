"""The quickstart's model, data, training loop and run settings (offline: sklearn digits).

Data: scikit-learn's bundled 8x8 digits as 3x32x32 images (pixel / 16, each pixel a
4x4 block, repeated to 3 channels, normalized (x - 0.5) / 0.5). A stratified 20% is
the central test set (fixed seed: the same rows in every run); the rest is split over
the nodes by flwr-datasets' `DirichletPartitioner` on the label, and each node keeps
80% of its partition to train and 20% to validate. Every ClientApp process rebuilds
the split, so every seed is fixed.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields
from functools import cache
from typing import Any

import numpy as np
import torch
from numpy.typing import NDArray
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

STRATEGIES = (
    "fedavg",
    "fedprox",
    "fedadmm",
    "fedadmm-prox",
    "fedadmm-linearized",
    "fedadmm-linearized-convex",
    "fedadmm-client-duals",
    "fedadmm-client-duals-prox",
    "fedadmm-client-duals-linearized",
    "scaffold",
    "feddyn",
)
# their server state would treat BatchNorm statistics as weights
REFUSE_BATCH_NORM = (
    "fedadmm-client-duals",
    "fedadmm-client-duals-prox",
    "fedadmm-client-duals-linearized",
    "scaffold",
    "feddyn",
)
HANDLERS = ("torchadmm", "fedprox")
OPTIMIZERS = ("sgd", "adam")
ADAM_LR = 1e-3
SPLIT_SEED = 42  # the central test set and the nodes' train/validation splits
TEST_FRACTION = 0.2
VAL_FRACTION = 0.2
MIN_PARTITION_SIZE = 10


class Net(nn.Module):
    """The quickstart's CNN (PyTorch's 60-minute blitz), BatchNorm after conv1 if asked."""

    def __init__(self, batch_norm: bool = False) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 6, 5)
        self.norm1: nn.Module = nn.BatchNorm2d(6) if batch_norm else nn.Identity()
        self.pool = nn.MaxPool2d(2, 2)
        self.conv2 = nn.Conv2d(6, 16, 5)
        self.fc1 = nn.Linear(16 * 5 * 5, 120)
        self.fc2 = nn.Linear(120, 84)
        self.fc3 = nn.Linear(84, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Return the logits of a batch of 3x32x32 images."""
        x = self.pool(torch.relu(self.norm1(self.conv1(x))))
        x = self.pool(torch.relu(self.conv2(x)))
        x = torch.flatten(x, 1)
        x = torch.relu(self.fc1(x))
        x = torch.relu(self.fc2(x))
        return self.fc3(x)  # type: ignore[no-any-return]


# ------------------------------------------------------------------------- settings
@dataclass(frozen=True)
class Settings:
    """The run config (pyproject.toml's ``[tool.flwr.app.config]``), checked."""

    num_server_rounds: int
    local_epochs: int
    batch_size: int
    learning_rate: float
    momentum: float
    optimizer: str
    batch_norm: bool
    strategy: str
    handler: str
    proximal_mu: float
    feddyn_alpha: float
    dual_step: str | float
    num_partitions: int
    fraction_train: float
    identify_nodes: bool
    dirichlet_alpha: float
    seed: int
    output_dir: str

    @classmethod
    def from_run_config(cls, run_config: Mapping[str, Any]) -> Settings:
        """Read every key (hyphenated names); ValueError naming a missing or bad one."""
        values: dict[str, Any] = {}
        for item in fields(cls):
            key = item.name.replace("_", "-")
            if key not in run_config:
                raise ValueError(
                    f"run config {key!r}: missing (flwr run reads it from pyproject.toml)"
                )
            values[item.name] = run_config[key]
        settings = cls(**values)
        settings.check()
        return settings

    def check(self) -> None:
        """Raise ValueError naming the first field out of its range."""
        for key in ("num_server_rounds", "local_epochs", "batch_size", "num_partitions"):
            _integer(key, getattr(self, key), low=1)
        _integer("seed", self.seed, low=0)
        for key in ("learning_rate", "proximal_mu", "feddyn_alpha", "dirichlet_alpha"):
            _positive(key, getattr(self, key))
        _positive("fraction_train", self.fraction_train)
        if self.fraction_train > 1:
            raise ValueError(f"fraction-train: must be in (0, 1], got {self.fraction_train!r}")
        if isinstance(self.momentum, bool) or not isinstance(self.momentum, int | float):
            raise ValueError(f"momentum: must be a number in [0, 1), got {self.momentum!r}")
        if not 0 <= self.momentum < 1:
            raise ValueError(f"momentum: must be a number in [0, 1), got {self.momentum!r}")
        for key, allowed in (
            ("optimizer", OPTIMIZERS),
            ("strategy", STRATEGIES),
            ("handler", HANDLERS),
        ):
            if getattr(self, key) not in allowed:
                raise ValueError(
                    f"{key}: must be one of {list(allowed)}, got {getattr(self, key)!r}"
                )
        if self.dual_step != "adaptive" and (
            isinstance(self.dual_step, bool)
            or not isinstance(self.dual_step, int | float)
            or not 0 < self.dual_step <= 1
        ):
            raise ValueError(
                f'dual-step: must be "adaptive" or a number in (0, 1], got {self.dual_step!r}'
            )
        for key in ("batch_norm", "identify_nodes"):
            if not isinstance(getattr(self, key), bool):
                name = key.replace("_", "-")
                raise ValueError(f"{name}: must be true or false, got {getattr(self, key)!r}")
        if self.batch_norm and self.strategy in REFUSE_BATCH_NORM:
            raise ValueError(
                f"batch-norm: not supported with strategy {self.strategy!r} (it would treat "
                "BatchNorm statistics as weights); use fedavg, fedprox or fedadmm"
            )
        if not isinstance(self.output_dir, str) or not self.output_dir:
            raise ValueError(f"output-dir: must be a non-empty path, got {self.output_dir!r}")

    @property
    def run_name(self) -> str:
        """``<strategy>[-<handler>]-seed<seed>``: the handler only where it matters."""
        stock = self.strategy in ("fedadmm", "fedadmm-prox") and self.handler != "torchadmm"
        handler = f"-{self.handler}" if stock else ""
        return f"{self.strategy}{handler}-seed{self.seed}"


def _integer(key: str, value: Any, *, low: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ValueError(f"{key.replace('_', '-')}: must be an integer >= {low}, got {value!r}")


def _positive(key: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"{key.replace('_', '-')}: must be a finite number > 0, got {value!r}")
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"{key.replace('_', '-')}: must be a finite number > 0, got {value!r}")


# ----------------------------------------------------------------------------- data
@cache
def digits() -> tuple[NDArray[np.float32], NDArray[np.int64]]:
    """Return every digit as a normalized 3x32x32 image, and the labels."""
    bunch = load_digits()
    pixels = bunch.images / 16.0  # (n, 8, 8) in [0, 1]
    large = np.kron(pixels, np.ones((4, 4)))  # (n, 32, 32): each pixel a 4x4 block
    images = np.repeat(large[:, None], 3, axis=1)  # (n, 3, 32, 32)
    return ((images - 0.5) / 0.5).astype(np.float32), bunch.target.astype(np.int64)


@cache
def central_split() -> tuple[NDArray[np.int64], NDArray[np.int64]]:
    """Return (federated rows, central test rows): a stratified 20% held out."""
    _, labels = digits()
    rows = np.arange(len(labels))
    federated, test = train_test_split(
        rows, test_size=TEST_FRACTION, stratify=labels, random_state=SPLIT_SEED
    )
    return np.sort(federated), np.sort(test)


@cache
def partitioner(num_partitions: int, alpha: float, seed: int) -> Any:
    """Return the Dirichlet(alpha) label split of the federated rows over the nodes."""
    # Imported here: only ClientApps partition, and `datasets` takes seconds to import.
    import datasets
    from flwr_datasets.partitioner import DirichletPartitioner

    _, labels = digits()
    rows, _ = central_split()
    split = DirichletPartitioner(
        num_partitions=num_partitions,
        partition_by="label",
        alpha=alpha,
        seed=seed,
        min_partition_size=MIN_PARTITION_SIZE,
    )
    split.dataset = datasets.Dataset.from_dict({"row": rows, "label": labels[rows]})
    return split


def node_rows(
    partition_id: int, num_partitions: int, alpha: float, seed: int
) -> tuple[NDArray[np.int64], NDArray[np.int64]]:
    """Return (train rows, validation rows) of a node: 80/20 of its partition."""
    partition = partitioner(num_partitions, alpha, seed).load_partition(partition_id)
    halves = partition.train_test_split(test_size=VAL_FRACTION, seed=SPLIT_SEED)
    return tuple(  # type: ignore[return-value]
        np.asarray(halves[name].with_format("numpy")["row"], dtype=np.int64)
        for name in ("train", "test")
    )


def tensors(rows: NDArray[np.int64]) -> TensorDataset:
    """Return the images and labels of `rows`."""
    images, labels = digits()
    return TensorDataset(torch.from_numpy(images[rows]), torch.from_numpy(labels[rows]))


def central_test_loader(batch_size: int = 256) -> DataLoader[Any]:
    """Return the central test set (the server's `evaluate_fn`)."""
    _, test = central_split()
    return DataLoader(tensors(test), batch_size=batch_size)


def node_loaders(
    settings: Settings, partition_id: int, server_round: int
) -> tuple[DataLoader[Any], DataLoader[Any]]:
    """Return (train, validation) loaders; the shuffle is seeded per (seed, round, node)."""
    train_rows, val_rows = node_rows(
        partition_id, settings.num_partitions, settings.dirichlet_alpha, settings.seed
    )
    generator = torch.Generator().manual_seed(round_seed(settings.seed, server_round, partition_id))
    train = DataLoader(
        tensors(train_rows), batch_size=settings.batch_size, shuffle=True, generator=generator
    )
    return train, DataLoader(tensors(val_rows), batch_size=settings.batch_size)


def round_seed(seed: int, server_round: int, partition_id: int) -> int:
    """Return one integer seed for (run seed, round, partition)."""
    return int(np.random.SeedSequence([seed, server_round, partition_id]).generate_state(1)[0])


# ------------------------------------------------------------------ training, testing
def initial_model(settings: Settings) -> Net:
    """Return the global model at round 0, seeded by the run's seed."""
    torch.manual_seed(settings.seed)
    return Net(settings.batch_norm)


def make_optimizer(model: nn.Module, settings: Settings) -> torch.optim.Optimizer:
    """Return the user's optimizer: SGD(lr, momentum) or Adam(lr 1e-3)."""
    if settings.optimizer == "adam":
        return torch.optim.Adam(model.parameters(), lr=ADAM_LR)
    return torch.optim.SGD(
        model.parameters(), lr=settings.learning_rate, momentum=settings.momentum
    )


def train(
    model: nn.Module,
    loader: DataLoader[Any],
    epochs: int,
    optimizer: torch.optim.Optimizer,
    *,
    penalty: Callable[[], torch.Tensor] | None = None,
    before_step: Callable[[], None] | None = None,
    after_step: Callable[[], None] | None = None,
) -> tuple[float, int]:
    """Train `epochs` epochs; return (mean cross-entropy of the batches, optimizer steps).

    The strategies' local terms plug in: `penalty` is added to the loss, `before_step`
    runs between ``backward`` and ``optimizer.step()`` (gradient corrections) and
    `after_step` after it (proximal steps).
    """
    criterion = nn.CrossEntropyLoss()
    batch_norm = any(isinstance(m, nn.BatchNorm2d) for m in model.modules())
    model.train()
    total, steps = 0.0, 0
    for _ in range(epochs):
        for images, labels in loader:
            if batch_norm and len(labels) < 2:
                continue  # BatchNorm cannot train on a batch of one
            optimizer.zero_grad()
            loss = criterion(model(images), labels)
            total += float(loss.item())
            if penalty is not None:
                loss = loss + penalty()
            loss.backward()  # type: ignore[no-untyped-call]
            if before_step is not None:
                before_step()
            optimizer.step()
            if after_step is not None:
                after_step()
            steps += 1
    return total / max(steps, 1), steps


def test(model: nn.Module, loader: DataLoader[Any]) -> tuple[float, float]:
    """Return (mean cross-entropy, accuracy) of the model on the loader's examples."""
    criterion = nn.CrossEntropyLoss(reduction="sum")
    model.eval()
    loss, correct, count = 0.0, 0, 0
    with torch.no_grad():
        for images, labels in loader:
            logits = model(images)
            loss += float(criterion(logits, labels).item())
            correct += int((logits.argmax(dim=1) == labels).sum().item())
            count += len(labels)
    return loss / count, correct / count
