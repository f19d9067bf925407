"""Task loaders: shapes, determinism, partitioner wiring, standardization, credit banks."""

from __future__ import annotations

import numpy as np
import pytest
from standins import image_standin

from flwr_admm.core.local_solver import LocalPlan, penalized_local_solve
from flwr_admm.data import (
    BANKS,
    TASKS,
    FederatedData,
    PartitionSpec,
    fit_standardizer,
    load_task,
    partition_rows,
    task_options,
)
from flwr_admm.data.base import split_client, stratified_split
from flwr_admm.data.credit import FEATURES, encode_loans, load_lending_club
from flwr_admm.data.partition import load_partitions


def _same(a: FederatedData, b: FederatedData) -> bool:
    pairs = [
        (a.X, b.X),
        (a.y, b.y),
        (a.X_test or [], b.X_test or []),
        (a.y_test or [], b.y_test or []),
    ]
    return all(
        len(u) == len(v) and all(np.array_equal(p, q) for p, q in zip(u, v, strict=True))
        for u, v in pairs
    )


def _label_shares(data: FederatedData, n_classes: int) -> np.ndarray:
    counts = np.stack([np.bincount(y, minlength=n_classes) for y in data.y]).astype(float)
    return counts / counts.sum(axis=1, keepdims=True)


def _skew(data: FederatedData, n_classes: int) -> float:
    """Mean total-variation distance between client and pooled label distributions."""
    shares = _label_shares(data, n_classes)
    pooled = np.bincount(np.concatenate(data.y), minlength=n_classes) / sum(map(len, data.y))
    return float(np.mean(0.5 * np.abs(shares - pooled).sum(axis=1)))


def _check_task(task, n_features: int, n_classes: int) -> None:
    data = task.data
    model = task.make_model()
    assert model.n_features == n_features == data.num_features
    for X, y, Xt, yt in zip(data.X, data.y, data.X_test, data.y_test, strict=True):
        assert X.dtype == np.float64 and X.shape == (y.shape[0], n_features)
        assert Xt.shape == (yt.shape[0], n_features) and yt.shape[0] >= 1
        assert np.all(np.isfinite(X)) and np.all(np.isfinite(Xt))
        assert y.min() >= 0 and max(y.max(), yt.max()) < n_classes
        model.encode_labels(y)  # raises if a label is invalid for the model
        loss, _ = model.loss_and_grad(model.init_params(0), X, model.encode_labels(y))
        assert np.isfinite(loss)


def _fedavg_losses(task, rounds: int, clients: list[int] | None = None) -> list[float]:
    """Plain FedAvg with the task's defaults; the sample-weighted training loss per round."""
    data, model, cfg = task.data, task.make_model(), task.defaults
    plan = LocalPlan(
        learning_rate=cfg["learning_rate"],
        steps=cfg.get("local_steps"),
        epochs=cfg.get("local_epochs"),
        batch_size=cfg.get("batch_size"),
    )
    ids = clients if clients is not None else list(range(data.num_clients))
    weights = np.array([data.X[i].shape[0] for i in ids], dtype=float)
    weights /= weights.sum()
    labels = [model.encode_labels(data.y[i]) for i in ids]
    w = model.init_params(0)
    losses = []
    for r in range(rounds):
        local = [
            penalized_local_solve(
                model, w, data.X[i], labels[k], plan, rng=np.random.default_rng([r, i])
            ).params
            for k, i in enumerate(ids)
        ]
        w = [sum(a * p[j] for a, p in zip(weights, local, strict=True)) for j in range(len(w))]
        losses.append(
            sum(
                a * model.loss(w, data.X[i], labels[k])
                for k, (a, i) in enumerate(zip(weights, ids, strict=True))
            )
        )
    return losses


# ---------------------------------------------------------------- registry


