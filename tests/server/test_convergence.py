"""FedADMM reaches the centralized optimum of seed 000's task; FedAvg does not.

The optimum comes from scipy (L-BFGS, tight tolerances, Newton-polished) on the pooled
data and is checked by its gradient / KKT conditions and against sklearn. Settings
unless stated: rho = 0.1, 20 local steps, lr = 1.0, prox_step "exact", local_init
"previous".

Measured (in-process driver, this task):
- FedADMM full participation: gap <= 1e-6 at round 17, <= 1e-10 at round 29.
- FedAvg, 20 local steps, lr 1.0: stalls at gap 7.46e-4 (flat from round ~20 on).
- FedADMM, 3 of 10 clients a round: gap <= 1e-6 at round 49.
- ResidualBalancing (relative, adaptive, mu = 15): rho0 = 1e-3 -> gap <= 1e-6 at round
  19; rho0 = 100 -> round 21; rho0 = 1 (untuned) -> round 16, as fast as the best tuned
  constant rho of the benchmark grid (lr 2.0, rho 0.1: round 16). Boyd's eq. 3.13 (the
  previous default) needed 26, 39 and 37 rounds.
- Over-relaxation alpha = 1.6, lr 2.0 (rho 0.1): gap <= 1e-6 at round 8 (alpha = 1: 16);
  FedAvg's best point of the benchmark grid (lr 4.0, 1 step) needs 26.
- L1(0.02): 4 zeros, same zero pattern from round 5, 1.2e-8 relative at round 40.
- FedAvg with 1 local step is full-batch gradient descent on the pooled objective:
  lr 2.0 -> 1e-6 at round 57 (the issue's "best-tuned FedAvg, about 57 rounds"), but
  larger steps are stable on this well-conditioned task: lr 5.0 -> 20 rounds,
  lr 7.0 -> 9 rounds (faster than FedADMM's 17). The "57 rounds" figure holds only
  for a grid capped at lr 2.0.
"""

from __future__ import annotations

import numpy as np
import pytest
from centralized import l1_optimum
from flower_run import C, run_seed
from flwr.server.strategy import FedAvg
from seed_task import first_round_below, gaps, optimum, pooled
from sklearn.linear_model import LogisticRegression as SkLogisticRegression

from flwr_admm.core import L1, ResidualBalancing
from flwr_admm.server.fedadmm import textbook

CLIENT = {"local_steps": 20, "learning_rate": 1.0}
L1_STRENGTH = 0.02


def test_centralized_reference_is_the_optimum() -> None:
    w, _ = optimum()
    assert np.linalg.norm(pooled().gradient(w)) <= 1e-13
    # sklearn minimizes 1/2||w||^2 + C_sk sum_j logloss_j: C_sk = 1 / (C n).
    sk = SkLogisticRegression(
        C=1.0 / (C * pooled().X.shape[0]), fit_intercept=False, tol=1e-12, max_iter=1000
    ).fit(pooled().X, pooled().y)
    assert np.linalg.norm(sk.coef_[0] - w) <= 1e-6 * np.linalg.norm(w)


def test_fedadmm_reaches_optimum_1e6_in_20_and_1e10_in_60_rounds() -> None:
    _, recorder, result = run_seed(textbook, 60, client_kwargs=CLIENT, rho=0.1)
    gap = gaps(recorder.matrix)
    reach_6, reach_10 = first_round_below(gap, 1e-6), first_round_below(gap, 1e-10)
    assert reach_6 is not None and reach_6 <= 20, gap[:20]
    assert reach_10 is not None and reach_10 <= 60, gap
    assert gap[-1] <= 1e-10
    # Boyd's stopping-rule metrics are reported every round, finite and consistent.
    assert len(result.fit_metrics) == 60
    for metrics in result.fit_metrics:
        for name in (
            "rho",
            "primal_residual",
            "dual_residual",
            "eps_primal",
            "eps_dual",
            "num_clients_cached",
        ):
            assert name in metrics and np.isfinite(float(metrics[name])), (name, metrics)
        assert metrics["num_clients_cached"] == 10
        stop = (
            metrics["primal_residual"] <= metrics["eps_primal"]
            and metrics["dual_residual"] <= metrics["eps_dual"]
        )
        assert int(metrics["converged"]) == int(stop)
    assert int(result.fit_metrics[-1]["converged"]) == 1
    assert int(result.fit_metrics[0]["converged"]) == 0


def test_fedavg_with_many_local_steps_stalls_at_a_biased_point() -> None:
    _, recorder, _ = run_seed(FedAvg, 100, client_kwargs=CLIENT)
    gap = gaps(recorder.matrix)
    # Measured: 7.46e-4 from round ~20 on; a fixed point, not slow progress.
    assert gap[-1] > 1e-4
    assert gap[40:].min() > 1e-4
    assert abs(gap[-1] - gap[-20]) <= 1e-3 * gap[-1]


def test_partial_participation_reaches_optimum_within_100_rounds() -> None:
    sampled: list[int] = []
    _, recorder, result = run_seed(
        textbook,
        100,
        client_kwargs=CLIENT,
        rho=0.1,
        fraction_fit=0.3,
        min_fit_clients=3,
        min_available_clients=10,
        on_round=lambda s, r: sampled.append(int(s.history[-1]["num_replies"])),
    )
    assert sampled == [3] * 100
    gap = gaps(recorder.matrix)
    reach = first_round_below(gap, 1e-6)
    assert reach is not None and reach <= 100, gap[-10:]
    assert result.fit_metrics[-1]["num_clients_cached"] == 10


