"""Fast ADMM with restart in ConsensusADMM against an independent textbook loop.

The reference is Goldstein, O'Donoghue, Setzer & Baraniuk (2014), Alg. 8 with the
restart from the current point, written out for consensus ridge regression with
exact local solves (normal equations) and the p-weighted constraint norm, in
unscaled duals.
"""

from __future__ import annotations

import re

import numpy as np
import pytest
from consensus_reference import Stepped, clients, pooled_ridge, rel, ridge_local_argmin, ridge_round

from flwr_admm.core import ConsensusADMM


def textbook_fast_admm(data, lam: float, rho: float, rounds: int, eta: float = 0.999):
    """Return the z^ sent out after each round and the number of restarts (Alg. 8).

    A restart is from the current point (z^ = z_k, y^ = y_k, c kept).
    """
    d = data[0][0].shape[1]
    n = np.array([X.shape[0] for X, _ in data], dtype=float)
    p = n / n.sum()
    m = len(data)
    z_hat, z_prev = np.zeros(d), np.zeros(d)
    y_hat, y_prev = np.zeros((m, d)), np.zeros((m, d))
    a, c_prev, restarts, sent = 1.0, None, 0, []
    for _ in range(rounds):
        w = np.array(
            [
                ridge_local_argmin(X, b, lam, rho, z_hat - y_hat[i] / rho)
                for i, (X, b) in enumerate(data)
            ]
        )
        z = p @ (w + y_hat / rho)  # argmin_z sum p_i (y^_i (w_i - z) + rho/2 ||w_i - z||^2)
        y = y_hat + rho * (w - z)
        c = float(p @ np.sum((y - y_hat) ** 2, axis=1)) / rho + rho * float(
            np.sum((z - z_hat) ** 2)
        )
        if c_prev is None or c < eta * c_prev:
            a_next = (1 + np.sqrt(1 + 4 * a * a)) / 2
            g = (a - 1) / a_next
            z_hat, y_hat = z + g * (z - z_prev), y + g * (y - y_prev)
            z_prev, y_prev, c_prev, a = z, y, c, a_next
        else:
            z_hat, y_hat, z_prev, y_prev = z, y, z, y
            c_prev, a, restarts = c, 1.0, restarts + 1
        sent.append(z_hat)
    return sent, restarts


def _run(admm: ConsensusADMM, data, lam: float, rounds: int, keys=None) -> list[np.ndarray]:
    sent = []
    every = [f"c{i}" for i in range(len(data))]
    for k in range(rounds):
        ridge_round(admm, data, lam, every if keys is None else keys(k), k + 1)
        sent.append(admm.z[0].copy())
    return sent


@pytest.mark.parametrize("rho", [0.05, 1.0, 20.0])
def test_fast_admm_matches_the_textbook_accelerated_iteration(rho: float) -> None:
    data = clients([30, 50, 20, 40], d=6, seed=3)
    lam, rounds = 0.05, 60
    expected, restarts = textbook_fast_admm(data, lam, rho, rounds)
    admm = ConsensusADMM([np.zeros(6)], rho=rho, acceleration="nesterov")
    got = _run(admm, data, lam, rounds)
    for k, (a, b) in enumerate(zip(got, expected, strict=True)):
        assert np.allclose(a, b, rtol=1e-9, atol=1e-12), k
    assert admm.fast is not None and admm.fast.restarts == restarts


def test_restart_branch_is_exercised_and_the_limit_is_the_pooled_ridge() -> None:
    data = clients([30, 50, 20, 40], d=6, seed=3)
    lam = 0.05
    _, restarts = textbook_fast_admm(data, lam, 20.0, 60)
    assert restarts > 0  # the comparison above covered the restart branch
    admm = ConsensusADMM([np.zeros(6)], rho=20.0, acceleration="nesterov")
    _run(admm, data, lam, 200)
    assert rel(admm.z[0], pooled_ridge(data, lam)) < 1e-8


def test_acceleration_needs_fewer_rounds_with_exact_solves() -> None:
    data = clients([30, 50, 20, 40], d=6, seed=3)
    lam, star = 0.05, pooled_ridge(data, 0.05)

    def rounds_to(admm: ConsensusADMM) -> int:
        for k, z in enumerate(_run(admm, data, lam, 400)):
            if rel(z, star) < 1e-8:
                return k + 1
        return 10**9

    plain = rounds_to(ConsensusADMM([np.zeros(6)], rho=1.0))  # measured: 378
    fast = rounds_to(ConsensusADMM([np.zeros(6)], rho=1.0, acceleration="nesterov"))
    assert fast < plain / 2  # measured: 96