def test_registry_lists_every_task_and_rejects_unknown_names() -> None:
    assert set(TASKS) == {"seed-logreg", "synthetic", "digits", "credit", "mnist", "cifar10"}
    with pytest.raises(ValueError, match="task: must be one of"):
        load_task("imagenet")
    with pytest.raises(ValueError, match=r"unknown option\(s\) \['partitioner'\]"):
        load_task("synthetic", partitioner="iid")
    with pytest.raises(ValueError, match="seed: must be an integer >= 0"):
        load_task("credit", seed=-1)
    assert task_options("digits") == {
        "partitioner": "iid",
        "dirichlet_alpha": 0.5,
        "num_clients": 10,
        "model": "softmax",
        "standardize": False,
        "l2": 1e-3,
    }
    assert {"dataset", "load_kwargs", "partitioner"} <= set(task_options("mnist"))


def test_bad_options_name_the_field() -> None:
    with pytest.raises(ValueError, match="partitioner: must be one of"):
        load_task("digits", partitioner="shard")
    with pytest.raises(ValueError, match="dirichlet_alpha: must be a finite number > 0"):
        load_task("digits", partitioner="dirichlet", dirichlet_alpha=0.0)
    with pytest.raises(ValueError, match="model: must be one of"):
        load_task("digits", model="cnn")
    with pytest.raises(ValueError, match="alpha: must be a finite number >= 0"):
        load_task("synthetic", alpha=-1.0)
    with pytest.raises(ValueError, match="num_clients: must be an integer >= 1"):
        load_task("synthetic", num_clients=0)


@pytest.mark.parametrize("name", ["seed-logreg", "synthetic", "digits", "credit"])
def test_defaults_build_a_local_plan(name: str) -> None:
    task = load_task(name, seed=0)
    cfg = task.defaults
    assert cfg["learning_rate"] > 0
    assert ("local_steps" in cfg) != ("local_epochs" in cfg)
    LocalPlan(
        learning_rate=cfg["learning_rate"],
        steps=cfg.get("local_steps"),
        epochs=cfg.get("local_epochs"),
        batch_size=cfg.get("batch_size"),
    )
    assert task.convex


@pytest.mark.parametrize(
    ("name", "options", "rounds", "clients", "factor"),
    [
        ("seed-logreg", {}, 5, None, 0.8),
        ("digits", {}, 5, None, 0.5),
        ("digits", {"model": "mlp"}, 5, None, 0.8),
        ("credit", {}, 5, None, 0.5),
        # the paper's FedAvg on Synthetic(1, 1) is noisy: ask for a clear, not a large, drop
        ("synthetic", {}, 3, [0, 2, 4, 6, 8, 10, 12, 14, 16, 18], 0.9),
    ],
)
def test_fedavg_makes_progress_with_the_defaults(name, options, rounds, clients, factor) -> None:
    task = load_task(name, seed=0, **options)
    model = task.make_model()
    data = task.data
    ids = clients if clients is not None else range(data.num_clients)
    n = np.array([data.X[i].shape[0] for i in ids], dtype=float)
    start = sum(
        a * model.loss(model.init_params(0), data.X[i], model.encode_labels(data.y[i]))
        for a, i in zip(n / n.sum(), ids, strict=True)
    )
    losses = _fedavg_losses(task, rounds, clients)
    assert np.all(np.isfinite(losses))
    assert losses[-1] < factor * start


# ---------------------------------------------------------------- seed-logreg


def test_seed_logreg_shapes_and_determinism() -> None:
    a, b, c = (load_task("seed-logreg", seed=s).data for s in (1, 1, 2))
    assert a.num_clients == 10 and all(X.shape == (500, 20) for X in a.X)
    assert set(np.unique(np.concatenate(a.y))) == {-1, 1}
    assert _same(a, b) and not _same(a, c)


# ---------------------------------------------------------------- synthetic


def test_synthetic_sizes_follow_the_formula() -> None:
    data = load_task("synthetic", seed=7).data
    sizes = np.random.default_rng(7).lognormal(4, 2, 30).astype(np.int64) + 50
    assert data.num_clients == 30
    for k, n in enumerate(sizes):
        assert data.X[k].shape[0] == int(0.9 * n)
        assert data.X_test[k].shape[0] == n - int(0.9 * n)
    assert sizes.max() > 5 * np.median(sizes)  # lognormal(4, 2): heavy-tailed users


