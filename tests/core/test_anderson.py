"""Anderson acceleration (flwr_admm.core.anderson) against hand formulas and closed forms.

References: the textbook type-II step with m = 1 written out by hand on an affine
map; the finite termination of full-memory Anderson on an affine map (it is GMRES
on I - A, Walker & Ni 2011); the pooled ridge optimum from the normal equations
with exact local solves (`consensus_reference`).
"""

from __future__ import annotations

import numpy as np
import pytest
from consensus_reference import clients, pooled_ridge, rel, ridge_round

from flwr_admm import ConsensusADMM, Geometric
from flwr_admm.core.anderson import AndersonMemory, anderson_weights
from flwr_admm.core.settings import ConsensusSettings

A = np.array([[0.5, 0.2, 0.0], [-0.1, 0.7, 0.3], [0.0, 0.2, 0.9]])
B = np.array([1.0, -2.0, 0.5])


def affine(x: np.ndarray) -> np.ndarray:
    return A @ x + B


def test_m1_step_is_the_textbook_formula() -> None:
    accel = AndersonMemory(memory=1, regularization=0.0, safeguard=1e300)
    x0 = np.array([0.3, -0.2, 1.0])
    f0 = affine(x0)
    x1 = accel.step(x0, f0)
    assert np.array_equal(x1, f0)  # no pair yet: the plain step
    f1 = affine(x1)
    x2 = accel.step(x1, f1)
    g0, g1 = f0 - x0, f1 - x1
    gamma = g1 @ (g1 - g0) / ((g1 - g0) @ (g1 - g0))  # argmin ||g1 - gamma (g1 - g0)||
    assert np.allclose(x2, f1 - gamma * (f1 - f0), rtol=1e-14, atol=1e-14)
    # next step: only the newest pair is kept (m = 1)
    f2 = affine(x2)
    x3 = accel.step(x2, f2)
    g2 = f2 - x2
    gamma = g2 @ (g2 - g1) / ((g2 - g1) @ (g2 - g1))
    assert np.allclose(x3, f2 - gamma * (f2 - f1), rtol=1e-13, atol=1e-13)


def test_full_memory_terminates_on_an_affine_map() -> None:
    star = np.linalg.solve(np.eye(3) - A, B)
    accel = AndersonMemory(memory=3, regularization=0.0, safeguard=1e300)
    x = np.zeros(3)
    for _ in range(5):  # GMRES on (I - A) x = B: exact after dim + 1 maps
        x = accel.step(x, affine(x))
    assert np.linalg.norm(x - star) < 1e-10 * np.linalg.norm(star)


def test_regularized_weights_solve_the_tikhonov_normal_equations() -> None:
    rng = np.random.default_rng(0)
    dg, g = rng.normal(size=(7, 3)), rng.normal(size=7)
    lam = 1e-2
    gamma = anderson_weights(g, dg, lam)
    reg = lam * np.sum(dg * dg)
    stacked = np.vstack([dg, np.sqrt(reg) * np.eye(3)])
    expected = np.linalg.lstsq(stacked, np.concatenate([g, np.zeros(3)]), rcond=None)[0]
    assert np.allclose(gamma, expected, rtol=1e-10)


def test_safeguard_rejects_an_extrapolation_whose_residual_grew() -> None:
    accel = AndersonMemory(memory=2, safeguard=1.0)
    accel.step(np.zeros(2), np.array([1.0, 0.0]))
    x1 = np.array([1.0, 0.0])
    x2 = accel.step(x1, np.array([1.0, 0.5]))
    assert accel.extrapolated
    f2 = x2 + np.array([3.0, 3.0])  # ||g_2|| > ||g_1||: reject, take the plain step
    x3 = accel.step(x2, f2)
    assert np.array_equal(x3, f2)
    assert (accel.rejected, accel.accepted) == (1, 0)
    assert accel.dx == [] and accel.x_prev is x2  # memory restarted from (x_2, g_2)


@pytest.mark.parametrize(
    ("field", "value"),
    [("memory", 0), ("memory", 2.0), ("safeguard", 0.0), ("regularization", -1), ("patience", -1)],
)
def test_bad_settings_raise(field: str, value: object) -> None:
    with pytest.raises(ValueError, match=field):
        AndersonMemory(**{field: value})  # type: ignore[arg-type]


