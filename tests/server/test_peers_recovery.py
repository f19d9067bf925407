"""Legacy SCAFFOLD and FedDyn: the acknowledgement protocol by hand.

A reply from a state the server never folded is refused (``num_state_mismatch``), a
resync replaces the client's share, and each client is told the round of its last
folded reply. The fault runs (lost, NaN, wiped, impostor) of both APIs are in
tests/rounds/test_peers_recovery.py.
"""

from __future__ import annotations

import numpy as np
from fit_replies import Proxy, fit_res
from flwr.common import ndarrays_to_parameters
from flwr.server.client_manager import SimpleClientManager

from flwr_admm.server import SCAFFOLD
from flwr_admm.testing import make_proxies


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