def test_synthetic_shapes_labels_and_determinism() -> None:
    task = load_task("synthetic", seed=3)
    _check_task(task, 60, 10)
    assert task.defaults["local_epochs"] == 20 and task.defaults["batch_size"] == 10
    assert task.defaults["learning_rate"] == 0.01
    assert round(30 * task.defaults["fraction_fit"]) == 10 == task.defaults["min_fit_clients"]
    assert task.data.feature_mean is None  # raw features, as in the paper
    assert _same(task.data, load_task("synthetic", seed=3).data)
    assert not _same(task.data, load_task("synthetic", seed=4).data)
    assert not _same(task.data, load_task("synthetic", seed=3, beta=0.5).data)
    small = load_task("synthetic", seed=3, num_clients=5)
    assert small.data.num_clients == 5 and small.defaults["min_fit_clients"] == 5


def test_synthetic_feature_covariance_and_client_heterogeneity() -> None:
    data = load_task("synthetic", seed=0).data
    k = int(np.argmax([X.shape[0] for X in data.X]))
    X = np.vstack([data.X[k], data.X_test[k]])
    assert X.shape[0] > 500
    expected = np.arange(1, 61) ** -1.2
    np.testing.assert_allclose(X.var(axis=0), expected, rtol=0.2)
    # v_k ~ N(B_k, 1): client means differ by O(1), far more than sampling noise
    means = np.array([Xc.mean(axis=0) for Xc in data.X])
    assert np.median(np.abs(means - means.mean(axis=0))) > 0.4
    # beta = 0 and alpha = 0: B_k = u_k = 0, clients only differ through noise
    flat = load_task("synthetic", seed=0, alpha=0.0, beta=0.0).data
    assert np.std([Xc.mean() for Xc in flat.X]) < np.std([Xc.mean() for Xc in data.X])
    labels = np.concatenate(data.y)
    assert len(np.unique(labels)) >= 5


def test_synthetic_alpha_cannot_change_labels() -> None:
    """u_k shifts every logit of a row by the same amount, so argmax ignores it.

    W_k = u_k + Z_k and b_k = u_k + z_k give x W_k + b_k = u_k (1 + sum_j x_j) 1 + x Z_k
    + z_k: with the draws fixed, alpha (the spread of u_k) leaves every label unchanged.
    """
    a = load_task("synthetic", seed=3).data
    b = load_task("synthetic", seed=3, alpha=0.1).data
    assert _same(a, b)


# ---------------------------------------------------------------- digits


@pytest.fixture(scope="module")
def digits_tasks():
    return {
        "iid": load_task("digits", seed=0),
        "dirichlet": load_task("digits", seed=0, partitioner="dirichlet", dirichlet_alpha=0.1),
        "pathological": load_task("digits", seed=0, partitioner="pathological"),
    }


def test_digits_shapes_and_held_out_test(digits_tasks) -> None:
    task = digits_tasks["iid"]
    _check_task(task, 64, 10)
    data = task.data
    assert data.num_clients == 10
    rows = sum(X.shape[0] for X in data.X) + sum(X.shape[0] for X in data.X_test)
    assert rows + data.X_global_test.shape[0] == 1797
    # stratified: round(20 %) of every digit is in the shared test set
    from sklearn.datasets import load_digits

    per_class = np.bincount(load_digits().target)
    expected = np.round(0.2 * per_class).astype(int)
    np.testing.assert_array_equal(np.bincount(data.y_global_test), expected)
    assert data.X_global_test.shape == (expected.sum(), 64)
    assert 0.0 <= min(X.min() for X in data.X) and max(X.max() for X in data.X) <= 1.0
    # iid shares are balanced: client sizes within one row of each other before the split
    sizes = [X.shape[0] + Xt.shape[0] for X, Xt in zip(data.X, data.X_test, strict=True)]
    assert max(sizes) - min(sizes) <= 1


