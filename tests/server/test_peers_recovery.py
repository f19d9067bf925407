"""Legacy SCAFFOLD and FedDyn recover from a reply the server never folded and a lost state.

Ridge clients of `peer_faults` (4 clients, 120 rounds, full participation): client 1's
round-5 reply is lost, arrives with a NaN, or its node's state is wiped before round 5;
or a fifth node reports client 1's partition-id from round 2 on. Without the
acknowledgement (the client saved c_i / grad_i as soon as it replied) and the key
binding, the gaps to the pooled optimum were 1.5e-2 / 9.4e-3 (lost, NaN), 0.11 / 7.6e-2
(wipe) and 0.20 / 0.13 (impostor), SCAFFOLD / FedDyn, against 5.8e-16 / 5.3e-16
without a fault; each test failed then.
"""

from __future__ import annotations

import numpy as np
import pytest
from fit_replies import Proxy, fit_res
from flwr.common import ndarrays_to_parameters
from flwr.server.client_manager import SimpleClientManager
from peer_faults import run_legacy

from flwr_admm.protocol import FEDDYN_STATE_GRAD, SCAFFOLD_STATE_C
from flwr_admm.server import SCAFFOLD
from flwr_admm.testing import make_proxies

PEERS = ["scaffold", "feddyn"]
FAULT_ROUND = 5


@pytest.fixture(scope="module")
def clean() -> dict[str, float]:
    return {peer: run_legacy(peer, {})[1] for peer in PEERS}


@pytest.mark.parametrize("fault", ["lost", "nan", "wipe"])
@pytest.mark.parametrize("peer", PEERS)
def test_one_lost_nan_or_wiped_reply_leaves_the_fixed_point(peer, fault, clean):
    strategy, gap, proxies = run_legacy(peer, {1: {FAULT_ROUND: fault}})
    assert abs(gap - clean[peer]) < 1e-8
    round_5 = strategy.history[FAULT_ROUND - 1]
    assert round_5["num_replies"] == (4 if fault == "wipe" else 3)
    assert round_5["num_rejected"] == int(fault == "nan")
    assert round_5["num_resynced"] == int(fault == "wipe")
    assert all(h["num_state_mismatch"] == 0 for h in strategy.history)
    # the server's state is the n-weighted mean of what the clients committed
    name = SCAFFOLD_STATE_C if peer == "scaffold" else FEDDYN_STATE_GRAD
    kept = [p.context.state.array_records[name].to_numpy_ndarrays()[0] for p in proxies]
    n = np.array([5, 12, 8, 20], dtype=float)
    mean = (n[:, None] * np.array(kept)).sum(axis=0) / n.sum()
    state = strategy.control() if peer == "scaffold" else strategy.h()
    np.testing.assert_allclose(state[0], mean, rtol=1e-10, atol=1e-14)


@pytest.mark.parametrize("peer", PEERS)
def test_a_node_replying_under_another_nodes_key_is_a_conflict(peer, clean):
    strategy, gap, _ = run_legacy(peer, {4: {1: "lost"}}, impostor=True)
    assert abs(gap - clean[peer]) < 1e-8
    assert [h["num_key_conflicts"] for h in strategy.history[1:]] == [1] * 119
    assert all(h["num_replies"] == 4 for h in strategy.history)


def _round(strategy, server_round, x, replies):
    """configure_fit (cids 1, 2 connected) then aggregate_fit of `replies` (cid, res)."""
    manager = SimpleClientManager()
    for proxy in make_proxies(lambda context: None, 2):
        manager.register(proxy)
    sent = strategy.configure_fit(server_round, ndarrays_to_parameters(x), manager)
    acks = {proxy.cid: ins.config["admm-ack-round"] for proxy, ins in sent}
    return acks, strategy.aggregate_fit(server_round, replies, [])[1]


def _reply(dc, previous):
    metrics = {"partition-id": 0, "admm-previous-round": previous}
    return fit_res([np.array([1.0, 2.0]), np.array(dc)], 2, metrics)


def test_a_state_out_of_sync_is_rejected_and_a_resync_replaces_the_share():
    strategy = SCAFFOLD(min_fit_clients=2, min_available_clients=2)
    x = [np.array([1.0, 2.0])]
    acks, metrics = _round(strategy, 1, x, [(Proxy("1"), _reply([1.0, 0.0], 0))])
    assert acks == {"1": 0, "2": 0} and metrics["num_replies"] == 1
    # round 2 acknowledges round 1 to cid 1 only; a reply from a state of round 5 is refused
    acks, metrics = _round(strategy, 2, x, [(Proxy("1"), _reply([9.0, 9.0], 5))])
    assert acks == {"1": 1, "2": 0}
    assert metrics["num_state_mismatch"] == 1 and metrics["num_rejected"] == 1
    np.testing.assert_array_equal(strategy.control()[0], [1.0, 0.0])
    # a client that lost its state trains from zero (previous 0): its old c_i leaves c
    acks, metrics = _round(strategy, 3, x, [(Proxy("1"), _reply([0.0, 4.0], 0))])
    assert acks["1"] == 1 and metrics["num_resynced"] == 1
    np.testing.assert_array_equal(strategy.control()[0], [0.0, 4.0])  # not [1, 4]
    acks, _ = _round(strategy, 4, x, [])
    assert acks["1"] == 3
