"""The penalized local loop on a tiny least-squares model with closed-form answers."""

from __future__ import annotations

import numpy as np
import pytest

from flwr_admm.core.local_solver import LocalPlan, penalized_local_solve
from flwr_admm.models import Model


class LeastSquares(Model):
    """f(w) = 1/2 ||X w - y||^2 (a sum, not a mean), one parameter array of shape (d,)."""

    def __init__(self, d: int) -> None:
        self.d = d
        self.seen: list[np.ndarray] = []  # rows of X passed to loss_and_grad, per call
        super().__init__()

    @property
    def shapes(self) -> list[tuple[int, ...]]:
        return [(self.d,)]

    @property
    def n_features(self) -> int:
        return self.d

    def loss_and_grad(self, params, X, y):
        self.seen.append(X)
        residual = X @ params[0] - y
        return 0.5 * float(residual @ residual), [X.T @ residual]

    def predict_proba(self, params, X):
        raise NotImplementedError

    def encode_labels(self, y):
        return np.asarray(y)


A = np.array([[1.0, 2.0], [0.0, 1.0], [1.0, -1.0]])
B = np.array([1.0, 2.0, -1.0])
V = np.array([0.5, -0.5])
W0 = np.array([1.0, 1.0])


def _grad(w: np.ndarray) -> np.ndarray:
    return A.T @ (A @ w - B)


def test_gradient_step_hand_checked() -> None:
    # grad f(w0) = A^T (A w0 - b) with A w0 - b = (3-1, 1-2, 0+1) = (2, -1, 1)
    # -> A^T (2, -1, 1) = (2 + 1, 4 - 1 - 1) = (3, 2)
    np.testing.assert_allclose(_grad(W0), [3.0, 2.0])
    lr, rho = 0.1, 2.0
    # w1 = w0 - lr (g + rho (w0 - v)) = (1, 1) - 0.1 ((3, 2) + 2 (0.5, 1.5)) = (0.6, 0.5)
    result = penalized_local_solve(
        LeastSquares(2),
        [W0],
        A,
        B,
        LocalPlan(lr, steps=1, prox_step="gradient"),
        center=[V],
        rho=rho,
    )
    np.testing.assert_allclose(result.params[0], [0.6, 0.5], rtol=1e-14)
    assert result.steps == 1
    # reported norm is of the penalized gradient at w0: ||(4, 5)||
    np.testing.assert_allclose(result.grad_norm, np.sqrt(41.0), rtol=1e-14)
    # reported loss is f at the final w on the full data: A w1 - b = (0.6, -1.5, 1.1)
    np.testing.assert_allclose(result.loss, 0.5 * (0.36 + 2.25 + 1.21), rtol=1e-14)


def test_exact_step_hand_checked() -> None:
    lr, rho = 0.1, 2.0
    # w1 = (w0 - lr g + lr rho v) / (1 + lr rho)
    #    = ((1, 1) - (0.3, 0.2) + (0.1, -0.1)) / 1.2 = (0.8, 0.7) / 1.2
    result = penalized_local_solve(
        LeastSquares(2),
        [W0],
        A,
        B,
        LocalPlan(lr, steps=1, prox_step="exact"),
        center=[V],
        rho=rho,
    )
    np.testing.assert_allclose(result.params[0], [0.8 / 1.2, 0.7 / 1.2], rtol=1e-14)


@pytest.mark.parametrize("prox_step", ["gradient", "exact"])
def test_several_steps_follow_the_recursion(prox_step: str) -> None:
    lr, rho, steps = 0.05, 3.0, 7
    w = W0.copy()
    for _ in range(steps):
        if prox_step == "gradient":
            w = w - lr * (_grad(w) + rho * (w - V))
        else:
            w = (w - lr * _grad(w) + lr * rho * V) / (1.0 + lr * rho)
    result = penalized_local_solve(
        LeastSquares(2),
        [W0],
        A,
        B,
        LocalPlan(lr, steps=steps, prox_step=prox_step),
        center=[V],
        rho=rho,
    )
    np.testing.assert_allclose(result.params[0], w, rtol=1e-13)
    assert result.steps == steps