@pytest.mark.parametrize("alpha", [1.0, 1.6])
def test_partial_participation_reaches_the_pooled_ridge(alpha: float) -> None:
    data = clients([30, 50, 20, 40, 25, 35], d=5, seed=8)
    lam = 0.1
    rng = np.random.default_rng(0)

    def keys(_: int) -> list[str]:
        return [f"c{i}" for i in sorted(rng.choice(6, size=3, replace=False))]

    admm = ConsensusADMM([np.zeros(5)], rho=1.0, relaxation=alpha, acceleration="nesterov")
    _run(admm, data, lam, 600, keys)
    assert rel(admm.z[0], pooled_ridge(data, lam)) < 1e-6
    # S_y = sum n_i y_i still matches the stored (extrapolated) duals
    total = sum(r.num_examples * r.y[0] for r in admm.records.values())
    assert np.allclose(admm.sums.ny[0], total, atol=1e-9)


def test_a_rho_change_restarts_the_momentum() -> None:
    data = clients([30, 50], d=4, seed=1)
    admm = ConsensusADMM(
        [np.zeros(4)], rho=1.0, schedule=Stepped(2.0, every=1), acceleration="nesterov"
    )
    ridge_round(admm, data, 0.1, ["c0", "c1"], 1)
    ridge_round(admm, data, 0.1, ["c0", "c1"], 2)
    assert admm.fast is not None and admm.fast.a == 1.0 and admm.fast.c_prev is None


def test_rho_zero_is_untouched_by_acceleration() -> None:
    data = clients([30, 50, 20], d=4, seed=2)
    plain = ConsensusADMM([np.zeros(4)], rho=0.0)
    fast = ConsensusADMM([np.zeros(4)], rho=0.0, acceleration="nesterov")
    for k in range(5):
        ridge_round(plain, data, 0.1, ["c0", "c1", "c2"], k + 1)
        ridge_round(fast, data, 0.1, ["c0", "c1", "c2"], k + 1)
        assert np.array_equal(plain.z[0], fast.z[0])


def test_checkpoint_round_trip_continues_bit_for_bit() -> None:
    data = clients([30, 50, 20], d=4, seed=5)
    every = ["c0", "c1", "c2"]
    unbroken = ConsensusADMM([np.zeros(4)], rho=0.5, acceleration="nesterov")
    for k in range(6):
        ridge_round(unbroken, data, 0.1, every if k % 2 else every[:2], k + 1)
    arrays, meta = unbroken.state_dict()
    arrays = {name: a.copy() for name, a in arrays.items()}
    resumed = ConsensusADMM([np.zeros(4)], rho=0.5, acceleration="nesterov")
    resumed.load_state_dict(arrays, meta)
    for k in range(6, 12):
        ridge_round(unbroken, data, 0.1, every, k + 1)
        ridge_round(resumed, data, 0.1, every, k + 1)
        assert np.array_equal(unbroken.z[0], resumed.z[0])


def test_eviction_forgets_the_previous_dual() -> None:
    data = clients([30, 50, 20], d=4, seed=5)
    admm = ConsensusADMM([np.zeros(4)], rho=0.5, acceleration="nesterov")
    ridge_round(admm, data, 0.1, ["c0", "c1", "c2"], 1)
    admm.evict(["c1"])
    assert admm.fast is not None and set(admm.fast.y_prev) == {"c0", "c2"}


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [({"acceleration": "aitken"}, "acceleration"), ({"restart_eta": 1.5}, "restart_eta")],
)
def test_bad_acceleration_settings_are_refused(kwargs: dict[str, object], field: str) -> None:
    with pytest.raises(ValueError, match=field):
        ConsensusADMM([np.zeros(2)], rho=1.0, **{"acceleration": "nesterov", **kwargs})


@pytest.mark.parametrize("deleted", ["anderson", "goldstein"])
def test_a_deleted_acceleration_is_refused_with_the_allowed_values(deleted: str) -> None:
    expected = (
        f"acceleration: must be one of [None, 'nesterov'], got '{deleted}' ('{deleted}' was deleted"
    )
    with pytest.raises(ValueError, match=re.escape(expected)):
        ConsensusADMM([np.zeros(2)], rho=1.0, acceleration=deleted)


def test_a_state_written_with_a_deleted_option_is_refused_naming_it() -> None:
    """The version before the deletion wrote Anderson's memory under "anderson" and the
    restart kind as fast ADMM's "to_previous" (True for "goldstein", False for "nesterov")."""
    admm = ConsensusADMM([np.zeros(4)], rho=0.5, acceleration="nesterov")
    ridge_round(admm, clients([30, 50], d=4, seed=5), 0.1, ["c0", "c1"], 1)
    arrays, meta = admm.state_dict()
    fast = meta["acceleration"]
    resumed = ConsensusADMM([np.zeros(4)], rho=0.5, acceleration="nesterov")
    resumed.load_state_dict(arrays, {**meta, "acceleration": {**fast, "to_previous": False}})
    assert resumed.fast is not None and resumed.fast.a == admm.fast.a  # type: ignore[union-attr]
    written = {
        "anderson": {**meta, "anderson": {"pairs": 0, "has_prev": False, "signature": None}},
        "goldstein": {**meta, "acceleration": {**fast, "to_previous": True}},
    }
    for deleted, old in written.items():
        with pytest.raises(ValueError, match=f"written with acceleration='{deleted}', which this"):
            resumed.load_state_dict(arrays, old)