def _rounds_to(admm: ConsensusADMM, data, lam: float, rounds: int, keys=None) -> int | None:
    star = pooled_ridge(data, lam)
    every = [f"c{i}" for i in range(len(data))]
    for k in range(rounds):
        ridge_round(admm, data, lam, every if keys is None else keys(k), k + 1)
        ny = sum(r.num_examples * r.y[0] for r in admm.records.values())
        size = sum(r.num_examples * np.abs(r.y[0]) for r in admm.records.values())
        assert np.all(np.abs(admm.sums.ny[0] - ny) <= 1e-12 * size + 1e-300)  # S_y kept
        if rel(admm.z[0], star) < 1e-8:
            return k + 1
    return None


@pytest.mark.parametrize("alpha", [1.0, 1.6])
@pytest.mark.parametrize("rho", [0.05, 1.0, 20.0])
def test_anderson_admm_reaches_the_pooled_ridge_faster_than_plain(rho: float, alpha: float) -> None:
    data = clients([30, 50, 20, 40], d=6, seed=3)
    admm = ConsensusADMM([np.zeros(6)], rho=rho, relaxation=alpha, acceleration="anderson")
    fast = _rounds_to(admm, data, 0.05, 400)  # measured: 123, 247, 71, 30, 63, 44
    plain = _rounds_to(ConsensusADMM([np.zeros(6)], rho=rho, relaxation=alpha), data, 0.05, 400)
    assert fast is not None and (plain is None or fast < plain)
    assert admm.anderson is not None and admm.anderson.accel.accepted > 0


@pytest.mark.parametrize("replied_only", [False, True])
def test_partial_participation_reaches_the_pooled_ridge(replied_only: bool) -> None:
    data = clients([30, 50, 20, 40, 25, 35], d=5, seed=8)
    rng = np.random.default_rng(0)

    def keys(_: int) -> list[str]:
        return [f"c{i}" for i in sorted(rng.choice(6, size=3, replace=False))]

    admm = ConsensusADMM([np.zeros(5)], rho=1.0, acceleration="anderson")
    assert admm.anderson is not None
    admm.anderson.replied_only = replied_only
    assert _rounds_to(admm, data, 0.1, 600, keys) is not None  # measured: 218
    assert admm.anderson.accel.rejected > 0  # the safeguard branch ran


def test_rho_changes_restart_the_memory_and_the_limit_holds() -> None:
    data = clients([30, 50, 20, 40], d=6, seed=3)
    admm = ConsensusADMM(
        [np.zeros(6)],
        rho=0.2,
        schedule=Geometric(factor=1.5, every=5, rho_max=5.0),
        acceleration="anderson",
    )
    assert _rounds_to(admm, data, 0.05, 400) is not None
    assert admm.anderson is not None and admm.anderson.accel.restarts >= 5


def test_settings_accept_anderson() -> None:
    settings = ConsensusSettings(acceleration="anderson")
    assert settings.describe()["acceleration"] == "anderson"
    assert settings.new_admm([np.zeros(2)]).anderson is not None
    with pytest.raises(ValueError, match="acceleration"):
        ConsensusSettings(acceleration="andersen")


def test_patience_waits_that_many_plain_steps_after_a_rejection() -> None:
    accel = AndersonMemory(memory=2, safeguard=1.0, patience=2)
    accel.step(np.zeros(2), np.array([1.0, 0.0]))
    x2 = accel.step(np.array([1.0, 0.0]), np.array([1.0, 0.5]))
    assert accel.extrapolated
    x = x2
    for _ in range(3):  # the rejection, then two plain steps although pairs are stored
        f = x + np.array([3.0, 3.0]) if x is x2 else x + np.array([0.1, -0.2]) / (1 + x[0])
        out = accel.step(x, f)
        assert np.array_equal(out, f) and not accel.extrapolated
        x = out
    assert accel.rejected == 1 and len(accel.dg) == 2
    accel.step(x, x + np.array([0.01, 0.02]))
    assert accel.extrapolated  # the wait is over