@pytest.mark.parametrize("prox_step", ["gradient", "exact"])
@pytest.mark.parametrize(("center", "rho"), [(None, 5.0), ([V], 0.0)])
def test_no_penalty_is_plain_gradient_descent(prox_step: str, center, rho: float) -> None:
    lr = 0.1
    w = W0.copy()
    for _ in range(3):
        w = w - lr * _grad(w)
    plan = LocalPlan(lr, steps=3, prox_step=prox_step)
    result = penalized_local_solve(LeastSquares(2), [W0], A, B, plan, center=center, rho=rho)
    np.testing.assert_allclose(result.params[0], w, rtol=1e-14)


def test_start_is_not_modified() -> None:
    start = [W0.copy()]
    penalized_local_solve(
        LeastSquares(2), start, A, B, LocalPlan(0.1, steps=2), center=[V], rho=1.0
    )
    np.testing.assert_array_equal(start[0], W0)


def test_exact_is_stable_for_huge_rho_where_gradient_diverges() -> None:
    lr, rho, steps = 0.1, 1e6, 3
    # gradient: w - v is multiplied by about (1 - lr rho) = -99999 per step
    gradient = penalized_local_solve(
        LeastSquares(2),
        [W0],
        A,
        B,
        LocalPlan(lr, steps=steps, prox_step="gradient"),
        center=[V],
        rho=rho,
    )
    assert np.linalg.norm(gradient.params[0] - V) > 1e12
    exact = penalized_local_solve(
        LeastSquares(2),
        [W0],
        A,
        B,
        LocalPlan(lr, steps=steps, prox_step="exact"),
        center=[V],
        rho=rho,
    )
    # each exact step contracts the distance to the penalized argmin by about
    # 1 / (1 + lr rho) = 1e-5; that argmin sits O(1/rho) away from v
    argmin = np.linalg.solve(A.T @ A + rho * np.eye(2), A.T @ B + rho * V)
    assert np.linalg.norm(exact.params[0] - V) < 1e-4
    np.testing.assert_allclose(exact.params[0], argmin, rtol=1e-12)


def test_many_exact_steps_reach_the_penalized_argmin() -> None:
    rng = np.random.default_rng(3)
    X, y = rng.normal(size=(30, 4)), rng.normal(size=30)
    v, rho = rng.normal(size=4), 2.5
    lipschitz = np.linalg.eigvalsh(X.T @ X).max()
    plan = LocalPlan(1.0 / lipschitz, steps=3000, prox_step="exact")
    result = penalized_local_solve(LeastSquares(4), [np.zeros(4)], X, y, plan, center=[v], rho=rho)
    # (X^T X + rho I) w = X^T y + rho v
    argmin = np.linalg.solve(X.T @ X + rho * np.eye(4), X.T @ y + rho * v)
    np.testing.assert_allclose(result.params[0], argmin, rtol=1e-10)


def test_grad_tol_stops_early_at_the_first_small_penalized_gradient() -> None:
    rng = np.random.default_rng(4)
    X, y = rng.normal(size=(20, 3)), rng.normal(size=20)
    v, rho, lr, tol = rng.normal(size=3), 1.0, 0.02, 1e-3
    # reference loop: stop before the step whose penalized gradient is <= tol
    w, expected_steps = np.zeros(3), None
    for k in range(500):
        g = X.T @ (X @ w - y) + rho * (w - v)
        if np.linalg.norm(g) <= tol:
            expected_steps = k
            break
        w = (w - lr * X.T @ (X @ w - y) + lr * rho * v) / (1.0 + lr * rho)
    assert expected_steps is not None and 5 < expected_steps < 500
    plan = LocalPlan(lr, steps=500, prox_step="exact", grad_tol=tol)
    result = penalized_local_solve(LeastSquares(3), [np.zeros(3)], X, y, plan, center=[v], rho=rho)
    assert result.steps == expected_steps
    np.testing.assert_allclose(result.params[0], w, rtol=1e-12)
    assert result.grad_norm <= tol
    np.testing.assert_allclose(
        result.grad_norm, np.linalg.norm(X.T @ (X @ w - y) + rho * (w - v)), rtol=1e-10
    )
    full = penalized_local_solve(
        LeastSquares(3),
        [np.zeros(3)],
        X,
        y,
        LocalPlan(lr, steps=500, prox_step="exact"),
        center=[v],
        rho=rho,
    )
    assert full.steps == 500


