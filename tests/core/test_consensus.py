"""ConsensusADMM's z-step with every client replying, against closed forms and solvers.

References: the pooled ridge optimum from the normal equations (`consensus_reference`),
Flower's own `aggregate` (rho = 0 is its weighted average), rounds computed by hand, and
scikit-learn's Lasso with its KKT conditions checked (L1); plus the errors, which leave
the state untouched, and 0-d tensors, which stay 0-d.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from consensus_reference import clients as _clients
from consensus_reference import pooled_ridge as _pooled_ridge
from consensus_reference import rel as _rel
from consensus_reference import ridge_local_argmin as _ridge_local_argmin
from consensus_reference import ridge_round as _ridge_round
from flwr.server.strategy.aggregate import aggregate
from sklearn.linear_model import Lasso

from flwr_admm.core import L1, AdaptiveDualStep, ConsensusADMM
from flwr_admm.core.sums import RunningSums
from flwr_admm.core.types import Reply

# ---------------------------------------------------------------- ridge closed form


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


# -------------------------------------------------------------------------- rho = 0


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


# ----------------------------------------------------------------- one step by hand


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


# --------------------------------------------------------------------------- errors


@pytest.mark.parametrize("rho", [-0.1, float("nan"), float("inf")])
def test_bad_rho_names_the_field(rho: float) -> None:
    with pytest.raises(ValueError, match=r"^rho: "):
        ConsensusADMM(z=[np.zeros(2)], rho=rho)


def test_rho_zero_with_regularizer_or_reported_rho_is_refused() -> None:
    with pytest.raises(ValueError, match=r"^rho: must be > 0"):
        ConsensusADMM(z=[np.zeros(2)], rho=0.0, regularizer=L1(0.1))
    with pytest.raises(ValueError, match=r"^rho: must be > 0"):
        ConsensusADMM(z=[np.zeros(2)], rho=0.0, client_rho="reported")
    with pytest.raises(ValueError, match=r"^client_rho: must be one of \['uniform', 'reported'\]"):
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


# ---------------------------------------------------------------------- L1 vs Lasso


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


@pytest.mark.parametrize("z_average", ["cached", "replies"])
def test_a_0d_tensor_moves_like_a_1_element_vector_under_partial_participation(
    z_average: str,
) -> None:
    # `S_w / S_s` of a 0-d tensor is a numpy scalar: the z-step's in-place S_y term
    # used to skip it, so S_y was ignored for 0-d tensors

    def run(shape: tuple[int, ...]) -> float:
        admm = ConsensusADMM(
            [np.zeros(shape)],
            rho=1.0,
            z_average=z_average,  # type: ignore[arg-type]
        )
        for k in range(5):
            chosen = range(4) if k == 0 else (k % 4, (k + 1) % 4)
            replies = [
                Reply(
                    f"c{i}",
                    [np.full(shape, 0.5 * float(np.ravel(admm.center(f"c{i}")[0])[0]) + i)],
                    10,
                )
                for i in chosen
            ]
            admm.step(replies, k + 1)
        assert isinstance(admm.z[0], np.ndarray) and admm.z[0].shape == shape
        return float(np.ravel(admm.z[0])[0])

    assert run(()) == run((1,))


def test_the_round_report_does_not_depend_on_the_blas_thread_count() -> None:
    """The residuals (and so rho's schedule) are summed single-threaded, in a fixed order.

    A threaded BLAS dot over a tensor this large sums in its own order per thread count,
    so the report's ||z - z'|| changed in the last bits with the caller's BLAS threads.
    """
    from threadpoolctl import threadpool_limits

    def reports(threads: int) -> list[tuple[float, ...]]:
        admm = ConsensusADMM([np.zeros(300_000)], rho=1.0)
        rng = np.random.default_rng(1)
        out = []
        for k in range(3):
            replies = [Reply(f"c{i}", [rng.normal(size=300_000)], 10 + i) for i in range(4)]
            with threadpool_limits(threads):
                report = admm.step(replies, k + 1)
            out.append(
                (report.primal_residual, report.dual_residual, report.eps_primal, report.eps_dual)
            )
        return out

    assert reports(1) == reports(2)


def test_a_state_with_float32_client_arrays_is_refused_naming_state_dtype() -> None:
    """state_dtype="float32" (deleted) wrote w_i and y_i as float32: refused, not widened."""
    admm = ConsensusADMM([np.zeros(3)], rho=1.0)
    admm.step([Reply("c0", [np.ones(3)], 10), Reply("c1", [np.full(3, 2.0)], 20)], 1)
    arrays, meta = admm.state_dict()
    resumed = ConsensusADMM([np.zeros(3)], rho=1.0)
    resumed.load_state_dict(arrays, meta)  # float64: loads
    np.testing.assert_array_equal(resumed.records["c1"].y[0], admm.records["c1"].y[0])
    narrow = {k: v.astype(np.float32) if k[:2] in ("w.", "y.") else v for k, v in arrays.items()}
    with pytest.raises(ValueError, match="written with state_dtype='float32', which this version"):
        resumed.load_state_dict(narrow, meta)


def test_a_state_written_with_a_deleted_acceleration_is_refused_naming_it() -> None:
    """The versions before wrote Anderson's memory under "anderson" and fast ADMM's
    momentum under "acceleration" ("to_previous": True for "goldstein", False for
    "nesterov", deleted last): each is refused by its name, not half-loaded."""
    admm = ConsensusADMM([np.zeros(3)], rho=1.0)
    admm.step([Reply("c0", [np.ones(3)], 10), Reply("c1", [np.full(3, 2.0)], 20)], 1)
    arrays, meta = admm.state_dict()
    fast = {"a": 1.0, "c_prev": None, "restarts": 0, "has_z_prev": False, "y_prev_keys": []}
    written = {
        "anderson": {**meta, "anderson": {"pairs": 0, "has_prev": False, "signature": None}},
        "goldstein": {**meta, "acceleration": {**fast, "to_previous": True}},
        "nesterov": {**meta, "acceleration": {**fast, "to_previous": False}},
    }
    resumed = ConsensusADMM([np.zeros(3)], rho=1.0)
    for deleted, old in written.items():
        with pytest.raises(ValueError, match=f"written with acceleration='{deleted}', which this"):
            resumed.load_state_dict(arrays, old)
    resumed.load_state_dict(arrays, meta)
    np.testing.assert_array_equal(resumed.z[0], admm.z[0])


def test_fedavg_mode_reports_no_dual_step() -> None:
    """rho = 0 takes no dual step: the round reports no gamma (it reported the adaptive
    rule's floor, 0.2, as if a step had been taken)."""
    admm = ConsensusADMM([np.zeros(3)], rho=0.0, dual_step=AdaptiveDualStep())
    for k in range(1, 4):
        report = admm.step([Reply("c0", [np.ones(3)], 10), Reply("c1", [np.full(3, 2.0)], 20)], k)
        assert report.dual_step is None
    admm = ConsensusADMM([np.zeros(3)], rho=0.5, dual_step=AdaptiveDualStep())
    report = admm.step([Reply("c0", [np.ones(3)], 10), Reply("c1", [np.full(3, 2.0)], 20)], 1)
    assert report.dual_step == 0.2


# ---------------------------------------------------------------- held duals
def test_holding_duals_at_zero_takes_only_their_share_out_of_s_y() -> None:
    """Stock FedProx handlers have y_i reset after every round: S_w is not re-summed, S_y
    only over the duals that moved (re-summing both over every cached client made each
    round of the one-line swap O(N x model)). Over 30 rounds of 40 cached clients, 5 of
    10 of each round's replies held: S_y stays sum n_i y_i, the held y_i are 0."""
    rng = np.random.default_rng(4)
    admm = ConsensusADMM(z=[np.zeros(6)], rho=0.5)
    keys = [f"c{i}" for i in range(40)]
    for k in range(1, 31):
        sampled = sorted(rng.choice(40, 10, replace=False)) if k > 4 else range(10 * k - 10, 10 * k)
        chosen = [keys[i] for i in sampled]
        admm.step([Reply(key, [rng.normal(size=6) + 0.1 * k], 5 + len(key)) for key in chosen], k)
        if k > 4:  # the first rounds fill the cache; then half of each round is held
            resummed = admm.sums.recompute
            admm.sums.recompute = None  # type: ignore[assignment]  # must not be called
            assert admm.reset_duals(chosen[::2]) == sorted(chosen[::2], key=lambda s: int(s[1:]))
            admm.sums.recompute = resummed  # type: ignore[method-assign]
            assert all(not np.any(admm.records[key].y[0]) for key in chosen[::2])
        exact = sum(r.num_examples * r.y[0] for r in admm.records.values())
        np.testing.assert_allclose(admm.sums.ny[0], exact, rtol=0, atol=1e-13)


def test_when_every_client_is_held_s_y_is_exactly_zero() -> None:
    """The one-line swap with every node a stock handler: S_y is 0 to the bit after each
    round, not the residue of the dual step's sum and the per-client subtractions (a
    residue that, with node-id keys in a random order, made Flower-engine runs of the
    CNN task differ from run to run)."""
    rng = np.random.default_rng(5)
    admm = ConsensusADMM(z=[np.zeros(7)], rho=0.3)
    keys = [f"cid:{rng.integers(1 << 62)}" for _ in range(10)]
    for k in range(1, 6):
        admm.step([Reply(key, [rng.normal(size=7)], 3 + i) for i, key in enumerate(keys)], k)
        admm.reset_duals(keys)
        assert not np.any(admm.sums.ny[0]), admm.sums.ny[0]


def test_held_duals_leave_s_y_as_a_full_re_sum_would_bit_for_bit() -> None:
    """Partial participation, some replies held, some not (mixed handlers), and a
    checkpoint round trip: after every reset S_y equals the exact key-order re-sum over
    every cached client, and only the duals that moved are summed."""
    rng = np.random.default_rng(6)
    admm = ConsensusADMM(z=[np.zeros(5)], rho=0.7)
    keys = [f"cid:{rng.integers(1 << 62)}" for _ in range(12)]
    for k in range(1, 16):
        chosen = [keys[i] for i in sorted(rng.choice(12, 6, replace=False))]
        admm.step([Reply(key, [rng.normal(size=5)], 4 + len(key) % 7) for key in chosen], k)
        admm.reset_duals(chosen[::3] if k % 2 else chosen)  # some held; all replies held
        reference = RunningSums([np.zeros(5)], [np.zeros(5)])
        reference.recompute(admm.records)
        np.testing.assert_array_equal(admm.sums.ny[0], reference.ny[0])
        assert admm.sums.moving == reference.moving
        if k == 8:  # a resumed server keeps which duals move
            arrays, meta = admm.state_dict()
            admm = ConsensusADMM(z=[np.zeros(5)], rho=0.7)
            admm.load_state_dict({name: np.array(a) for name, a in arrays.items()}, meta)