def test_a_restored_checkpoint_keeps_the_memory_and_still_converges() -> None:
    data = clients([30, 50, 20, 40], d=6, seed=3)
    admm = ConsensusADMM([np.zeros(6)], rho=1.0, acceleration="anderson")
    assert _rounds_to(admm, data, 0.05, 10) is None  # 10 rounds: memory filled
    assert admm.anderson is not None and admm.anderson.accel.dg
    arrays, meta = admm.state_dict()
    resumed = ConsensusADMM([np.zeros(6)], rho=1.0, acceleration="anderson")
    resumed.load_state_dict(arrays, meta)
    assert np.array_equal(resumed.z[0], admm.z[0])
    assert resumed.anderson is not None and len(resumed.anderson.accel.dg) == len(
        admm.anderson.accel.dg
    )
    for kept, saved in zip(resumed.anderson.accel.dg, admm.anderson.accel.dg, strict=True):
        assert np.array_equal(kept, saved)
    assert resumed.anderson.signature == admm.anderson.signature
    assert _rounds_to(resumed, data, 0.05, 400) is not None


def test_float32_state_reaches_the_pooled_ridge_to_float32_rounding() -> None:
    data = clients([30, 50, 20, 40], d=6, seed=3)
    admm = ConsensusADMM([np.zeros(6)], rho=1.0, acceleration="anderson", state_dtype="float32")
    for k in range(200):
        ridge_round(admm, data, 0.05, [f"c{i}" for i in range(4)], k + 1)
    assert all(r.y[0].dtype == np.float32 for r in admm.records.values())
    assert rel(admm.z[0], pooled_ridge(data, 0.05)) < 1e-5


def test_a_state_that_stopped_moving_takes_the_plain_step() -> None:
    accel = AndersonMemory(memory=2)
    x = np.array([1.0, 2.0])
    for _ in range(4):  # dG = 0: the Gram matrix is 0, least squares gives gamma = 0
        out = accel.step(x, x.copy())
        assert np.array_equal(out, x)


def test_checkpoint_round_trip_keeps_the_memory_bit_for_bit() -> None:
    data = clients([30, 50, 20], d=4, seed=5)
    every = ["c0", "c1", "c2"]
    unbroken = ConsensusADMM([np.zeros(4)], rho=0.5, acceleration="anderson")
    for k in range(6):
        ridge_round(unbroken, data, 0.1, every, k + 1)
    assert unbroken.anderson is not None and unbroken.anderson.accel.dx  # a memory to keep
    arrays, meta = unbroken.state_dict()
    arrays = {name: a.copy() for name, a in arrays.items()}
    resumed = ConsensusADMM([np.zeros(4)], rho=0.5, acceleration="anderson")
    resumed.load_state_dict(arrays, meta)
    for k in range(6, 12):
        ridge_round(unbroken, data, 0.1, every if k % 3 else every[:2], k + 1)
        ridge_round(resumed, data, 0.1, every if k % 3 else every[:2], k + 1)
        assert np.array_equal(unbroken.z[0], resumed.z[0])
    assert resumed.anderson is not None
    assert resumed.anderson.accel.accepted == unbroken.anderson.accel.accepted


def test_a_checkpoint_missing_anderson_arrays_or_memory_is_refused() -> None:
    data = clients([30, 50, 20], d=4, seed=5)
    admm = ConsensusADMM([np.zeros(4)], rho=0.5, acceleration="anderson")
    for k in range(4):
        ridge_round(admm, data, 0.1, ["c0", "c1", "c2"], k + 1)
    arrays, meta = admm.state_dict()
    fresh = ConsensusADMM([np.zeros(4)], rho=0.5, acceleration="anderson")
    missing = {name: a for name, a in arrays.items() if name != "anderson_dx.0"}
    with pytest.raises(ValueError, match="Anderson memory"):
        fresh.load_state_dict(missing, meta)
    short = {**arrays, "anderson_g_prev": arrays["anderson_g_prev"][:-1]}
    with pytest.raises(ValueError, match="Anderson memory"):
        fresh.load_state_dict(short, meta)
    old = {k: v for k, v in meta.items() if k != "anderson"}  # written before it was saved
    with pytest.raises(ValueError, match="no Anderson memory"):
        fresh.load_state_dict(arrays, old)
