"""The server's one-pass kernels against plain numpy."""

from __future__ import annotations

import numpy as np
import pytest

from flwr_admm.core.kernels import axpy, finite_sq_norm, single_thread_blas


@pytest.mark.parametrize("shape", [(0,), (1,), (7,), (5, 3), ()])
def test_axpy_matches_numpy_in_place(shape: tuple[int, ...]) -> None:
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=shape), rng.normal(size=shape)
    expected = y + 0.37 * x
    target = y
    axpy(0.37, x, y)
    assert y is target
    np.testing.assert_allclose(y, expected, rtol=1e-15, atol=1e-15)


def test_axpy_non_contiguous_and_other_dtypes_fall_back() -> None:
    rng = np.random.default_rng(1)
    y = rng.normal(size=(6, 4))
    x = rng.normal(size=(4, 6)).T  # not C-contiguous
    expected = y - 2.0 * x
    axpy(-2.0, x, y)
    np.testing.assert_allclose(y, expected, rtol=1e-15)
    y32 = np.ones(5, dtype=np.float32)
    axpy(0.5, np.ones(5, dtype=np.float32), y32)
    np.testing.assert_array_equal(y32, np.full(5, 1.5, dtype=np.float32))


def test_axpy_on_a_block_view_writes_through() -> None:
    y = np.zeros(10)
    axpy(2.0, np.ones(4), y[3:7])
    np.testing.assert_array_equal(y, [0, 0, 0, 2, 2, 2, 2, 0, 0, 0])


def test_finite_sq_norm() -> None:
    arrays = [np.array([3.0, 4.0]), np.array([[1.0], [2.0]]), np.array([2], dtype=np.int64)]
    assert finite_sq_norm(arrays) == 25.0 + 5.0 + 4.0
    assert finite_sq_norm([np.array([1.0, np.nan])]) is None
    assert finite_sq_norm([np.array([np.inf, 1.0])]) is None
    assert finite_sq_norm([np.array([-np.inf])]) is None
    # finite entries whose squared norm overflows cannot enter the residuals: flagged
    assert finite_sq_norm([np.array([1e200, 1.0])]) is None
    assert finite_sq_norm([np.array([1e150, 1.0])]) == pytest.approx(1e300)


def test_single_thread_blas_is_reentrant() -> None:
    with single_thread_blas(), single_thread_blas():
        assert float(np.dot(np.ones(3), np.ones(3))) == 3.0


@pytest.mark.parametrize("size", [0, 1, 5, (1 << 17) + 3])
def test_fold_in_matches_numpy_and_returns_the_squared_norm(size: int) -> None:
    from flwr_admm.core.kernels import fold_in

    rng = np.random.default_rng(size)
    acc, x, old = rng.normal(size=size), rng.normal(size=size), rng.normal(size=size)
    expected = acc + 3.0 * x - 2.0 * old
    assert fold_in(acc, 3.0, x, 2.0, old) == pytest.approx(float(x @ x), rel=1e-13, abs=0)
    np.testing.assert_allclose(acc, expected, rtol=1e-13, atol=1e-13)
    plain = acc.copy()
    fold_in(acc, 0.5, x)
    np.testing.assert_allclose(acc, plain + 0.5 * x, rtol=1e-13, atol=1e-13)


def test_fold_in_flags_non_finite_input() -> None:
    from flwr_admm.core.kernels import fold_in

    for bad in (np.nan, np.inf, 1e200):
        x = np.ones(10)
        x[7] = bad
        assert not np.isfinite(fold_in(np.zeros(10), 1.0, x))
