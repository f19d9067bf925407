"""Numpy models against finite differences, sklearn's log-loss and sklearn's fits."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from scipy.optimize import minimize
from sklearn.linear_model import LogisticRegression as SkLogisticRegression
from sklearn.metrics import log_loss

from flwr_admm.models import MLP, LogisticRegression, Model, SoftmaxRegression


def _data(n: int, d: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).normal(size=(n, d))


def _random_params(model: Model, seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.normal(scale=0.5, size=shape) for shape in model.shapes]


def _finite_difference(model: Model, params, X, y, h: float = 1e-6) -> list[np.ndarray]:
    """Central differences of model.loss, one coordinate at a time."""
    grads = []
    for k, p in enumerate(params):
        g = np.zeros_like(p)
        for idx in np.ndindex(p.shape):
            plus = [q.copy() for q in params]
            minus = [q.copy() for q in params]
            plus[k][idx] += h
            minus[k][idx] -= h
            g[idx] = (model.loss(plus, X, y) - model.loss(minus, X, y)) / (2 * h)
        grads.append(g)
    return grads


def _assert_grad_matches(model: Model, params, X, y) -> None:
    _, grads = model.loss_and_grad(params, X, y)
    numeric = _finite_difference(model, params, X, y)
    assert [g.shape for g in grads] == [tuple(s) for s in model.shapes]
    for g, n in zip(grads, numeric, strict=True):
        np.testing.assert_allclose(g, n, rtol=1e-6, atol=1e-8)


# ----------------------------------------------------------------- gradients


@pytest.mark.parametrize("fit_intercept", [True, False])
@pytest.mark.parametrize("labels", ["01", "pm1"])
def test_logistic_gradient_matches_finite_differences(fit_intercept: bool, labels: str) -> None:
    X = _data(40, 5, seed=1)
    t = (np.random.default_rng(2).random(40) < 0.5).astype(np.int64)
    raw = t if labels == "01" else 2 * t - 1
    model = LogisticRegression(5, l2=0.3, fit_intercept=fit_intercept)
    y = model.encode_labels(raw)
    np.testing.assert_array_equal(y, t)
    _assert_grad_matches(model, _random_params(model, 3), X, y)


def test_softmax_gradient_matches_finite_differences() -> None:
    X = _data(30, 4, seed=4)
    y = np.random.default_rng(5).integers(0, 3, size=30)
    model = SoftmaxRegression(4, 3, l2=0.2)
    _assert_grad_matches(model, _random_params(model, 6), X, model.encode_labels(y))


def test_mlp_gradient_matches_finite_differences() -> None:
    X = _data(25, 3, seed=7)
    y = np.random.default_rng(8).integers(0, 4, size=25)
    model = MLP(3, 4, n_hidden=5, l2=0.1, seed=9)
    params = [p + 0.1 * q for p, q in zip(model.get(), _random_params(model, 10), strict=True)]
    _assert_grad_matches(model, params, X, model.encode_labels(y))


def test_mlp_init_is_seeded_and_not_zero() -> None:
    a, b = MLP(3, 2, n_hidden=4, seed=1), MLP(3, 2, n_hidden=4, seed=1)
    c = MLP(3, 2, n_hidden=4, seed=2)
    for p, q in zip(a.get(), b.get(), strict=True):
        np.testing.assert_array_equal(p, q)
    assert not np.allclose(a.get()[0], c.get()[0])
    assert np.abs(a.get()[0]).max() > 0
    limit = np.sqrt(6.0 / (3 + 4))
    assert np.abs(a.get()[0]).max() <= limit


# ---------------------------------------------------------------- loss values


@pytest.mark.parametrize("labels", ["01", "pm1"])
def test_logistic_loss_equals_sklearn_log_loss_plus_ridge(labels: str) -> None:
    X = _data(50, 4, seed=11)
    t = (np.random.default_rng(12).random(50) < 0.4).astype(np.int64)
    raw = t if labels == "01" else 2 * t - 1
    model = LogisticRegression(4, l2=0.7)
    coef, intercept = np.array([0.5, -1.0, 0.25, 2.0]), np.array([-0.3])
    p1 = 1.0 / (1.0 + np.exp(-(X @ coef + intercept[0])))
    expected = log_loss(raw, p1, labels=sorted(set(raw.tolist()))) + 0.35 * coef @ coef
    loss = model.loss([coef, intercept], X, model.encode_labels(raw))
    np.testing.assert_allclose(loss, expected, rtol=1e-12)
    proba = model.predict_proba([coef, intercept], X)
    np.testing.assert_allclose(proba[:, 1], p1, rtol=1e-12)
    np.testing.assert_allclose(proba.sum(axis=1), 1.0, rtol=1e-15)


def test_softmax_loss_equals_sklearn_log_loss_plus_ridge() -> None:
    X = _data(60, 3, seed=13)
    y = np.random.default_rng(14).integers(0, 4, size=60)
    model = SoftmaxRegression(3, 4, l2=0.5)
    W, b = _random_params(model, 15)
    logits = X @ W + b
    proba = np.exp(logits) / np.exp(logits).sum(axis=1, keepdims=True)
    expected = log_loss(y, proba, labels=[0, 1, 2, 3]) + 0.25 * np.sum(W**2)
    np.testing.assert_allclose(model.loss([W, b], X, y), expected, rtol=1e-12)
    np.testing.assert_allclose(model.predict_proba([W, b], X), proba, rtol=1e-12)


def test_mlp_loss_equals_sklearn_log_loss_plus_ridge() -> None:
    X = _data(20, 3, seed=16)
    y = np.random.default_rng(17).integers(0, 3, size=20)
    model = MLP(3, 3, n_hidden=6, l2=0.4)
    W1, b1, W2, b2 = _random_params(model, 18)
    logits = np.tanh(X @ W1 + b1) @ W2 + b2
    proba = np.exp(logits) / np.exp(logits).sum(axis=1, keepdims=True)
    expected = log_loss(y, proba, labels=[0, 1, 2]) + 0.2 * (np.sum(W1**2) + np.sum(W2**2))
    np.testing.assert_allclose(model.loss([W1, b1, W2, b2], X, y), expected, rtol=1e-12)


# ------------------------------------------------------- minimizers vs sklearn


def _lbfgs(model: Model, X, y) -> list[np.ndarray]:
    shapes = model.shapes
    sizes = [int(np.prod(s)) for s in shapes]

    def unflatten(theta: np.ndarray) -> list[np.ndarray]:
        parts = np.split(theta, np.cumsum(sizes)[:-1])
        return [p.reshape(s) for p, s in zip(parts, shapes, strict=True)]

    def fun(theta: np.ndarray) -> tuple[float, np.ndarray]:
        loss, grads = model.loss_and_grad(unflatten(theta), X, y)
        return loss, np.concatenate([g.ravel() for g in grads])

    result = minimize(
        fun,
        np.zeros(sum(sizes)),
        jac=True,
        method="L-BFGS-B",
        options={"gtol": 1e-12, "ftol": 1e-15, "maxiter": 5000},
    )
    return unflatten(result.x)


@pytest.mark.parametrize("fit_intercept", [True, False])
def test_logistic_minimizer_equals_sklearn(fit_intercept: bool) -> None:
    n, d, l2 = 200, 5, 0.05
    X = _data(n, d, seed=21)
    theta = np.array([1.0, -2.0, 0.5, 0.0, 1.5])
    y_pm = np.where(X @ theta + 0.3 + np.random.default_rng(22).normal(size=n) > 0, 1, -1)
    model = LogisticRegression(d, l2=l2, fit_intercept=fit_intercept)
    ours = _lbfgs(model, X, model.encode_labels(y_pm))
    sk = SkLogisticRegression(
        C=1.0 / (n * l2), fit_intercept=fit_intercept, tol=1e-12, max_iter=10_000
    ).fit(X, y_pm)
    np.testing.assert_allclose(ours[0], sk.coef_[0], rtol=1e-5, atol=1e-7)
    if fit_intercept:
        np.testing.assert_allclose(ours[1], sk.intercept_, rtol=1e-5, atol=1e-7)


def test_softmax_minimizer_equals_sklearn() -> None:
    n, d, k, l2 = 240, 4, 3, 0.02
    X = _data(n, d, seed=23)
    scores = X @ np.random.default_rng(24).normal(size=(d, k))
    y = np.argmax(scores + np.random.default_rng(25).gumbel(size=(n, k)), axis=1)
    model = SoftmaxRegression(d, k, l2=l2)
    W, b = _lbfgs(model, X, model.encode_labels(y))
    sk = SkLogisticRegression(C=1.0 / (n * l2), tol=1e-12, max_iter=10_000).fit(X, y)
    np.testing.assert_allclose(W, sk.coef_.T, rtol=1e-5, atol=1e-7)
    # the intercept is unpenalized and defined up to a common shift of its entries
    np.testing.assert_allclose(b - b.mean(), sk.intercept_ - sk.intercept_.mean(), atol=1e-6)
    np.testing.assert_allclose(model.predict_proba([W, b], X), sk.predict_proba(X), atol=1e-7)


# ------------------------------------------------------------ numerical safety


def _stable_log1pexp_neg(m: np.ndarray) -> np.ndarray:
    """log(1 + exp(-m)), branch by branch so neither branch overflows."""
    out = np.empty_like(m)
    pos = m > 0
    out[pos] = np.log1p(np.exp(-m[pos]))
    out[~pos] = -m[~pos] + np.log1p(np.exp(m[~pos]))
    return out


def test_logistic_huge_margins_no_warning_and_exact_values() -> None:
    X = _data(30, 3, seed=31) * 1e6
    y = (np.random.default_rng(32).random(30) < 0.5).astype(np.int64)
    coef, intercept = np.array([1.0, -1.0, 0.5]), np.array([2.0])
    model = LogisticRegression(3)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        loss, grads = model.loss_and_grad([coef, intercept], X, y)
        proba = model.predict_proba([coef, intercept], X)
    margin = X @ coef + 2.0
    signed = np.where(y == 1, margin, -margin)
    np.testing.assert_allclose(loss, _stable_log1pexp_neg(signed).mean(), rtol=1e-12)
    assert loss > 1e4  # about half the samples are misclassified by ~1e6
    # sigma(margin) saturates at exactly 0 or 1: gradient = X^T (step(margin) - y) / n
    np.testing.assert_allclose(grads[0], X.T @ ((margin > 0) - y) / 30, rtol=1e-12)
    assert np.all(np.isfinite(proba))


def test_softmax_and_mlp_huge_inputs_no_warning() -> None:
    X = _data(20, 3, seed=33) * 1e6
    y = np.random.default_rng(34).integers(0, 3, size=20)
    soft = SoftmaxRegression(3, 3)
    W, b = _random_params(soft, 35)
    mlp = MLP(3, 3, n_hidden=4)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        loss, grads = soft.loss_and_grad([W, b], X, y)
        proba = soft.predict_proba([W, b], X)
        mlp_loss, mlp_grads = mlp.loss_and_grad(mlp.get(), X, y)
        mlp_proba = mlp.predict_proba(mlp.get(), X)
    logits = X @ W + b
    top = logits.max(axis=1)
    # logsumexp equals the max when the gaps are ~1e6: loss = mean(max - logit_y)
    np.testing.assert_allclose(loss, np.mean(top - logits[np.arange(20), y]), rtol=1e-12)
    for value in (mlp_loss, *grads, *mlp_grads, proba, mlp_proba):
        assert np.all(np.isfinite(value))
    np.testing.assert_allclose(proba.sum(axis=1), 1.0)


# ----------------------------------------------------------------- bad input


@pytest.mark.parametrize(
    "model",
    [LogisticRegression(3), SoftmaxRegression(3, 4), MLP(3, 4, n_hidden=2)],
    ids=["logistic", "softmax", "mlp"],
)
def test_check_data_names_the_field(model: Model) -> None:
    good = _data(5, 3, seed=41)
    np.testing.assert_array_equal(model.check_data(good), good)
    with pytest.raises(ValueError, match=r"X_val: expected shape \(n_samples, 3\)"):
        model.check_data(_data(5, 4, seed=41), field="X_val")
    with pytest.raises(ValueError, match=r"^X: expected shape"):
        model.check_data(np.ones(3))
    for bad_value in (np.nan, np.inf, -np.inf):
        bad = good.copy()
        bad[2, 1] = bad_value
        with pytest.raises(ValueError, match=r"^X: contains NaN or inf"):
            model.check_data(bad)
    with pytest.raises(ValueError, match=r"^X: must hold at least one sample"):
        model.check_data(np.zeros((0, 3)))


def test_binary_labels_outside_classes_are_rejected() -> None:
    model = LogisticRegression(2)
    np.testing.assert_array_equal(model.encode_labels(np.array([-1, 1, 1])), [0, 1, 1])
    np.testing.assert_array_equal(model.encode_labels(np.array([0.0, 1.0])), [0, 1])
    for bad in ([0, 1, 2], [-1, 0, 1], [0, 0.5], [3, 4]):
        with pytest.raises(ValueError, match=r"^y: binary labels must be"):
            model.encode_labels(np.array(bad))
    with pytest.raises(ValueError, match=r"^y: expected a 1-d label vector"):
        model.encode_labels(np.zeros((2, 2), dtype=int))


@pytest.mark.parametrize(
    "model", [SoftmaxRegression(2, 10), MLP(2, 10, n_hidden=2)], ids=["softmax", "mlp"]
)
def test_multiclass_labels_outside_classes_are_rejected(model: Model) -> None:
    np.testing.assert_array_equal(model.encode_labels(np.arange(10)), np.arange(10))
    with pytest.raises(ValueError, match=r"^y: labels must lie in 0\.\.9, found \[10\]"):
        model.encode_labels(np.array([0, 3, 10]))
    with pytest.raises(ValueError, match=r"^y: labels must lie in 0\.\.9, found \[-1\]"):
        model.encode_labels(np.array([-1, 0, 9]))
    with pytest.raises(ValueError, match=r"^y: labels must be integers"):
        model.encode_labels(np.array([0.0, 1.5]))
    with pytest.raises(ValueError, match=r"^y: expected a 1-d label vector"):
        model.encode_labels(np.zeros((3, 1), dtype=int))


@pytest.mark.parametrize(
    ("factory", "field"),
    [
        (lambda: LogisticRegression(0), "n_features"),
        (lambda: LogisticRegression(2.5), "n_features"),
        (lambda: LogisticRegression(True), "n_features"),
        (lambda: LogisticRegression(3, l2=-0.1), "l2"),
        (lambda: LogisticRegression(3, l2=np.nan), "l2"),
        (lambda: LogisticRegression(3, l2=np.inf), "l2"),
        (lambda: SoftmaxRegression(-1, 3), "n_features"),
        (lambda: SoftmaxRegression(3, 1), "n_classes"),
        (lambda: SoftmaxRegression(3, 3, l2=-1.0), "l2"),
        (lambda: MLP(0, 3), "n_features"),
        (lambda: MLP(3, 1), "n_classes"),
        (lambda: MLP(3, 3, n_hidden=0), "n_hidden"),
        (lambda: MLP(3, 3, l2=np.nan), "l2"),
    ],
)
def test_bad_hyperparameters_name_the_field(factory, field: str) -> None:
    with pytest.raises(ValueError, match=rf"^{field}: "):
        factory()


def test_shapes_and_set_checks() -> None:
    assert LogisticRegression(4).shapes == [(4,), (1,)]
    assert LogisticRegression(4, fit_intercept=False).shapes == [(4,)]
    assert SoftmaxRegression(4, 3).shapes == [(4, 3), (3,)]
    assert MLP(4, 3, n_hidden=5).shapes == [(4, 5), (5,), (5, 3), (3,)]
    model = LogisticRegression(4)
    with pytest.raises(ValueError, match=r"params\[0\]: expected shape \(4,\), got \(3,\)"):
        model.set([np.zeros(3), np.zeros(1)])
    with pytest.raises(ValueError, match=r"params: expected 2 arrays"):
        model.set([np.zeros(4)])
    model.set([np.arange(4.0), np.array([1.0])])
    got = model.get()
    got[0][0] = 99.0
    np.testing.assert_array_equal(model.get()[0], [0.0, 1.0, 2.0, 3.0])


def test_logistic_loss_and_grad_with_raw_pm1_labels_is_consistent() -> None:
    """The class accepts {-1, +1} labels and loss_and_grad's loss treats -1 as negative.

    Given raw {-1, +1} labels, loss_and_grad must either refuse them (ValueError naming y)
    or return the gradient of the loss it returns, i.e. the same as with encoded labels.
    """
    X = np.array([[1.0, 0.0], [0.0, 1.0]])
    model = LogisticRegression(2, fit_intercept=False)
    w = [np.zeros(2)]
    raw = np.array([-1, 1])
    # by hand at w = 0: sigma = 1/2, targets (0, 1): grad = X^T (1/2 - t) / 2 = (1/4, -1/4)
    try:
        loss, grads = model.loss_and_grad(w, X, raw)
    except ValueError as error:
        assert str(error).startswith("y")
        return
    np.testing.assert_allclose(loss, np.log(2.0), rtol=1e-15)
    np.testing.assert_allclose(grads[0], [0.25, -0.25], rtol=1e-15)
