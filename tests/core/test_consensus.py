"""ConsensusADMM against closed forms, hand computations and centralized solvers."""

from __future__ import annotations

import copy
import math

import numpy as np
import pytest
from flwr.server.strategy.aggregate import aggregate
from sklearn.linear_model import Lasso

from flwr_admm import L1, L2, ConsensusADMM, Geometric, Reply


def _rel(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


def _clients(sizes: list[int], d: int, seed: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """Non-IID linear data: every client has its own true weight vector."""
    rng = np.random.default_rng(seed)
    base = rng.normal(size=d)
    data = []
    for n in sizes:
        X = rng.normal(loc=rng.normal(), size=(n, d))
        theta = base + rng.normal(scale=1.0, size=d)
        data.append((X, X @ theta + 0.1 * rng.normal(size=n)))
    return data


def _ridge_local_argmin(X, y, lam: float, rho: float, v: np.ndarray) -> np.ndarray:
    """argmin_w 1/(2n)||X w - y||^2 + lam/2||w||^2 + rho/2||w - v||^2 (normal equations)."""
    n, d = X.shape
    return np.linalg.solve(X.T @ X / n + (lam + rho) * np.eye(d), X.T @ y / n + rho * v)


def _pooled_ridge(data, lam: float) -> np.ndarray:
    """argmin_w sum_i p_i f_i(w) = 1/(2N)||X w - y||^2 + lam/2||w||^2 on the pooled data."""
    X = np.vstack([X for X, _ in data])
    y = np.concatenate([y for _, y in data])
    N, d = X.shape
    return np.linalg.solve(X.T @ X / N + lam * np.eye(d), X.T @ y / N)


def _ridge_round(admm: ConsensusADMM, data, lam: float, keys, server_round: int):
    replies = []
    for key in keys:
        X, y = data[int(key[1:])]
        rho_i = admm.rho_for(key)
        v = admm.center(key)[0]
        replies.append(Reply(key, [_ridge_local_argmin(X, y, lam, rho_i, v)], X.shape[0]))
    return admm.step(replies, server_round)


# ------------------------------------------------------------ (1) ridge closed form


def test_exact_local_solves_reach_the_pooled_ridge_solution() -> None:
    lam, sizes = 0.1, [20, 35, 80]
    data = _clients(sizes, d=4, seed=1)
    optimum = _pooled_ridge(data, lam)
    # the unweighted mean of the local optima is a different point: weighting matters
    local = [_ridge_local_argmin(X, y, lam, 0.0, np.zeros(4)) for X, y in data]
    assert _rel(np.mean(local, axis=0), optimum) > 1e-2
    admm = ConsensusADMM(z=[np.zeros(4)], rho=1.0, eps_abs=1e-12, eps_rel=1e-12)
    keys = ["c0", "c1", "c2"]
    for k in range(1, 301):
        report = _ridge_round(admm, data, lam, keys, k)
        if _rel(admm.z[0], optimum) < 1e-12:
            break
    assert _rel(admm.z[0], optimum) < 1e-10
    assert report.primal_residual < 1e-9 and report.dual_residual < 1e-9
    for key in keys:  # the local models agree with z at the fixed point
        w = _ridge_local_argmin(*data[int(key[1:])], lam, 1.0, admm.center(key)[0])
        assert _rel(w, optimum) < 1e-9


def test_partial_participation_still_reaches_the_pooled_ridge_solution() -> None:
    lam, sizes = 0.05, [15, 40, 25, 60]
    data = _clients(sizes, d=3, seed=2)
    optimum = _pooled_ridge(data, lam)
    admm = ConsensusADMM(z=[np.zeros(3)], rho=5.0)
    rng = np.random.default_rng(3)
    _ridge_round(admm, data, lam, ["c0", "c1", "c2", "c3"], 1)
    for k in range(2, 600):  # 2 of 4 clients a round; about 270 rounds reach 1e-10
        keys = [f"c{i}" for i in sorted(rng.choice(4, size=2, replace=False))]
        _ridge_round(admm, data, lam, keys, k)
        if _rel(admm.z[0], optimum) < 1e-10:
            break
    assert _rel(admm.z[0], optimum) < 1e-9


# ----------------------------------------------------------------- (2) rho = 0


def test_rho_zero_is_flower_weighted_average() -> None:
    rng = np.random.default_rng(4)
    z0 = [np.zeros((3, 2)), np.zeros(2)]
    admm = ConsensusADMM(z=[t.copy() for t in z0], rho=0.0)
    sizes = {"a": 7, "b": 13, "c": 101}
    for k in (1, 2, 3):
        models = {key: [rng.normal(size=(3, 2)) * 10, rng.normal(size=2)] for key in sizes}
        # rho = 0: every client is sent z itself (y stays zero)
        for key in sizes:
            for center, z in zip(admm.center(key), admm.z, strict=True):
                np.testing.assert_array_equal(center, z)
        admm.step([Reply(key, models[key], n) for key, n in sizes.items()], k)
        expected = aggregate([(models[key], n) for key, n in sizes.items()])
        for got, ref in zip(admm.z, expected, strict=True):
            assert np.linalg.norm(got - ref) <= 1e-15 * np.linalg.norm(ref)
            np.testing.assert_allclose(got, ref, rtol=1e-15, atol=1e-15 * np.abs(ref).max())


# ---------------------------------------------------------- (3) one step by hand


def test_two_clients_one_dimension_by_hand() -> None:
    admm = ConsensusADMM(z=[np.array([0.0])], rho=2.0, eps_abs=0.1, eps_rel=0.01)
    # round 1: w_a = 1 (n=1), w_b = 5 (n=3); p = (1/4, 3/4); y = 0
    report = admm.step(
        [Reply("a", [np.array([1.0])], 1, loss=1.0), Reply("b", [np.array([5.0])], 3, loss=3.0)],
        server_round=1,
    )
    # z = 1/4 * 1 + 3/4 * 5 = 4
    assert admm.z[0][0] == 4.0
    # y_a = 2 (1 - 4) = -6, y_b = 2 (5 - 4) = 2; centers v = z - y / rho: 7 and 3
    assert admm.center("a")[0][0] == 7.0
    assert admm.center("b")[0][0] == 3.0
    # r = sqrt(1/4 * 9 + 3/4 * 1) = sqrt(3); s = rho |4 - 0| = 8
    assert report.primal_residual == pytest.approx(math.sqrt(3.0), rel=1e-15)
    assert report.dual_residual == 8.0
    # eps_pri = sqrt(1) 0.1 + 0.01 max(sqrt(1/4 + 3/4 * 25) = sqrt(19), 4)
    assert report.eps_primal == pytest.approx(0.1 + 0.01 * math.sqrt(19.0), rel=1e-15)
    # eps_dual = 0.1 + 0.01 sqrt(1/4 * 36 + 3/4 * 4) = 0.1 + 0.01 sqrt(12)
    assert report.eps_dual == pytest.approx(0.1 + 0.01 * math.sqrt(12.0), rel=1e-15)
    # objective = (1 * 1 + 3 * 3) / 4 = 2.5
    assert report.objective == pytest.approx(2.5, rel=1e-15)
    assert (report.rho, report.next_rho) == (2.0, 2.0)
    assert (report.num_replies, report.num_clients_cached) == (2, 2)
    assert not report.converged

    # round 2: w_a = 2, w_b = 4
    report = admm.step(
        [Reply("a", [np.array([2.0])], 1), Reply("b", [np.array([4.0])], 3)], server_round=2
    )
    # z = 1/4 (2 + (-6)/2) + 3/4 (4 + 2/2) = -1/4 + 15/4 = 3.5
    assert admm.z[0][0] == pytest.approx(3.5, rel=1e-15)
    # y_a = -6 + 2 (2 - 3.5) = -9, y_b = 2 + 2 (4 - 3.5) = 3  ->  v_a = 3.5 + 4.5 = 8,
    # v_b = 3.5 - 1.5 = 2
    assert admm.center("a")[0][0] == pytest.approx(8.0, rel=1e-15)
    assert admm.center("b")[0][0] == pytest.approx(2.0, rel=1e-15)
    # r = sqrt(1/4 * 2.25 + 3/4 * 0.25) = sqrt(0.75); s = 2 |3.5 - 4| = 1
    assert report.primal_residual == pytest.approx(math.sqrt(0.75), rel=1e-15)
    assert report.dual_residual == pytest.approx(1.0, rel=1e-15)
    # eps_pri = 0.1 + 0.01 max(sqrt(1/4 * 4 + 3/4 * 16) = sqrt(13), 3.5)
    assert report.eps_primal == pytest.approx(0.1 + 0.01 * math.sqrt(13.0), rel=1e-15)
    # eps_dual = 0.1 + 0.01 sqrt(1/4 * 81 + 3/4 * 9) = 0.1 + 0.01 sqrt(27)
    assert report.eps_dual == pytest.approx(0.1 + 0.01 * math.sqrt(27.0), rel=1e-15)
    assert report.objective is None  # losses were not reported


def test_converged_flag_uses_both_thresholds() -> None:
    admm = ConsensusADMM(z=[np.array([1.0])], rho=1.0, eps_abs=1e-3, eps_rel=0.0)
    # w_a = w_b = z = 1: r = 0 and s = 0 -> converged
    report = admm.step([Reply("a", [np.array([1.0])], 1), Reply("b", [np.array([1.0])], 1)], 1)
    assert report.primal_residual == 0.0 and report.dual_residual == 0.0
    assert report.converged
    # w_a = 1, w_b = 1.004: z = 1.002, r = 0.002 > 1e-3 -> not converged
    report = admm.step([Reply("a", [np.array([1.0])], 1), Reply("b", [np.array([1.004])], 1)], 2)
    assert report.primal_residual == pytest.approx(0.002, rel=1e-9)
    assert not report.converged


def test_objective_adds_the_regularizer_at_the_new_z() -> None:
    admm = ConsensusADMM(z=[np.array([0.0, 0.0])], rho=1.0, regularizer=L1(0.5))
    report = admm.step(
        [
            Reply("a", [np.array([2.0, 0.2])], 1, loss=4.0),
            Reply("b", [np.array([4.0, -0.2])], 3, loss=2.0),
        ],
        1,
    )
    # prox argument (1/4)(2, 0.2) + (3/4)(4, -0.2) = (3.5, -0.1); soft-threshold at 0.5
    np.testing.assert_array_equal(admm.z[0], [3.0, 0.0])
    # objective = (1 * 4 + 3 * 2) / 4 + 0.5 * |3| = 2.5 + 1.5
    assert report.objective == pytest.approx(4.0, rel=1e-15)


# --------------------------------------------------- (4) partial participation


class ScaledReference:
    """Textbook consensus ADMM in scaled form over all clients seen so far (Boyd 7.1).

    z = sum_i p_i (w_i + u_i), u_i += w_i - z for repliers, then u *= rho_old / rho_new.
    """

    def __init__(self, d: int) -> None:
        self.w: dict[str, np.ndarray] = {}
        self.u: dict[str, np.ndarray] = {}
        self.n: dict[str, int] = {}
        self.z = np.zeros(d)

    def step(self, replies: dict[str, tuple[np.ndarray, int]], rho_old: float, rho_new: float):
        for key, (w, n) in replies.items():
            self.w[key], self.n[key] = w, n
            self.u.setdefault(key, np.zeros_like(w))
        total = sum(self.n.values())
        self.z = sum(self.n[k] * (self.w[k] + self.u[k]) for k in self.w) / total
        for key in replies:
            self.u[key] = self.u[key] + self.w[key] - self.z
        for key in self.u:
            self.u[key] = self.u[key] * (rho_old / rho_new)

    def center(self, key: str) -> np.ndarray:
        return self.z - self.u[key] if key in self.u else self.z


def test_stale_contributions_keep_counting_and_match_a_recomputation() -> None:
    rng = np.random.default_rng(5)
    d, rho = 3, 0.7
    admm = ConsensusADMM(z=[np.zeros(d)], rho=rho)
    ref = ScaledReference(d)
    sizes = {f"c{i}": int(rng.integers(5, 200)) for i in range(6)}
    for k in range(1, 121):
        if k == 1:
            keys = ["c0", "c1", "c2"]  # c3..c5 join later
        else:
            keys = sorted(rng.choice(list(sizes), size=int(rng.integers(1, 4)), replace=False))
        if k % 17 == 0:
            sizes[keys[0]] += 3  # a client's data size may change between rounds
        replies = {}
        for key in keys:
            # a local model near the center it was sent, far from the origin
            w = ref.center(key) + 100.0 + rng.normal(size=d)
            replies[key] = (w, sizes[key])
        admm.step([Reply(key, [w], n) for key, (w, n) in replies.items()], k)
        ref.step(replies, rho, rho)
        scale = np.abs(ref.z).max()
        np.testing.assert_allclose(admm.z[0], ref.z, rtol=0, atol=1e-12 * scale)
        for key in ref.u:
            np.testing.assert_allclose(admm.center(key)[0], ref.center(key), atol=1e-12 * scale)
    assert admm.z[0].min() > 1000.0  # the offsets accumulated: sums are large, drift would show
    assert len(admm.records) == 6


def test_stale_client_changes_z_compared_with_fresh_only_average() -> None:
    admm = ConsensusADMM(z=[np.array([0.0])], rho=0.0, eps_abs=0.01, eps_rel=0.1)
    admm.step([Reply("a", [np.array([2.0])], 1), Reply("b", [np.array([4.0])], 1)], 1)
    report = admm.step([Reply("b", [np.array([10.0])], 1)], 2)
    # a's stale w = 2 still counts: z = (2 + 10) / 2 = 6, not 10
    assert admm.z[0][0] == 6.0
    assert (report.num_replies, report.num_clients_cached) == (1, 2)
    report = admm.step([Reply("b", [np.array([0.5])], 1)], 3)
    # z = (2 + 0.5) / 2 = 1.25; residuals over the repliers only: r = |0.5 - 1.25|
    assert admm.z[0][0] == 1.25
    assert report.primal_residual == 0.75
    assert report.dual_residual == 0.0  # rho = 0
    # eps_pri = 0.01 + 0.1 max(||w_b|| = 0.5, ||z|| = 1.25)
    assert report.eps_primal == pytest.approx(0.01 + 0.125, rel=1e-15)


def test_result_does_not_depend_on_reply_order() -> None:
    rng = np.random.default_rng(9)
    sizes = {f"c{i}": int(rng.integers(1, 50)) for i in range(12)}
    rounds = []
    for _ in range(40):
        keys = list(rng.choice(list(sizes), size=int(rng.integers(2, 8)), replace=False))
        rounds.append({key: rng.normal(size=3) * 10 for key in keys})
    runs = []
    for shuffle in (False, True):
        admm = ConsensusADMM(z=[np.zeros(3)], rho=0.3)
        order_rng = np.random.default_rng(10)
        for k, replies in enumerate(rounds, start=1):
            keys = list(replies)
            if shuffle:
                order_rng.shuffle(keys)
            admm.step([Reply(key, [replies[key]], sizes[key]) for key in keys], k)
        runs.append((admm.z[0].copy(), {key: admm.center(key)[0].copy() for key in sizes}))
    # bit-identical: the reductions run in sorted key order whatever the arrival order
    np.testing.assert_array_equal(runs[0][0], runs[1][0])
    for key in sizes:
        np.testing.assert_array_equal(runs[0][1][key], runs[1][1][key])


# ----------------------------------------------------- (5) per-client rho by size


def test_data_size_rho_multipliers_and_z_formula() -> None:
    rho, lam = 2.0, 0.5
    n = {"a": 10, "b": 20, "c": 40}
    admm = ConsensusADMM(z=[np.array([0.0])], rho=rho, client_rho="data_size", regularizer=L2(lam))
    w1 = {"a": 1.0, "b": 2.0, "c": 4.0}
    admm.step([Reply(k, [np.array([w1[k]])], n[k]) for k in n], 1)
    # s_i = n_i / max n = (1/4, 1/2, 1): rho_i = (0.5, 1, 2)
    assert [admm.rho_for(k) for k in n] == [0.5, 1.0, 2.0]
    # rho_bar = sum p_i rho_i = (10*0.5 + 20*1 + 40*2) / 70 = 1.5
    # z = sum p_i rho_i w_i / (rho_bar + lam) = (5*1 + 20*2 + 80*4) / 70 / 2 = 365 / 140
    z1 = 365.0 / 140.0
    assert admm.z[0][0] == pytest.approx(z1, rel=1e-15)
    y = {k: admm.rho_for(k) * (w1[k] - z1) for k in n}
    for k in n:  # v_i = z - y_i / rho_i = 2 z - w_i
        assert admm.center(k)[0][0] == pytest.approx(2 * z1 - w1[k], rel=1e-14)
    w2 = {"a": 0.0, "b": 3.0, "c": 5.0}
    report = admm.step([Reply(k, [np.array([w2[k]])], n[k]) for k in n], 2)
    # z minimizes lam/2 z^2 + sum_i p_i (-y_i z + rho_i/2 (w_i - z)^2):
    # z = sum_i p_i (rho_i w_i + y_i) / (lam + rho_bar)
    z2 = sum(n[k] * (admm.rho_for(k) * w2[k] + y[k]) for k in n) / 70.0 / (lam + 1.5)
    assert admm.z[0][0] == pytest.approx(z2, rel=1e-14)
    assert report.dual_residual == pytest.approx(1.5 * abs(z2 - z1), rel=1e-13)
    for k in n:
        y[k] += admm.rho_for(k) * (w2[k] - z2)
        assert admm.center(k)[0][0] == pytest.approx(z2 - y[k] / admm.rho_for(k), rel=1e-13)


def test_data_size_rho_new_largest_client_rescales_everyone() -> None:
    admm = ConsensusADMM(z=[np.array([0.0])], rho=1.0, client_rho="data_size")
    admm.step([Reply("a", [np.array([1.0])], 10), Reply("b", [np.array([3.0])], 20)], 1)
    assert (admm.rho_for("a"), admm.rho_for("b")) == (0.5, 1.0)
    admm.step([Reply("c", [np.array([5.0])], 40)], 2)
    assert [admm.rho_for(k) for k in "abc"] == [0.25, 0.5, 1.0]
    # y_a = 0.5 (1 - z1), y_b = 1 (3 - z1), z1 = (10*0.5*1 + 20*1*3) / (5 + 20) = 2.6
    # round 2: S = sum n_i (rho_i w_i + y_i) over a, b (stale) and c (new, y = 0)
    z1 = 2.6
    y_a, y_b = 0.5 * (1.0 - z1), 1.0 * (3.0 - z1)
    numerator = 10 * (0.25 * 1.0 + y_a) + 20 * (0.5 * 3.0 + y_b) + 40 * (1.0 * 5.0)
    rho_bar = (10 * 0.25 + 20 * 0.5 + 40 * 1.0) / 70
    assert admm.z[0][0] == pytest.approx(numerator / 70 / rho_bar, rel=1e-14)


def test_data_size_rho_reaches_the_pooled_ridge_solution() -> None:
    lam, sizes = 0.1, [10, 30, 90]
    data = _clients(sizes, d=3, seed=6)
    optimum = _pooled_ridge(data, lam)
    admm = ConsensusADMM(z=[np.zeros(3)], rho=1.0, client_rho="data_size")
    for k in range(1, 500):
        _ridge_round(admm, data, lam, ["c0", "c1", "c2"], k)
        if _rel(admm.z[0], optimum) < 1e-12:
            break
    assert _rel(admm.z[0], optimum) < 1e-10


# ------------------------------------------------------- (6) rho schedule rescaling


def test_rho_change_rescales_the_scaled_dual() -> None:
    admm = ConsensusADMM(z=[np.array([0.0])], rho=1.0, schedule=Geometric(factor=4.0))
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
    schedule = Geometric(factor=0.5, every=3, rho_min=1e-3)
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


# ----------------------------------------------------------------- (7) errors


@pytest.mark.parametrize("rho", [-0.1, float("nan"), float("inf")])
def test_bad_rho_names_the_field(rho: float) -> None:
    with pytest.raises(ValueError, match=r"^rho: "):
        ConsensusADMM(z=[np.zeros(2)], rho=rho)


def test_rho_zero_with_regularizer_or_data_size_is_refused() -> None:
    with pytest.raises(ValueError, match=r"^rho: must be > 0"):
        ConsensusADMM(z=[np.zeros(2)], rho=0.0, regularizer=L1(0.1))
    with pytest.raises(ValueError, match=r"^rho: must be > 0"):
        ConsensusADMM(z=[np.zeros(2)], rho=0.0, client_rho="data_size")
    with pytest.raises(ValueError, match=r"^client_rho: must be one of \['uniform', 'data_size'\]"):
        ConsensusADMM(z=[np.zeros(2)], rho=1.0, client_rho="size")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"^eps_rel: "):
        ConsensusADMM(z=[np.zeros(2)], rho=1.0, eps_rel=-1.0)


def _state(admm: ConsensusADMM) -> tuple:
    return (admm.z[0].copy(), sorted(admm.records), admm.rho)


@pytest.mark.parametrize(
    ("replies", "pattern"),
    [
        ([], r"^replies: need at least one"),
        ([Reply("a", [np.zeros(2)], 1), Reply("a", [np.ones(2)], 1)], r"^replies: .*unique"),
        (
            [Reply("a", [np.zeros(2)], 1), Reply("b", [np.zeros(3)], 1)],
            r"^reply 'b'\[0\]: expected shape \(2,\), got \(3,\)",
        ),
        ([Reply("a", [np.zeros(2), np.zeros(1)], 1)], r"^reply 'a': expected 1 arrays, got 2"),
        (
            [Reply("a", [np.zeros(2)], 1), Reply("b", [np.zeros(2)], 0)],
            r"^reply 'b': num_examples must be > 0",
        ),
        ([Reply("a", [np.zeros(2)], -3)], r"^reply 'a': num_examples must be > 0"),
    ],
)
def test_bad_replies_are_refused_without_touching_the_state(replies, pattern: str) -> None:
    admm = ConsensusADMM(z=[np.array([1.0, 2.0])], rho=1.0)
    admm.step([Reply("old", [np.array([3.0, 4.0])], 2)], 1)
    before = _state(admm)
    with pytest.raises(ValueError, match=pattern):
        admm.step(replies, 2)
    after = _state(admm)
    np.testing.assert_array_equal(after[0], before[0])
    assert after[1:] == before[1:]
    # the state still works: a valid step afterwards gives the hand-computed z
    # old: w = (3, 4), u = 0 (it was alone, z = w); new: "x" w = (1, 0), n = 2
    admm.step([Reply("x", [np.array([1.0, 0.0])], 2)], 2)
    np.testing.assert_allclose(admm.z[0], [2.0, 2.0], rtol=1e-15)


@pytest.mark.parametrize("keys", [["a", "b", "c"], ["a", "c"]], ids=["full", "incremental"])
@pytest.mark.parametrize("bad", [np.nan, np.inf, 1e200])
def test_non_finite_reply_is_refused_while_folding_and_leaves_the_round_intact(
    keys: list[str], bad: float
) -> None:
    from flwr_admm.core.consensus import NonFiniteReplyError

    rng = np.random.default_rng(11)
    models = {k: [rng.normal(size=(1 << 17) + 5), rng.normal(size=3)] for k in "abc"}
    sizes = {"a": 4, "b": 9, "c": 6}
    twins = [ConsensusADMM(z=[np.zeros((1 << 17) + 5), np.zeros(3)], rho=0.7) for _ in range(2)]
    for admm in twins:  # round 1: everyone, so round 2 is "full" or "incremental"
        admm.step([Reply(k, models[k], n) for k, n in sizes.items()], 1)
    fresh = {k: [t + rng.normal(size=t.shape) for t in models[k]] for k in keys}
    poisoned = [t.copy() for t in fresh["b" if "b" in keys else "c"]]
    poisoned[0][(1 << 17) + 1] = bad  # in the second block: the first is folded already
    poisoned_key = "b" if "b" in keys else "c"
    reports = []
    for index, admm in enumerate(twins):
        admm.begin(keys)
        for key in keys:
            if key == poisoned_key and index == 0:
                with pytest.raises(NonFiniteReplyError, match=rf"^reply '{key}': contains NaN"):
                    admm.absorb(Reply(key, poisoned, sizes[key] + 1))
            elif key != poisoned_key:
                admm.absorb(Reply(key, fresh[key], sizes[key]))
        reports.append(admm.finish(2))
    first, second = twins
    np.testing.assert_allclose(first.z[0], second.z[0], rtol=1e-14, atol=1e-14)
    np.testing.assert_allclose(first.z[1], second.z[1], rtol=1e-14, atol=1e-14)
    for key in "abc":
        for a, b in zip(first.records[key].y, second.records[key].y, strict=True):
            np.testing.assert_allclose(a, b, rtol=1e-14, atol=1e-14)
        assert first.records[key].num_examples == sizes[key]
    assert reports[0].num_replies == reports[1].num_replies == len(keys) - 1
    if keys == ["a", "b", "c"]:  # "full": the roll-back re-sums in order, bit for bit
        np.testing.assert_array_equal(first.z[0], second.z[0])


def test_adopt_consensus_checks_shapes() -> None:
    admm = ConsensusADMM(z=[np.zeros(2)], rho=1.0)
    with pytest.raises(ValueError, match=r"^parameters\[0\]: expected shape"):
        admm.adopt_consensus([np.zeros(3)])


# ------------------------------------------------------- (7b) over-relaxation


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


@pytest.mark.parametrize("client_rho", ["uniform", "data_size"])
def test_over_relaxation_with_partial_participation_reaches_the_pooled_ridge(
    client_rho: str,
) -> None:
    lam, sizes = 0.05, [15, 40, 25, 60]
    data = _clients(sizes, d=3, seed=2)
    optimum = _pooled_ridge(data, lam)
    admm = ConsensusADMM(z=[np.zeros(3)], rho=5.0, relaxation=1.7, client_rho=client_rho)
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


# ------------------------------------------------------------ (8) L1 vs Lasso


def _lasso_data():
    rng = np.random.default_rng(8)
    d = 8
    theta = np.array([3.0, -2.0, 0.0, 0.0, 1.5, 0.0, 0.0, 0.0])
    data = []
    for n in (30, 50, 80):
        X = rng.normal(size=(n, d))
        data.append((X, X @ theta + 0.5 * rng.normal(size=n)))
    return data


def test_l1_matches_the_centralized_lasso_with_exact_zeros() -> None:
    alpha, rho = 0.1, 1.0
    data = _lasso_data()
    X = np.vstack([X for X, _ in data])
    y = np.concatenate([y for _, y in data])
    N = X.shape[0]
    # sklearn Lasso: 1/(2N) ||y - X w||^2 + alpha ||w||_1 = sum_i p_i f_i(w) + alpha ||w||_1
    lasso = Lasso(alpha=alpha, fit_intercept=False, tol=1e-15, max_iter=1_000_000).fit(X, y)
    reference = lasso.coef_
    zeros = reference == 0.0
    assert 1 <= zeros.sum() <= 6
    # sanity of the reference: KKT conditions with a strict margin on the zeros
    gradient = X.T @ (X @ reference - y) / N
    np.testing.assert_allclose(gradient[~zeros], -alpha * np.sign(reference[~zeros]), atol=1e-9)
    assert np.all(np.abs(gradient[zeros]) < 0.9 * alpha)

    admm = ConsensusADMM(z=[np.zeros(8)], rho=rho, regularizer=L1(alpha))
    keys = ["c0", "c1", "c2"]
    for k in range(1, 1000):
        replies = []
        for key in keys:
            Xi, yi = data[int(key[1:])]
            replies.append(
                Reply(
                    key, [_ridge_local_argmin(Xi, yi, 0.0, rho, admm.center(key)[0])], Xi.shape[0]
                )
            )
        admm.step(replies, k)
        if _rel(admm.z[0], reference) < 1e-9:
            break
    z = admm.z[0]
    np.testing.assert_array_equal(z == 0.0, zeros)
    np.testing.assert_allclose(z[~zeros], reference[~zeros], rtol=1e-5)
    assert _rel(z, reference) < 1e-6


@pytest.mark.parametrize("num_clients", [1, 3])
def test_a_0d_tensor_stays_0d_in_records_centers_and_z(num_clients: int) -> None:
    # np.ascontiguousarray turns 0-d arrays into shape (1,): a BatchNorm
    # num_batches_tracked then no longer loads into the model it came from.
    admm = ConsensusADMM([np.zeros(2), np.array(0.0)], 0.5)
    for server_round in (1, 2, 3):
        replies = [
            Reply(f"c{i}", [np.full(2, i + 1.0), np.array(float(i + server_round))], 10)
            for i in range(num_clients)
        ]
        admm.step(replies, server_round)
        assert [t.shape for t in admm.z] == [(2,), ()]
        for key, record in admm.records.items():
            assert [t.shape for t in record.w] == [(2,), ()]
            assert [t.shape for t in record.y] == [(2,), ()]
            assert [t.shape for t in admm.center(key)] == [(2,), ()]


@pytest.mark.parametrize("client_rho", ["uniform", "data_size"])
def test_evict_leaves_the_state_of_a_run_without_those_clients(client_rho: str) -> None:
    # Hand-built case: after evicting c1, the sums are those of c0 and c2 alone, so
    # the next z-step equals that of a core that only ever held c0 and c2's records.
    rng = np.random.default_rng(0)
    admm = ConsensusADMM([np.zeros(4)], 0.5, client_rho=client_rho)
    for server_round in (1, 2):
        admm.step(
            [Reply(f"c{i}", [rng.normal(size=4)], 10 * (i + 1)) for i in range(3)], server_round
        )
    assert admm.evict(["c1", "unknown"]) == ["c1"]
    assert sorted(admm.records) == ["c0", "c2"]
    kept = ConsensusADMM([t.copy() for t in admm.z], 0.5, client_rho=client_rho)
    kept.records = copy.deepcopy(admm.records)  # the same records, not shared objects
    kept.sums.recompute(kept.records)
    reply = [Reply("c0", [np.ones(4)], 10)]
    ours, theirs = admm.step(reply, 3), kept.step(reply, 3)
    np.testing.assert_allclose(admm.z[0], kept.z[0], rtol=1e-15, atol=1e-15)
    assert ours.primal_residual == pytest.approx(theirs.primal_residual, rel=1e-14)
    n = sum(r.num_examples for r in admm.records.values())
    assert admm.sums.n == n


def test_evict_refuses_an_open_round() -> None:
    admm = ConsensusADMM([np.zeros(2)], 0.5)
    admm.begin(["a"])
    with pytest.raises(ValueError, match="evict"):
        admm.evict(["a"])