def test_digits_partitioners_skew_labels(digits_tasks) -> None:
    iid = _skew(digits_tasks["iid"].data, 10)
    dirichlet = _skew(digits_tasks["dirichlet"].data, 10)
    assert iid < 0.15
    assert dirichlet > 0.5 and dirichlet > 4 * iid
    # Dirichlet(0.1): most clients are dominated by a single class
    top = _label_shares(digits_tasks["dirichlet"].data, 10).max(axis=1)
    assert np.median(top) > 0.5
    assert (
        min(
            len(y) + len(yt)
            for y, yt in zip(
                digits_tasks["dirichlet"].data.y, digits_tasks["dirichlet"].data.y_test, strict=True
            )
        )
        >= 10
    )
    path = digits_tasks["pathological"].data
    for y, yt in zip(path.y, path.y_test, strict=True):
        assert len(np.unique(np.concatenate([y, yt]))) <= 2


def test_digits_determinism_and_seed_dependence(digits_tasks) -> None:
    for kind, task in digits_tasks.items():
        options = {"partitioner": kind}
        if kind == "dirichlet":
            options["dirichlet_alpha"] = 0.1
        again = load_task("digits", seed=0, **options).data
        other = load_task("digits", seed=1, **options).data
        assert _same(task.data, again), kind
        assert not _same(task.data, other), kind
        np.testing.assert_array_equal(task.data.X_global_test, again.X_global_test)


def test_digits_models_and_standardization() -> None:
    mlp = load_task("digits", seed=0, model="mlp")
    assert not mlp.convex and mlp.make_model().n_hidden == 32
    task = load_task("digits", seed=0, partitioner="pathological", standardize=True)
    data = task.data
    assert data.feature_mean is not None and data.feature_scale is not None
    for i, X in enumerate(data.X):
        np.testing.assert_allclose(X.mean(axis=0), 0.0, atol=1e-10)
        std = X.std(axis=0)
        assert np.all((np.abs(std - 1) < 1e-10) | (std < 1e-10))  # constant pixels stay 0
        view = data.client_view(i, data.X_global_test)
        np.testing.assert_allclose(
            view, (data.X_global_test - data.feature_mean[i]) / data.feature_scale[i]
        )
    # clients with different digits have different statistics
    assert not np.allclose(data.feature_mean[0], data.feature_mean[1])


@pytest.mark.parametrize("kind", ["iid", "dirichlet", "pathological"])
def test_partition_rows_cover_every_row_once_and_follow_the_seed(kind: str) -> None:
    labels = np.arange(400, dtype=np.int64) % 10
    spec = PartitionSpec(kind=kind, num_clients=8, dirichlet_alpha=0.5)
    parts = partition_rows(labels, spec, seed=0)
    assert len(parts) == 8
    rows = np.concatenate(parts)
    assert len(rows) == len(np.unique(rows))
    if kind != "pathological":  # a class no client drew is dropped there
        assert sorted(rows.tolist()) == list(range(400))
    again = partition_rows(labels, spec, seed=0)
    other = partition_rows(labels, spec, seed=1)
    assert all(np.array_equal(a, b) for a, b in zip(parts, again, strict=True))
    assert not all(np.array_equal(a, b) for a, b in zip(parts, other, strict=True))


def test_dirichlet_retries_with_derived_seeds() -> None:
    spec = PartitionSpec(kind="dirichlet", num_clients=2, dirichlet_alpha=0.1)
    seeds = []

    def attach(partitioner):
        seeds.append(partitioner._seed)
        if len(seeds) < 3:
            raise ValueError("The max number of attempts (10) was reached.")
        return lambda i: f"partition {i}"

    assert load_partitions(spec, 11, attach) == ["partition 0", "partition 1"]
    assert seeds == [11, 12, 13]
    with pytest.raises(ValueError, match="could not give every one of 200 clients"):
        load_task("digits", partitioner="dirichlet", dirichlet_alpha=0.05, num_clients=200)


# ---------------------------------------------------------------- credit


@pytest.fixture(scope="module")
def credit_task():
    return load_task("credit", seed=0)


