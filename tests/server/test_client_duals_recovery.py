"""FedADMMClientDuals recovers from replies it never used and from lost client state.

Seed 000's task, 10 clients, full participation, rho 0.1, 20 local steps, lr 1.0.
A reply can be lost after the client trained and saved its state (a timeout), be
replayed, or be rejected (a transient NaN); a client's state can be lost
(a SuperNode restart). The server acknowledges, per client, which contribution S
holds; the client keeps its previous state until acknowledged, and a client whose
state is gone resynchronizes with its full contribution while the server rebuilds S
without the stale one. Each test failed before the acknowledgement existed.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import flower_run
import numpy as np
from flower_run import NUM_CLIENTS, admm_client_fn, zeros_parameters
from flwr.common import FitIns, FitRes, RecordDict
from seed_task import first_round_below, gaps

from flwr_admm import Checkpointing, Uplink
from flwr_admm.node.records import load_states
from flwr_admm.protocol import (
    DELAYED_SQ_RESIDUAL,
    EXAMPLES_CHANGE,
    PREVIOUS_ROUND,
    RESTORE,
    RESTORE_EXAMPLES,
    RESYNC,
)
from flwr_admm.rounds.client_duals_sweep import RebuildSweep
from flwr_admm.server import FedADMMClientDuals
from flwr_admm.testing import InProcessClientProxy, make_proxies, run_rounds
from flwr_admm.uplink import StochasticQuantizer

CLIENT = {"local_steps": 20, "learning_rate": 1.0}
ROUNDS = 80
EVERY_ROUND = range(1, ROUNDS + 1)


class Recorder(flower_run.Recorder):
    """z of every round, and N_stale (the weight of S's stale shares) in its z-step."""

    def __init__(self) -> None:
        super().__init__()
        self.stale: list[int] = []


class LossyProxy(InProcessClientProxy):
    """A proxy whose scripted rounds misbehave after the client trained.

    "lost": the reply never arrives (the client saved its new state); "nan": the reply
    arrives with a NaN; "truncate": its first tensor arrives 3 bytes short; "replay":
    the reply of the previous round arrives again instead of this one; "wipe": the
    node's state is lost before this round (a SuperNode restart without its state);
    "forge": the node keeps its state but claims a resync (its Delta_i sent as a full
    contribution, ``admm-previous-round`` 0, ``admm-resync`` 1); "amnesia": "wipe", and
    the server's offer of its kept share (``admm-restore``) does not reach the client
    (one that does not take it), so it resyncs every time: a memoryless client.
    """

    faults: dict[int, str]
    last: FitRes | None = None

    def fit(self, ins: FitIns, timeout: float | None, group_id: int | None) -> FitRes:
        server_round = int(ins.config["server_round"])
        fault = self.faults.get(server_round)
        if fault in ("wipe", "amnesia"):
            self.context.state = RecordDict()
        if fault == "amnesia":
            config = {k: v for k, v in ins.config.items() if k not in (RESTORE, RESTORE_EXAMPLES)}
            ins = FitIns(ins.parameters, config)
        res = super().fit(ins, timeout, group_id)
        previous, self.last = self.last, res
        if fault == "lost":
            raise TimeoutError("reply lost after the client trained")
        if fault == "nan":
            res.parameters.tensors[0] = _with_nan(res.parameters.tensors[0])
        if fault == "truncate":
            res.parameters.tensors[0] = res.parameters.tensors[0][:-3]
        if fault == "replay" and previous is not None:
            return previous
        if fault == "forge":
            res.metrics.pop(DELAYED_SQ_RESIDUAL, None)
            res.metrics.update({PREVIOUS_ROUND: 0, RESYNC: 1, EXAMPLES_CHANGE: res.num_examples})
        return res


def _with_nan(tensor: bytes) -> bytes:
    data = bytearray(tensor)
    data[-8:] = np.array([np.nan]).tobytes()
    return bytes(data)


def lossy_proxies(faults: dict[int, dict[int, str]]) -> list[InProcessClientProxy]:
    proxies = make_proxies(admm_client_fn(**CLIENT), NUM_CLIENTS)
    for i, proxy in enumerate(proxies):
        proxy.__class__ = LossyProxy
        proxy.faults = faults.get(i, {})  # type: ignore[attr-defined]
    return proxies


def run(faults: dict[int, dict[int, str]], **kwargs: Any) -> tuple[Any, Recorder, Any]:
    recorder = Recorder()
    strategy = FedADMMClientDuals(
        rho=0.1, initial_parameters=zeros_parameters(), evaluate_fn=recorder, **kwargs
    )
    recorder.hook = lambda _: recorder.stale.append(strategy.state.sweep.stale_examples)
    result = run_rounds(strategy, lossy_proxies(faults), ROUNDS)
    return strategy, recorder, result


def assert_recovers(recorder: Recorder, result: Any, quiet_after: int = 10) -> int:
    """Assert the issue's bar; return the first round with a 1e-6 gap (for docs)."""
    reached = first_round_below(gaps(recorder.matrix), 1e-6)
    assert reached is not None and reached <= ROUNDS, gaps(recorder.matrix)[-5:]
    late = result.fit_metrics[quiet_after:]
    assert all(int(m.get("num_rejected", 0)) == 0 for m in late), late
    assert all(int(m.get("num_state_mismatch", 0)) == 0 for m in late)
    return reached


def test_replies_lost_after_training_in_rounds_3_and_4() -> None:
    _, recorder, result = run({3: {3: "lost", 4: "lost"}})
    assert result.fit_metrics[2]["num_failures"] == 1
    assert result.fit_metrics[3]["num_failures"] == 1
    assert assert_recovers(recorder, result) == 17  # as without the loss


def test_one_lost_reply_with_accept_failures_false() -> None:
    _, recorder, result = run({5: {3: "lost"}}, accept_failures=False)
    assert result.fit_metrics[2]["num_failures"] == 1  # round 3 discarded whole
    assert assert_recovers(recorder, result) == 18  # one round repeated


def test_a_transient_nan_reply() -> None:
    _, recorder, result = run({2: {4: "nan"}})
    assert result.fit_metrics[3]["num_rejected"] == 1
    assert assert_recovers(recorder, result) == 17


def test_a_replayed_reply() -> None:
    _, recorder, result = run({7: {5: "replay"}})
    assert result.fit_metrics[4]["num_rejected"] == 1
    assert assert_recovers(recorder, result) == 17


def test_a_client_that_lost_its_state_rejoins_and_its_stale_share_leaves_s() -> None:
    _, recorder, result = run({4: {6: "wipe"}})
    # It is accepted again within a few rounds ...
    assert all(m["num_replies"] == NUM_CLIENTS for m in result.fit_metrics[8:])
    # ... and S again equals the sum of the clients' contributions: the optimum.
    assert assert_recovers(recorder, result) == 17
    assert [int(m["rebuilding"]) for m in result.fit_metrics[4:8]] == [0, 1, 0, 0]
    assert gaps(recorder.matrix)[-1] <= 1e-9


def _half_participation(faults: dict[int, dict[int, str]]) -> tuple[Recorder, Any]:
    recorder = Recorder()
    strategy = FedADMMClientDuals(
        rho=0.1,
        initial_parameters=zeros_parameters(),
        evaluate_fn=recorder,
        fraction_fit=0.5,
        min_fit_clients=5,
        min_available_clients=NUM_CLIENTS,
    )
    return recorder, run_rounds(strategy, lossy_proxies(faults), 120)


def test_lost_state_under_partial_participation() -> None:
    recorder, result = _half_participation({1: {r: "wipe" for r in (10,)}})
    reached = first_round_below(gaps(recorder.matrix), 1e-6)
    assert reached is not None, gaps(recorder.matrix)[-5:]
    baseline, _ = _half_participation({})
    assert reached == first_round_below(gaps(baseline.matrix), 1e-6) == 35
    rebuilding = [k + 1 for k, m in enumerate(result.fit_metrics) if m["rebuilding"]]
    assert rebuilding == [10, 11, 12, 13]  # until every key was sampled once


def test_lost_state_and_a_truncated_payload_under_8_bit_compression() -> None:
    """The sweep's full shares follow the compressed changes: S = sum n_i c_i - e_i."""
    recorder = Recorder()
    strategy = FedADMMClientDuals(
        rho=0.1,
        initial_parameters=zeros_parameters(),
        evaluate_fn=recorder,
        uplink=Uplink(StochasticQuantizer(bits=8)),
    )
    proxies = lossy_proxies({4: {6: "wipe"}, 2: {8: "truncate"}})
    result = run_rounds(strategy, proxies, ROUNDS)
    assert result.fit_metrics[5]["num_resynced"] == 1
    assert result.fit_metrics[7]["num_rejected"] == 1
    assert [int(m["rebuilding"]) for m in result.fit_metrics[4:8]] == [0, 1, 0, 0]
    assert assert_recovers(recorder, result) == 17
    expected = np.zeros(20)
    for proxy in proxies:
        kept = load_states(proxy.context.state, [(20,)])
        assert kept.pending is not None  # every last reply was used
        expected += kept.pending.share[0]
    assert strategy.state.contribution_sum is not None
    np.testing.assert_allclose(strategy.state.contribution_sum[0], expected, rtol=0, atol=1e-9)


def test_a_checkpoint_taken_mid_sweep_resumes_bit_identically(tmp_path: Path) -> None:
    faults = {4: {6: "wipe"}}
    straight = Recorder()
    strategy = FedADMMClientDuals(
        rho=0.1, initial_parameters=zeros_parameters(), evaluate_fn=straight
    )
    run_rounds(strategy, lossy_proxies(faults), 9)
    proxies = lossy_proxies(faults)
    before, after = Recorder(), Recorder()
    first = FedADMMClientDuals(
        rho=0.1,
        initial_parameters=zeros_parameters(),
        evaluate_fn=before,
        checkpoint=Checkpointing(tmp_path),
    )
    run_rounds(first, proxies, 6)
    assert first.state.sweep.active  # round 6's resync started it
    second = FedADMMClientDuals(
        rho=0.1,
        initial_parameters=zeros_parameters(),
        evaluate_fn=after,
        checkpoint=Checkpointing(tmp_path),
    )
    assert (
        second.state.sweep.rebuilt == {"partition-id:4"}
        and second.state.sweep.stale_examples == 500
    )
    assert list(second.state.sweep.known) == ["partition-id:4"]  # its resync's share, kept
    np.testing.assert_array_equal(
        second.state.sweep.known["partition-id:4"][0], first.state.sweep.known["partition-id:4"][0]
    )
    run_rounds(second, proxies, 3)
    np.testing.assert_array_equal(np.vstack([before.matrix, after.matrix]), straight.matrix)
    assert [int(h["rebuilding"]) for h in second.history] == [0, 0, 0]


def test_a_stale_share_inside_s_new_restarts_the_sweep() -> None:
    """S holds a: 1, b: 2, c: 4; a resyncs (16), b rebuilds, then b resyncs (32)."""
    total, sweep = [np.array([7.0])], RebuildSweep()
    sweep.drop("a", 10, total)
    sweep.fold("a", total, [np.array([16.0])], None, full=True)
    sweep.fold("b", total, [np.array([1.0])], [np.array([3.0])], full=False)
    assert sweep.new_sum == [19.0] and sweep.rebuilt == {"a", "b"}
    sweep.drop("b", 10, total)  # b's share 3 is inside S_new: start again
    assert sweep.new_sum == [0.0] and sweep.rebuilt == set()
    sweep.fold("b", total, [np.array([32.0])], None, full=True)
    sweep.fold("a", total, [np.array([1.0])], [np.array([17.0])], full=False)
    assert sweep.finish(["a", "b", "c"]) is None and sweep.stale_examples == 20
    sweep.fold("c", total, [np.array([0.0])], [np.array([4.0])], full=False)
    assert total == [7.0 + 16 + 1 + 32 + 1]  # S got every change, stale shares too
    assert sweep.finish(["a", "b", "c"]) == [17.0 + 32 + 4]  # the current shares only
    assert not sweep.active and sweep.stale_examples == 0


def test_a_known_share_is_taken_out_exactly_and_seeds_a_restarted_sweep() -> None:
    """S holds a: 1, b: 2, c: 4; a resyncs (16), then again (32); b resyncs (8); a leaves."""
    total, sweep = [np.array([7.0])], RebuildSweep()
    sweep.drop("a", 10, total)  # a's old share 1 goes stale: N_stale = 10
    sweep.fold("a", total, [np.array([16.0])], None, full=True, resync=True)
    assert sweep.known == {"a": [16.0]} and sweep.rebuilt == {"a"}
    assert sweep.take_out("a", total)  # the second resync replaces 16 by 32
    sweep.fold("a", total, [np.array([32.0])], None, full=True, resync=True)
    assert total == [7.0 + 32] and sweep.new_sum == [32.0] and sweep.stale_examples == 10
    sweep.fold("b", total, [np.array([1.0])], [np.array([3.0])], full=False)
    sweep.drop("b", 10, total)  # b's share 3 is inside S_new: restart from K = {a}
    assert sweep.new_sum == [32.0] and sweep.rebuilt == {"a"} and sweep.stale_examples == 20
    sweep.fold("b", total, [np.array([8.0])], None, full=True, resync=True)
    sweep.fold("a", total, [np.array([1.0])], None, full=False)  # sigma_a = 33 in S, S_new, K
    assert sweep.known == {"a": [33.0], "b": [8.0]} and sweep.finish(["a", "b", "c"]) is None
    sweep.fold("c", total, [np.array([0.0])], [np.array([4.0])], full=False)
    assert sweep.finish(["a", "b", "c"]) == [33.0 + 8 + 4] and sweep.stale_examples == 0
    total = [np.array([45.0])]
    assert sweep.take_out("a", total) and total == [12.0]  # eviction: no sweep needed
    assert not sweep.active and not sweep.take_out("c", total)
    sweep.fold("b", total, [np.array([1.0])], None, full=False)  # outside a sweep: b leaves K
    assert sweep.known == {}


def test_a_server_resumed_from_an_older_checkpoint_resyncs_its_clients(
    tmp_path: Path,
) -> None:
    """The clients went on to round 8; the server comes back from its round-6 checkpoint."""
    proxies = lossy_proxies({})
    first = FedADMMClientDuals(
        rho=0.1, initial_parameters=zeros_parameters(), checkpoint=Checkpointing(tmp_path, every=3)
    )
    run_rounds(first, proxies, 8)
    recorder = Recorder()
    second = FedADMMClientDuals(
        rho=0.1,
        initial_parameters=zeros_parameters(),
        checkpoint=Checkpointing(tmp_path, every=3),
        evaluate_fn=recorder,
    )
    assert second.last_round == 6
    result = run_rounds(second, proxies, 30)
    assert result.fit_metrics[0]["num_resynced"] == NUM_CLIENTS  # rounds 7 and 8 are gone
    assert [int(m["rebuilding"]) for m in result.fit_metrics[:2]] == [0, 0]
    assert all(m["num_rejected"] == 0 for m in result.fit_metrics)
    assert gaps(recorder.matrix)[-1] <= 1e-9


def test_a_node_wiped_every_round_adds_its_weight_once() -> None:
    """Memoryless client 2: each resync replaces its share (before: N_stale 39,500, gap 2.0e-2)."""
    recorder, proxies = Recorder(), lossy_proxies({2: {r: "amnesia" for r in EVERY_ROUND}})
    strategy = FedADMMClientDuals(
        rho=0.1, initial_parameters=zeros_parameters(), evaluate_fn=recorder
    )
    recorder.hook = lambda _: recorder.stale.append(strategy.state.sweep.stale_examples)
    result = run_rounds(strategy, proxies, ROUNDS)
    assert all(int(m["num_resynced"]) == 1 for m in result.fit_metrics[1:])
    assert recorder.stale[:2] == [0, 500] and max(recorder.stale[2:]) == 0
    assert [int(m["rebuilding"]) for m in result.fit_metrics[:4]] == [0, 1, 0, 0]
    assert strategy.state.total_examples == NUM_CLIENTS * 500
    assert list(strategy.state.sweep.known) == ["partition-id:2"]
    assert gaps(recorder.matrix)[-1] <= 5e-3  # 1.3e-4: a memoryless client's bias
    expected = np.zeros(20)  # S = the sum of the clients' shares (2's: its last F_2)
    for proxy in proxies:
        kept = load_states(proxy.context.state, [(20,)])
        assert kept.pending is not None
        expected += kept.pending.share[0]
    assert strategy.state.contribution_sum is not None
    np.testing.assert_allclose(strategy.state.contribution_sum[0], expected, rtol=0, atol=1e-9)


def test_forged_resync_claims_cost_the_claimant_only() -> None:
    """Client 7 claims a resync every round from round 3: N_stale stays within its n."""
    strategy, recorder, result = run({7: {r: "forge" for r in range(3, ROUNDS + 1)}})
    assert all(int(m["num_resynced"]) == 1 for m in result.fit_metrics[2:])
    assert max(recorder.stale) <= 500  # its own share, once (before: 78 x 500 = 39,000)
    assert recorder.stale[-1] == 0 and strategy.state.total_examples == NUM_CLIENTS * 500
    assert sum(int(m["rebuilding"]) for m in result.fit_metrics) == 1
