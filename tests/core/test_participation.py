"""ConsensusADMM with partial participation: stale contributions, per-client rho, eviction.

References: the pooled ridge optimum from the normal equations, reached with 2 of 4
clients a round; the textbook scaled-form consensus ADMM of
`consensus_reference.ScaledReference`, recomputed over every client seen so far; hand
computations of the data-size rho_i and of its z formula; and, after an eviction, a core
rebuilt from the kept records alone.
"""

from __future__ import annotations

import copy

import numpy as np
import pytest
from consensus_reference import ScaledReference
from consensus_reference import clients as _clients
from consensus_reference import pooled_ridge as _pooled_ridge
from consensus_reference import rel as _rel
from consensus_reference import ridge_round as _ridge_round

from flwr_admm.core import ConsensusADMM
from flwr_admm.core.types import Reply

# ----------------------------------- partial participation reaches the pooled ridge


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


# ---------------------------------------------- stale contributions and reply order


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


# ------------------------------------------------------ per-client rho by data size


def test_evict_leaves_the_state_of_a_run_without_those_clients() -> None:
    # Hand-built case: after evicting c1, the sums are those of c0 and c2 alone, so
    # the next z-step equals that of a core that only ever held c0 and c2's records.
    rng = np.random.default_rng(0)
    admm = ConsensusADMM([np.zeros(4)], 0.5)
    for server_round in (1, 2):
        admm.step(
            [Reply(f"c{i}", [rng.normal(size=4)], 10 * (i + 1)) for i in range(3)], server_round
        )
    assert admm.evict(["c1", "unknown"]) == ["c1"]
    assert sorted(admm.records) == ["c0", "c2"]
    kept = ConsensusADMM([t.copy() for t in admm.z], 0.5)
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