class AffineLeastSquares(Model):
    """f(W, b) = 1/2 ||X W + b - Y||^2 with Y = y one-hot: two tensors of different shapes."""

    @property
    def shapes(self) -> list[tuple[int, ...]]:
        return [(2, 3), (3,)]

    @property
    def n_features(self) -> int:
        return 2

    def loss_and_grad(self, params, X, y):
        W, b = params
        residual = X @ W + b - np.eye(3)[y]
        return 0.5 * float(np.vdot(residual, residual)), [X.T @ residual, residual.sum(0)]

    def predict_proba(self, params, X):
        raise NotImplementedError

    def encode_labels(self, y):
        return np.asarray(y)


@pytest.mark.parametrize("prox_step", ["gradient", "exact"])
def test_several_tensors_follow_the_recursion_each(prox_step: str) -> None:
    rng = np.random.default_rng(6)
    X, y = rng.normal(size=(8, 2)), rng.integers(0, 3, size=8)
    model = AffineLeastSquares()
    start = [rng.normal(size=(2, 3)), rng.normal(size=3)]
    center = [rng.normal(size=(2, 3)), rng.normal(size=3)]
    lr, rho, steps = 0.05, 2.0, 6
    w = [p.copy() for p in start]
    for _ in range(steps):
        _, grads = model.loss_and_grad(w, X, y)
        if prox_step == "gradient":
            w = [wk - lr * (g + rho * (wk - v)) for wk, g, v in zip(w, grads, center, strict=True)]
        else:
            w = [
                (wk - lr * g + lr * rho * v) / (1 + lr * rho)
                for wk, g, v in zip(w, grads, center, strict=True)
            ]
    plan = LocalPlan(lr, steps=steps, prox_step=prox_step)
    result = penalized_local_solve(model, start, X, y, plan, center=center, rho=rho)
    assert [p.shape for p in result.params] == [(2, 3), (3,)]
    for got, want in zip(result.params, w, strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-13)


class LinearWithStoredGradient(LeastSquares):
    """f(w) = c . w, returning its one stored gradient array c at every call."""

    def __init__(self, c: np.ndarray) -> None:
        self.c = c
        super().__init__(len(c))

    def loss_and_grad(self, params, X, y):
        return float(self.c @ params[0]), [self.c]


def test_gradient_arrays_of_the_model_are_not_modified() -> None:
    c = np.array([1.0, -2.0])
    model = LinearWithStoredGradient(c.copy())
    lr, rho, steps = 0.1, 1.0, 4
    w = W0.copy()
    for _ in range(steps):
        w = (w - lr * c + lr * rho * V) / (1.0 + lr * rho)
    plan = LocalPlan(lr, steps=steps, prox_step="exact")
    result = penalized_local_solve(model, [W0], A, B, plan, center=[V], rho=rho)
    np.testing.assert_array_equal(model.c, c)
    np.testing.assert_allclose(result.params[0], w, rtol=1e-14)


# ------------------------------------------------------------------ minibatches


