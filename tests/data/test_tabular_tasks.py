"""The generated and shipped tabular tasks: seed-logreg, synthetic, digits and credit.

References: FedProx's Synthetic(alpha, beta) recipe (sizes lognormal(4, 2) + 50, feature
variances j^-1.2, u_k shifting every logit alike), scikit-learn's load_digits class
counts, the credit banks' target default rates and a refit of each bank's standardizer
on its raw Lending Club rows; every load is compared with a second load (determinism)
and with another seed.
"""

from __future__ import annotations

import numpy as np
import pytest
from task_checks import check_task as _check_task
from task_checks import label_shares as _label_shares
from task_checks import same as _same
from task_checks import skew as _skew

from flwr_admm.data import load_task
from flwr_admm.data.base import fit_standardizer
from flwr_admm.data.credit import BANKS, FEATURES, encode_loans, load_lending_club

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