def test_l1_matches_centralized_l1_solution() -> None:
    w_star = l1_optimum(pooled(), L1_STRENGTH)
    # KKT of min F + s||w||_1 (the reference is checked, not trusted).
    g = pooled().gradient(w_star)
    zero = w_star == 0.0
    assert 2 <= zero.sum() <= 10  # a regularizer that actually selects
    assert np.all(np.abs(g[zero]) < L1_STRENGTH * 0.95)
    assert np.abs(g[~zero] + L1_STRENGTH * np.sign(w_star[~zero])).max() <= 1e-12
    _, recorder, _ = run_seed(
        textbook, 60, client_kwargs=CLIENT, rho=0.1, regularizer=L1(L1_STRENGTH)
    )
    z = recorder.matrix[-1]
    np.testing.assert_array_equal(z == 0.0, zero)
    assert np.linalg.norm(z - w_star) <= 1e-5 * np.linalg.norm(w_star)


@pytest.mark.parametrize("rho0", [1e-3, 100.0])
def test_residual_balancing_recovers_from_a_bad_rho(rho0: float) -> None:
    _, recorder, result = run_seed(
        textbook, 40, client_kwargs=CLIENT, rho=rho0, rho_schedule=ResidualBalancing()
    )
    gap = gaps(recorder.matrix)
    reach = first_round_below(gap, 1e-6)
    assert reach is not None and reach <= 40, (
        gap[[9, 19, 39]],
        [m["rho"] for m in result.fit_metrics],
    )
    rhos = [float(m["rho"]) for m in result.fit_metrics]
    assert rhos[0] == rho0 and 1e-2 <= rhos[-1] <= 10.0  # it really moved rho


def test_untuned_residual_balancing_is_within_1_5x_of_tuned_fedadmm() -> None:
    """Issue 5, goal A on seed-logreg: ResidualBalancing() from rho0 = 1 at the task's
    default local settings vs the best grid point of `benchmarks.convergence`."""
    _, untuned, result = run_seed(
        textbook, 24, client_kwargs=CLIENT, rho=1.0, rho_schedule=ResidualBalancing()
    )
    _, tuned, _ = run_seed(
        textbook, 24, client_kwargs={"local_steps": 20, "learning_rate": 2.0}, rho=0.1
    )
    reach_untuned = first_round_below(gaps(untuned.matrix), 1e-6)
    reach_tuned = first_round_below(gaps(tuned.matrix), 1e-6)
    rhos = [float(m["rho"]) for m in result.fit_metrics]
    assert reach_untuned is not None and reach_untuned <= 18, rhos  # measured: 16
    assert reach_tuned is not None and reach_tuned <= 17  # measured: 16
    assert reach_untuned <= 1.5 * reach_tuned
    assert min(rhos) < 0.1  # rho really moved down from 1 (to 0.028 at round 4)


def test_over_relaxed_fedadmm_needs_a_third_of_the_best_grid_baseline_rounds() -> None:
    """Issue 5, goal B on seed-logreg: alpha = 1.6 at the grid point lr 2, 20 steps,
    rho 0.1 vs the best FedAvg of `benchmarks.convergence`'s grid (lr 4, 1 step)."""
    client = {"local_steps": 20, "learning_rate": 2.0}
    _, relaxed, result = run_seed(textbook, 12, client_kwargs=client, rho=0.1, relaxation=1.6)
    _, plain, _ = run_seed(textbook, 20, client_kwargs=client, rho=0.1)
    _, fedavg, _ = run_seed(FedAvg, 30, client_kwargs={"local_steps": 1, "learning_rate": 4.0})
    reach_relaxed = first_round_below(gaps(relaxed.matrix), 1e-6)
    reach_plain = first_round_below(gaps(plain.matrix), 1e-6)
    reach_fedavg = first_round_below(gaps(fedavg.matrix), 1e-6)
    assert reach_relaxed is not None and reach_relaxed <= 8  # measured: 8
    assert reach_plain is not None and reach_plain <= 17  # measured: 16
    assert reach_fedavg is not None and reach_fedavg >= 24  # measured: 26
    assert reach_relaxed <= reach_fedavg / 3
    # The residuals stay unrelaxed: w_i - z', so the stopping rule still means consensus.
    assert float(result.fit_metrics[-1]["primal_residual"]) < 1e-3


def test_fedavg_with_one_local_step_is_centralized_gradient_descent() -> None:
    """Documents the FedAvg baseline the issue quotes (and its limits, see above)."""
    client = {"local_steps": 1, "learning_rate": 2.0}
    _, recorder, _ = run_seed(FedAvg, 60, client_kwargs=client)
    w, descent = np.zeros(pooled().X.shape[1]), []
    for _ in range(60):
        w = w - 2.0 * pooled().gradient(w)
        descent.append(w.copy())
    np.testing.assert_allclose(recorder.matrix, np.array(descent), rtol=1e-10, atol=1e-14)
    assert first_round_below(gaps(recorder.matrix), 1e-6) == 57
    _, fast, _ = run_seed(FedAvg, 12, client_kwargs={"local_steps": 1, "learning_rate": 7.0})
    reach = first_round_below(gaps(fast.matrix), 1e-6)
    assert reach is not None and reach <= 10  # measured: 9 rounds