def test_credit_banks_hit_the_target_default_rates(credit_task) -> None:
    data = credit_task.data
    assert data.num_clients == 3 == len(BANKS)
    rates = [np.concatenate([y, yt]).mean() for y, yt in zip(data.y, data.y_test, strict=True)]
    np.testing.assert_allclose(rates, [0.02, 0.08, 0.15], atol=0.005)
    # stratified split: train and test keep the bank's rate
    for y, yt, rate in zip(data.y, data.y_test, rates, strict=True):
        assert abs(y.mean() - rate) < 0.002 and abs(yt.mean() - rate) < 0.004
    sizes = [len(y) + len(yt) for y, yt in zip(data.y, data.y_test, strict=True)]
    assert sizes == [6106, 2690, 1061] and sum(sizes) == 9857
    for y, yt in zip(data.y, data.y_test, strict=True):
        assert abs(len(yt) / (len(y) + len(yt)) - 0.3) < 0.01


def test_credit_features_model_and_standardization(credit_task) -> None:
    _check_task(credit_task, len(FEATURES), 2)
    data = credit_task.data
    model = credit_task.make_model()
    assert model.fit_intercept and credit_task.convex
    raw_X, _ = encode_loans(load_lending_club())
    int_rate = FEATURES.index("int_rate")
    for i in range(3):
        X, Xt = data.X[i], data.X_test[i]
        mean, scale = data.feature_mean[i], data.feature_scale[i]
        np.testing.assert_allclose(X.mean(axis=0), 0.0, atol=1e-9)
        std = X.std(axis=0)
        assert np.all((np.abs(std - 1) < 1e-9) | (std < 1e-12))
        raw_train, raw_test = X * scale + mean, Xt * scale + mean
        # the statistics are the bank's own training statistics, applied unchanged to test
        refit_mean, refit_scale = fit_standardizer(raw_train)
        np.testing.assert_allclose(refit_mean, mean, rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(refit_scale, scale, rtol=1e-9)
        assert abs(Xt.mean(axis=0)).max() > 1e-3  # test rows are not re-centred
        # the raw rows are genuine encoded loans
        assert np.isin(raw_test[:, int_rate].round(6), raw_X[:, int_rate].round(6)).all()
    rates = [m[int_rate] for m in data.feature_mean]
    assert rates[0] < rates[1] < rates[2]  # banks differ in covariates, not only in labels


def test_credit_determinism_and_seed_dependence(credit_task) -> None:
    assert _same(credit_task.data, load_task("credit", seed=0).data)
    other = load_task("credit", seed=1).data
    assert not _same(credit_task.data, other)
    assert [len(y) for y in other.y] == [len(y) for y in credit_task.data.y]
    raw = load_task("credit", seed=0, standardize=False).data
    assert raw.feature_mean is None
    std = credit_task.data
    np.testing.assert_allclose(
        raw.X[0], std.X[0] * std.feature_scale[0] + std.feature_mean[0], atol=1e-9
    )


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


# ---------------------------------------------------------------- helpers


def test_standardizer_keeps_constant_columns_finite() -> None:
    X = np.array([[1.0, 5.0], [3.0, 5.0], [5.0, 5.0]])
    mean, scale = fit_standardizer(X)
    np.testing.assert_allclose(mean, [3.0, 5.0])
    np.testing.assert_allclose(scale, [np.sqrt(8 / 3), 1.0])
    with pytest.raises(ValueError, match="X: expected a non-empty 2-d array"):
        fit_standardizer(np.zeros((0, 2)))


def test_splits_are_seeded_and_disjoint() -> None:
    y = np.array([0] * 90 + [1] * 10)
    train, test = stratified_split(y, 0.3, np.random.default_rng(0))
    assert len(np.intersect1d(train, test)) == 0 and len(train) + len(test) == 100
    assert np.bincount(y[test]).tolist() == [27, 3]
    again = stratified_split(y, 0.3, np.random.default_rng(0))
    np.testing.assert_array_equal(test, again[1])
    X = np.arange(20.0).reshape(10, 2)
    Xtr, ytr, Xte, yte = split_client(X, np.arange(10), 0.2, np.random.default_rng(0))
    assert Xtr.shape == (8, 2) and Xte.shape == (2, 2)
    assert sorted(np.concatenate([ytr, yte]).tolist()) == list(range(10))
    with pytest.raises(ValueError, match=r"test_fraction: must lie in \(0, 1\)"):
        split_client(X, np.arange(10), 1.0, np.random.default_rng(0))
