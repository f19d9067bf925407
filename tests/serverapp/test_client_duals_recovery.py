"""Message-API FedADMMClientDuals recovers from lost replies and lost node state.

Seed 000's task, 10 nodes, rho 0.1, 20 local steps, lr 1.0, the ready ClientApp
(`make_client_app` over `ADMMClient`), in process (`FaultyGrid`). The legacy strategy's
recovery tests (tests/server/test_client_duals_recovery.py) measured the same rounds:
a 1e-6 gap at round 17 with full participation, whatever the fault.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from flower_run import NUM_CLIENTS, admm_client_fn
from flwr.app import ArrayRecord, MetricRecord
from message_apps import ZRecorder, zeros
from message_duals import FaultyGrid
from seed_task import first_round_below, gaps

from flwr_admm import Uplink
from flwr_admm.clientapp import make_client_app
from flwr_admm.node.records import load_states
from flwr_admm.serverapp import FedADMMClientDuals
from flwr_admm.serverapp.testing import run_strategy
from flwr_admm.uplink import StochasticQuantizer

CLIENT = {"local_steps": 20, "learning_rate": 1.0}
ROUNDS = 40


class StaleRecorder(ZRecorder):
    """z of every round, and N_stale (the weight of S's stale shares) in its z-step."""

    def __init__(self, strategy: FedADMMClientDuals) -> None:
        super().__init__()
        self.strategy, self.stale = strategy, list[int]()

    def __call__(self, server_round: int, arrays: ArrayRecord) -> MetricRecord | None:
        self.stale.append(self.strategy.state.sweep.stale_examples)
        return super().__call__(server_round, arrays)


def run_recorded(
    faults: dict[int, dict[int, str]], rounds: int = ROUNDS, **kwargs: Any
) -> tuple[FedADMMClientDuals, StaleRecorder, FaultyGrid]:
    strategy = FedADMMClientDuals(
        rho=0.1, fraction_evaluate=0.0, min_available_nodes=NUM_CLIENTS, **kwargs
    )
    recorder = StaleRecorder(strategy)
    grid = FaultyGrid(make_client_app(admm_client_fn(**CLIENT)), NUM_CLIENTS, faults)
    run_strategy(strategy, grid, zeros(), rounds, evaluate_fn=recorder)
    return strategy, recorder, grid


def run(
    faults: dict[int, dict[int, str]], rounds: int = ROUNDS, **kwargs: Any
) -> tuple[FedADMMClientDuals, np.ndarray, FaultyGrid]:
    strategy, recorder, grid = run_recorded(faults, rounds, **kwargs)
    return strategy, recorder.matrix[1:], grid


def reached(z: np.ndarray, tol: float = 1e-6) -> int | None:
    return first_round_below(gaps(z), tol)


def quiet_after(strategy: FedADMMClientDuals, start: int) -> bool:
    late = strategy.history[start:]
    return all(h["num_rejected"] == 0 and h["num_state_mismatch"] == 0 for h in late)


def test_lost_replies_are_recovered_by_the_acknowledgement() -> None:
    strategy, z, _ = run({3: {3: "lost", 4: "lost"}})
    assert [h["num_replies"] for h in strategy.history[:5]] == [10, 10, 9, 9, 10]
    assert strategy.history[4]["num_state_mismatch"] == 0  # trained from its committed state
    assert reached(z) == 17  # as without the loss
    assert quiet_after(strategy, 0)


def test_a_nan_and_a_replayed_reply_are_rejected_and_the_node_comes_back() -> None:
    strategy, z, _ = run({4: {2: "nan"}, 5: {7: "replay"}})
    assert strategy.history[1]["num_rejected"] == 1
    assert strategy.history[6]["num_rejected"] == 1
    assert strategy.history[6]["num_state_mismatch"] == 1  # it reports round 6's state
    assert reached(z) == 17
    assert quiet_after(strategy, 10)


def test_a_node_that_lost_its_state_resyncs_and_the_sweep_rebuilds_s() -> None:
    strategy, z, grid = run({6: {4: "wipe"}})
    assert strategy.history[3]["num_resynced"] == 1
    assert [h["rebuilding"] for h in strategy.history[2:6]] == [0, 1, 0, 0]
    assert all(h["num_replies"] == NUM_CLIENTS for h in strategy.history)
    assert reached(z) == 17
    assert gaps(z)[-1] <= 1e-9
    expected = np.zeros(20)
    for context in grid.contexts.values():  # S = the sum of the nodes' current shares
        kept = load_states(context.state, [(20,)])
        assert kept.pending is not None
        expected += kept.pending.share[0]
    assert strategy.state.contribution_sum is not None
    np.testing.assert_allclose(strategy.state.contribution_sum[0], expected, rtol=0, atol=1e-9)


def test_lost_state_under_partial_participation() -> None:
    partial = {"fraction_train": 0.5, "min_train_nodes": 5}
    strategy, z, _ = run({1: {10: "wipe"}}, 120, **partial)
    _, baseline, _ = run({}, 120, **partial)
    assert reached(z) == reached(baseline) == 35  # the legacy strategy's rounds too
    rebuilding = [h["round"] for h in strategy.history if h["rebuilding"]]
    assert rebuilding == [10, 11, 12, 13]  # until every key was sampled once
    assert gaps(z)[-1] <= 1e-9


def test_lost_state_under_8_bit_compression_keeps_s_the_sum_of_shares() -> None:
    """S = sum_i (n_i c_i - e_i): the sweep's full shares follow the compressed changes."""
    strategy, z, grid = run({6: {4: "wipe"}}, uplink=Uplink(StochasticQuantizer(bits=8)))
    assert strategy.history[3]["num_resynced"] == 1
    assert [h["rebuilding"] for h in strategy.history[2:6]] == [0, 1, 0, 0]
    assert reached(z) == 17  # the legacy strategy's round with 8 bits and this wipe
    assert quiet_after(strategy, 0)
    expected = np.zeros(20)
    for context in grid.contexts.values():
        kept = load_states(context.state, [(20,)])
        assert kept.pending is not None and kept.pending.residual is not None
        expected += kept.pending.share[0]
    assert strategy.state.contribution_sum is not None
    np.testing.assert_allclose(strategy.state.contribution_sum[0], expected, rtol=0, atol=1e-9)
    assert all(h["uplink_bytes"] < 10 * 20 * 8 for h in strategy.history)


def test_a_node_wiped_every_round_adds_its_weight_once() -> None:
    """Memoryless node 2: each resync replaces its share (before: N_stale 39,500, gap 2.0e-2)."""
    strategy, recorder, grid = run_recorded({2: {r: "amnesia" for r in range(1, 81)}}, 80)
    assert all(h["num_resynced"] == 1 for h in strategy.history[1:])
    assert recorder.stale[1:3] == [0, 500] and max(recorder.stale[3:]) == 0  # [0]: round 0
    assert [h["rebuilding"] for h in strategy.history[:4]] == [0, 1, 0, 0]
    assert gaps(recorder.matrix[1:])[-1] <= 5e-3  # 1.3e-4, the legacy strategy's number
    expected = np.zeros(20)  # S = the sum of the nodes' shares (2's: its last F_2)
    for context in grid.contexts.values():
        kept = load_states(context.state, [(20,)])
        assert kept.pending is not None
        expected += kept.pending.share[0]
    assert strategy.state.contribution_sum is not None
    np.testing.assert_allclose(strategy.state.contribution_sum[0], expected, rtol=0, atol=1e-9)


def test_forged_resync_claims_cost_the_claimant_only() -> None:
    """Node 7 claims a resync every round from round 3: N_stale stays within its n."""
    strategy, recorder, _ = run_recorded({7: {r: "forge" for r in range(3, 41)}})
    assert all(h["num_resynced"] == 1 for h in strategy.history[2:])
    assert max(recorder.stale) <= 500  # its own share, once (before: 38 x 500 = 19,000)
    assert recorder.stale[-1] == 0 and strategy.state.total_examples == NUM_CLIENTS * 500
    assert sum(h["rebuilding"] for h in strategy.history) == 1
