"""Server regularizers: prox against hand cases, closed forms and a scalar minimizer."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.optimize import minimize_scalar

from flwr_admm.core import L1, L2
from flwr_admm.core.regularizers import Regularizer


def _prox_by_minimization(g, a: np.ndarray, rho: float) -> np.ndarray:
    """argmin_z g(z) + rho/2 (z - a)^2 per coordinate, by a bounded scalar search."""
    out = np.empty_like(a)
    for idx, value in np.ndenumerate(a):
        bound = abs(value) + 1.0
        result = minimize_scalar(
            lambda z, v=value: g(z) + 0.5 * rho * (z - v) ** 2,
            bounds=(-bound, bound),
            method="bounded",
            options={"xatol": 1e-12},
        )
        out[idx] = result.x
    return out


def test_l1_prox_hand_cases() -> None:
    a = [np.array([2.0, -2.0, 0.3, -0.5, 0.5, 0.0]), np.array([[0.75], [-3.0]])]
    # threshold = strength / rho = 1 / 2
    L1(1.0).prox_(a, rho=2.0)
    np.testing.assert_array_equal(a[0], [1.5, -1.5, 0.0, 0.0, 0.0, 0.0])
    np.testing.assert_array_equal(a[1], [[0.25], [-2.5]])


@pytest.mark.parametrize(("strength", "rho"), [(0.3, 1.0), (1.0, 0.25), (2.0, 7.0)])
def test_l1_prox_is_the_argmin(strength: float, rho: float) -> None:
    a = np.random.default_rng(1).normal(scale=1.5 * strength / rho, size=(4, 3))
    got = L1(strength).prox_([a.copy()], rho)[0]
    expected = _prox_by_minimization(lambda z: strength * abs(z), a, rho)
    np.testing.assert_allclose(got, expected, atol=1e-7)
    # exact zeros where |a| <= strength / rho, not merely small numbers
    inside = np.abs(a) <= strength / rho
    assert inside.any() and (~inside).any()
    assert np.all(got[inside] == 0.0)
    np.testing.assert_allclose(got[~inside], a[~inside] - np.sign(a[~inside]) * strength / rho)


@pytest.mark.parametrize(("strength", "rho"), [(0.3, 1.0), (4.0, 0.5)])
def test_l2_prox_closed_form_and_argmin(strength: float, rho: float) -> None:
    a = np.random.default_rng(2).normal(size=5)
    got = L2(strength).prox_([a.copy()], rho)[0]
    # d/dz [strength/2 z^2 + rho/2 (z - a)^2] = 0  =>  z = rho a / (rho + strength)
    np.testing.assert_allclose(got, rho * a / (rho + strength), rtol=1e-15)
    expected = _prox_by_minimization(lambda z: 0.5 * strength * z**2, a, rho)
    np.testing.assert_allclose(got, expected, atol=1e-7)


def test_l2_prox_hand_case() -> None:
    a = [np.array([3.0, -6.0])]
    L2(1.0).prox_(a, rho=2.0)  # shrink 2 / 3
    np.testing.assert_allclose(a[0], [2.0, -4.0], rtol=1e-15)


@pytest.mark.parametrize("regularizer", [L1(0.5), L2(0.5)], ids=["L1", "L2"])
def test_prox_is_in_place(regularizer: Regularizer) -> None:
    first, second = np.array([1.0, -2.0, 0.1]), np.array([[4.0, -0.2]])
    arrays = [first, second]
    before = [first.copy(), second.copy()]
    out = regularizer.prox_(arrays, 1.0)
    assert out is arrays
    assert out[0] is first and out[1] is second
    assert not np.array_equal(first, before[0])
    assert not np.array_equal(second, before[1])


def test_zero_strength_prox_is_identity() -> None:
    a = np.array([1.0, -0.5, 0.0])
    np.testing.assert_array_equal(L1(0.0).prox_([a.copy()], 3.0)[0], a)
    np.testing.assert_array_equal(L2(0.0).prox_([a.copy()], 3.0)[0], a)


def test_values() -> None:
    z = [np.array([1.0, -2.0]), np.array([[3.0]])]
    assert L1(0.5).value(z) == pytest.approx(0.5 * 6.0, rel=1e-15)
    assert L2(0.5).value(z) == pytest.approx(0.25 * 14.0, rel=1e-15)
    assert L1(2.0).describe() == {"name": "L1", "strength": 2.0}


@pytest.mark.parametrize("cls", [L1, L2])
@pytest.mark.parametrize("bad", [-0.1, float("nan"), float("inf"), "1.0", None])
def test_bad_strength_names_the_field(cls: type[Regularizer], bad: object) -> None:
    with pytest.raises(ValueError, match=r"^strength: "):
        cls(bad)  # type: ignore[arg-type]
