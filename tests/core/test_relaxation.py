"""ConsensusADMM's over-relaxation and the rescaling of the duals when rho changes.

References: Boyd et al. 3.4.3 written out here as an independent scaled-form loop with
exact local solves, hand computations in one dimension, the scaled-form
`consensus_reference.ScaledReference` (u *= rho_old / rho_new) under a stepped
schedule, and the pooled ridge optimum from the normal equations.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from consensus_reference import ScaledReference, Stepped
from consensus_reference import clients as _clients
from consensus_reference import pooled_ridge as _pooled_ridge
from consensus_reference import rel as _rel
from consensus_reference import ridge_local_argmin as _ridge_local_argmin
from consensus_reference import ridge_round as _ridge_round

from flwr_admm.core import ConsensusADMM
from flwr_admm.core.types import Reply

# ----------------------------------------------------------- rho schedule rescaling


def test_rho_change_rescales_the_scaled_dual() -> None:
    admm = ConsensusADMM(z=[np.array([0.0])], rho=1.0, schedule=Stepped(factor=4.0))
    admm.step([Reply("a", [np.array([1.0])], 1), Reply("b", [np.array([3.0])], 1)], 1)
    # rho was 1 during round 1: z = 2, u_a = 1 - 2 = -1, y_a = -1; rho is now 4,
    # so u_a = y_a / 4 = -1/4 = (-1) * rho_old / rho_new and v_a = 2 + 1/4
    assert admm.rho == 4.0
    assert admm.center("a")[0][0] == 2.25
    assert admm.center("b")[0][0] == 1.75

    before = {key: admm.center(key)[0].copy() for key in ("a", "b")}
    z_before = admm.z[0].copy()
    w = {"a": np.array([1.5]), "b": np.array([2.5])}
    report = admm.step([Reply(key, [w[key]], 1) for key in w], 2)
    assert (report.rho, report.next_rho, admm.rho) == (4.0, 16.0, 16.0)
    # scaled form: z = mean(w + u), u_new = (u + w - z) * 4 / 16
    u = {key: z_before - before[key] for key in w}
    z = np.mean([w[key] + u[key] for key in w], axis=0)
    np.testing.assert_allclose(admm.z[0], z, rtol=1e-15)
    for key in w:
        u_new = (u[key] + w[key] - z) * (4.0 / 16.0)
        np.testing.assert_allclose(admm.center(key)[0], z - u_new, rtol=1e-15)


def test_rho_schedule_with_partial_participation_matches_scaled_reference() -> None:
    rng = np.random.default_rng(7)
    schedule = Stepped(factor=0.5, every=3, rho_min=1e-3)
    admm = ConsensusADMM(z=[np.zeros(2)], rho=8.0, schedule=schedule)
    ref = ScaledReference(2)
    sizes = {"c0": 3, "c1": 11, "c2": 29, "c3": 5}
    rho = 8.0
    for k in range(1, 31):
        keys = list(sizes) if k == 1 else sorted(rng.choice(list(sizes), size=2, replace=False))
        replies = {key: (ref.center(key) + rng.normal(size=2), sizes[key]) for key in keys}
        report = admm.step([Reply(key, [w], n) for key, (w, n) in replies.items()], k)
        rho_new = max(rho * 0.5, 1e-3) if k % 3 == 0 else rho
        assert (report.rho, admm.rho) == (rho, rho_new)
        ref.step(replies, rho, rho_new)
        rho = rho_new
        np.testing.assert_allclose(admm.z[0], ref.z, rtol=1e-12, atol=1e-12)
        for key in ref.u:
            np.testing.assert_allclose(admm.center(key)[0], ref.center(key), atol=1e-11)
    assert rho == 8.0 * 0.5**10


# ------------------------------------------------------------------ over-relaxation


def test_over_relaxation_matches_an_independent_scaled_form_loop() -> None:
    """Boyd 3.4.3 written out in scaled form, full participation, exact local solves."""
    lam, rho, alpha, sizes = 0.1, 0.8, 1.6, [20, 35, 80]
    data = _clients(sizes, d=4, seed=5)
    p = np.array(sizes) / sum(sizes)
    z, u = np.zeros(4), [np.zeros(4) for _ in sizes]
    admm = ConsensusADMM(z=[np.zeros(4)], rho=rho, relaxation=alpha)
    keys = ["c0", "c1", "c2"]
    for k in range(1, 16):
        w = [
            _ridge_local_argmin(X, y, lam, rho, z - u_i)
            for (X, y), u_i in zip(data, u, strict=True)
        ]
        w_hat = [alpha * w_i + (1 - alpha) * z for w_i in w]
        z_new = sum(p_i * (wh + u_i) for p_i, wh, u_i in zip(p, w_hat, u, strict=True))
        u = [u_i + wh - z_new for u_i, wh in zip(u, w_hat, strict=True)]
        r = math.sqrt(
            sum(p_i * float((w_i - z_new) @ (w_i - z_new)) for p_i, w_i in zip(p, w, strict=True))
        )
        s = rho * float(np.linalg.norm(z_new - z))
        z = z_new
        report = _ridge_round(admm, data, lam, keys, k)
        np.testing.assert_allclose(admm.z[0], z, rtol=1e-12, atol=1e-14)
        for key, u_i in zip(keys, u, strict=True):
            np.testing.assert_allclose(admm.records[key].y[0] / rho, u_i, rtol=1e-10, atol=1e-13)
        assert report.primal_residual == pytest.approx(r, rel=1e-10, abs=1e-15)
        assert report.dual_residual == pytest.approx(s, rel=1e-10, abs=1e-15)


def test_over_relaxation_by_hand_in_one_dimension() -> None:
    # Round 1 from z = 0: w_a = 1 (n = 1), w_b = 5 (n = 3), alpha = 1.5, rho = 2:
    # w^ = 1.5 w - 0.5 * 0 = (1.5, 7.5); z' = (1.5 + 3 * 7.5) / 4 = 6
    admm = ConsensusADMM(z=[np.array([0.0])], rho=2.0, relaxation=1.5)
    admm.step([Reply("a", [np.array([1.0])], 1), Reply("b", [np.array([5.0])], 3)], 1)
    assert admm.z[0][0] == 6.0
    # y_a = 2 (1.5 - 6) = -9, y_b = 2 (7.5 - 6) = 3
    assert admm.records["a"].y[0][0] == -9.0
    assert admm.records["b"].y[0][0] == 3.0
    # Round 2, only "a" replies (w_a = 2); "b" counts with its stored w_b = 5:
    # w^_a = 1.5 * 2 - 0.5 * 6 = 0; z' = (1 (0 + -9 / 2) + 3 (5 + 3 / 2)) / 4 = 3.75
    report = admm.step([Reply("a", [np.array([2.0])], 1)], 2)
    assert admm.z[0][0] == pytest.approx(3.75, rel=1e-15)
    assert admm.records["a"].y[0][0] == pytest.approx(-9.0 + 2 * (0.0 - 3.75), rel=1e-15)
    assert report.primal_residual == pytest.approx(abs(2.0 - 3.75), rel=1e-15)


def test_over_relaxation_with_partial_participation_reaches_the_pooled_ridge() -> None:
    lam, sizes = 0.05, [15, 40, 25, 60]
    data = _clients(sizes, d=3, seed=2)
    optimum = _pooled_ridge(data, lam)
    admm = ConsensusADMM(z=[np.zeros(3)], rho=5.0, relaxation=1.7)
    rng = np.random.default_rng(3)
    _ridge_round(admm, data, lam, ["c0", "c1", "c2", "c3"], 1)
    for k in range(2, 600):
        keys = [f"c{i}" for i in sorted(rng.choice(4, size=2, replace=False))]
        _ridge_round(admm, data, lam, keys, k)
        if _rel(admm.z[0], optimum) < 1e-10:
            break
    assert _rel(admm.z[0], optimum) < 1e-9
    # The cached sums still equal their definition after hundreds of partial rounds.
    s_y = sum(r.num_examples * r.y[0] for r in admm.records.values())
    np.testing.assert_allclose(admm.sums.ny[0], s_y, rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("alpha", [0.0, 2.0, -1.0, float("nan"), True])
def test_relaxation_outside_zero_two_is_refused(alpha: float) -> None:
    with pytest.raises(ValueError, match=r"^relaxation: must be a number in \(0, 2\)"):
        ConsensusADMM(z=[np.zeros(2)], rho=1.0, relaxation=alpha)