def _epochs_of(batches: list[np.ndarray], n: int, batch_size: int) -> list[np.ndarray]:
    per_epoch = -(-n // batch_size)
    return [np.concatenate(batches[i : i + per_epoch]) for i in range(0, len(batches), per_epoch)]


@pytest.mark.parametrize(("n", "batch_size"), [(10, 3), (12, 4), (7, 1)])
def test_minibatch_epochs_cover_every_sample_once(n: int, batch_size: int) -> None:
    epochs = 3
    X = np.arange(n, dtype=np.float64)[:, None]
    model = LeastSquares(1)
    plan = LocalPlan(1e-3, epochs=epochs, batch_size=batch_size)
    result = penalized_local_solve(
        model,
        [np.zeros(1)],
        X,
        np.zeros(n),
        plan,
        center=[np.zeros(1)],
        rho=1.0,
        rng=np.random.default_rng(7),
    )
    per_epoch = -(-n // batch_size)
    assert result.steps == epochs * per_epoch
    seen = [batch[:, 0].astype(int) for batch in model.seen[:-1]]  # last call: final loss
    assert len(seen) == epochs * per_epoch
    assert all(len(b) <= batch_size for b in seen)
    orders = _epochs_of(seen, n, batch_size)
    for order in orders:
        np.testing.assert_array_equal(np.sort(order), np.arange(n))
    if n > 3:
        assert not all(np.array_equal(orders[0], o) for o in orders[1:])  # reshuffled
    np.testing.assert_array_equal(model.seen[-1][:, 0], np.arange(n))  # loss on all data


def test_minibatch_order_is_deterministic_per_seed() -> None:
    plan = LocalPlan(0.1, epochs=2, batch_size=4)
    first = plan.batches(10, np.random.default_rng(11))
    again = plan.batches(10, np.random.default_rng(11))
    other = plan.batches(10, np.random.default_rng(12))
    assert len(first) == 6
    for a, b in zip(first, again, strict=True):
        np.testing.assert_array_equal(a, b)
    assert not all(np.array_equal(a, b) for a, b in zip(first, other, strict=True))


def test_minibatch_solve_is_deterministic_per_seed() -> None:
    rng = np.random.default_rng(5)
    X, y = rng.normal(size=(13, 2)), rng.normal(size=13)
    plan = LocalPlan(0.05, epochs=2, batch_size=5)

    def solve(seed: int) -> np.ndarray:
        return penalized_local_solve(
            LeastSquares(2),
            [np.zeros(2)],
            X,
            y,
            plan,
            center=[V],
            rho=1.0,
            rng=np.random.default_rng(seed),
        ).params[0]

    np.testing.assert_array_equal(solve(1), solve(1))
    assert not np.array_equal(solve(1), solve(2))


def test_minibatch_steps_use_full_batches_without_repeats_within_a_pass() -> None:
    plan = LocalPlan(0.1, steps=5, batch_size=4)
    batches = plan.batches(10, np.random.default_rng(0))
    assert [len(b) for b in batches] == [4, 4, 4, 4, 4]
    # steps 1-2 are one pass over a permutation, steps 3-4 the next, step 5 a third
    for first, second in ((0, 1), (2, 3)):
        joined = np.concatenate([batches[first], batches[second]])
        assert len(set(joined.tolist())) == 8


def test_batch_size_at_least_n_is_full_batch() -> None:
    assert (
        LocalPlan(0.1, epochs=3, batch_size=10).batches(10, np.random.default_rng(0)) == [None] * 3
    )
    assert LocalPlan(0.1, steps=2).batches(10, np.random.default_rng(0)) == [None, None]


# ------------------------------------------------------------------- validation


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"learning_rate": 0.0, "steps": 1}, "learning_rate"),
        ({"learning_rate": -0.1, "steps": 1}, "learning_rate"),
        ({"learning_rate": float("nan"), "steps": 1}, "learning_rate"),
        ({"learning_rate": 0.1}, "local_steps / local_epochs"),
        ({"learning_rate": 0.1, "steps": 2, "epochs": 1}, "local_steps / local_epochs"),
        ({"learning_rate": 0.1, "steps": 0}, "local_steps"),
        ({"learning_rate": 0.1, "steps": 1.5}, "local_steps"),
        ({"learning_rate": 0.1, "epochs": 0}, "local_epochs"),
        ({"learning_rate": 0.1, "steps": 1, "batch_size": 0}, "local_batch_size"),
        ({"learning_rate": 0.1, "steps": 1, "prox_step": "newton"}, "prox_step"),
        ({"learning_rate": 0.1, "steps": 1, "grad_tol": -1.0}, "grad_tol"),
        ({"learning_rate": 0.1, "steps": 1, "grad_tol": float("inf")}, "grad_tol"),
    ],
)
def test_local_plan_errors_name_the_field(kwargs: dict, field: str) -> None:
    with pytest.raises(ValueError, match=rf"^{field}: "):
        LocalPlan(**kwargs)


def test_prox_step_error_lists_allowed_values() -> None:
    with pytest.raises(ValueError, match=r"\['gradient', 'exact'\]"):
        LocalPlan(0.1, steps=1, prox_step="newton")  # type: ignore[arg-type]


@pytest.mark.parametrize("rho", [-1.0, float("nan"), float("inf")])
def test_bad_rho_names_the_field(rho: float) -> None:
    with pytest.raises(ValueError, match=r"^rho: "):
        penalized_local_solve(
            LeastSquares(2), [W0], A, B, LocalPlan(0.1, steps=1), center=[V], rho=rho
        )
