"""The image tasks mnist and cifar10 on small in-memory stand-ins (no download).

Reference: the same stand-in written to parquet files and loaded through Flower
Datasets' FederatedDataset, which must give the same clients row for row; shapes,
pixel scaling and label skew are checked against the stand-in's known sizes and classes.
"""

from __future__ import annotations

import numpy as np
import pytest
from standins import image_standin
from task_checks import check_task as _check_task
from task_checks import same as _same
from task_checks import skew as _skew

from flwr_admm.data import load_task

# ---------------------------------------------------------------- mnist / cifar10


@pytest.fixture(scope="module")
def mnist_standin():
    return image_standin((28, 28), "image")


def test_mnist_in_memory_pipeline(mnist_standin) -> None:
    task = load_task(
        "mnist",
        seed=0,
        dataset=mnist_standin,
        partitioner="dirichlet",
        dirichlet_alpha=0.1,
        num_clients=5,
    )
    _check_task(task, 784, 10)
    data = task.data
    assert data.num_clients == 5 and data.X_global_test.shape == (60, 784)
    assert sum(len(y) + len(yt) for y, yt in zip(data.y, data.y_test, strict=True)) == 300
    assert 0.0 <= min(X.min() for X in data.X) and max(X.max() for X in data.X) <= 1.0
    assert max(X.max() for X in data.X) > 0.9  # scaled by 255, not squashed
    assert _skew(data, 10) > 0.4
    assert _same(
        data,
        load_task(
            "mnist",
            seed=0,
            dataset=mnist_standin,
            partitioner="dirichlet",
            dirichlet_alpha=0.1,
            num_clients=5,
        ).data,
    )
    assert not _same(
        data,
        load_task(
            "mnist",
            seed=1,
            dataset=mnist_standin,
            partitioner="dirichlet",
            dirichlet_alpha=0.1,
            num_clients=5,
        ).data,
    )
    mlp = load_task("mnist", seed=0, dataset=mnist_standin, model="mlp", num_clients=3)
    assert not mlp.convex and mlp.make_model().n_features == 784


def test_mnist_in_memory_matches_federated_dataset(mnist_standin, tmp_path, monkeypatch) -> None:
    """The offline door and FederatedDataset (on local parquet files) agree row for row."""
    import datasets.config
    import flwr_datasets.common.telemetry as telemetry

    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(telemetry, "FLWR_TELEMETRY_ENABLED", "0")
    files = {}
    for split, table in mnist_standin.items():
        files[split] = str(tmp_path / f"{split}.parquet")
        table.to_parquet(files[split])
    options = {"partitioner": "pathological", "num_clients": 4}
    via_fds = load_task(
        "mnist",
        seed=5,
        dataset="parquet",
        load_kwargs={"data_files": files, "cache_dir": str(tmp_path / "cache")},
        **options,
    ).data
    in_memory = load_task("mnist", seed=5, dataset=mnist_standin, **options).data
    assert _same(via_fds, in_memory)
    np.testing.assert_array_equal(via_fds.X_global_test, in_memory.X_global_test)
    for y in via_fds.y:
        assert len(np.unique(y)) <= 2


def test_cifar10_in_memory_pipeline() -> None:
    standin = image_standin((32, 32, 3), "img", n_train=200)
    task = load_task("cifar10", seed=0, dataset=standin, partitioner="iid", num_clients=4)
    _check_task(task, 3072, 10)
    assert task.data.X_global_test.shape == (40, 3072)
    assert _skew(task.data, 10) < 0.25
    single = load_task("cifar10", seed=0, dataset=standin["train"], num_clients=4).data
    assert single.X_global_test.shape == (40, 3072)  # a lone Dataset: seeded 20 % test split
    with pytest.raises(ValueError, match="needs columns 'img' and 'label'"):
        load_task(
            "cifar10",
            seed=0,
            dataset=image_standin((32, 32, 3), "image", n_train=20),
            num_clients=2,
        )
    with pytest.raises(ValueError, match="must flatten to 3072 features"):
        load_task(
            "cifar10", seed=0, dataset=image_standin((28, 28), "img", n_train=20), num_clients=2
        )
