"""Message-API SCAFFOLD and FedDyn recover from a reply never folded and from a lost state.

The faults of tests/server/test_peers_recovery.py through `FaultyGrid` and the ready
ClientApp (`make_client_app` over `ADMMClient`): the same gaps before the
acknowledgement and key binding (1.5e-2 / 9.4e-3 lost or NaN, 0.11 / 7.6e-2 wipe,
6.4e-2 / 0.27 impostor, SCAFFOLD / FedDyn), the clean run's gap after.
"""

from __future__ import annotations

import numpy as np
import pytest
from flwr.app import ConfigRecord
from message_replies import FakeGrid, named, reply
from peer_faults import run_message

from flwr_admm.serverapp import FedDyn
from flwr_admm.serverapp.testing import flower_task_identity

PEERS = ["scaffold", "feddyn"]
FAULT_ROUND = 5


@pytest.fixture(scope="module")
def clean() -> dict[str, float]:
    return {peer: run_message(peer, {})[1] for peer in PEERS}


@pytest.mark.parametrize("fault", ["lost", "nan", "wipe"])
@pytest.mark.parametrize("peer", PEERS)
def test_one_lost_nan_or_wiped_reply_leaves_the_fixed_point(peer, fault, clean):
    strategy, gap, _ = run_message(peer, {1: {FAULT_ROUND: fault}})
    assert abs(gap - clean[peer]) < 1e-8
    round_5 = strategy.history[FAULT_ROUND - 1]
    assert round_5["num_replies"] == (4 if fault == "wipe" else 3)
    assert round_5["num_rejected"] == int(fault == "nan")
    assert round_5["num_resynced"] == int(fault == "wipe")
    assert all(h["num_state_mismatch"] == 0 for h in strategy.history)


@pytest.mark.parametrize("peer", PEERS)
def test_a_node_replying_under_another_nodes_key_is_a_conflict(peer, clean):
    strategy, gap, _ = run_message(peer, {4: {1: "lost"}}, impostor=True)
    assert abs(gap - clean[peer]) < 1e-8
    assert [h["num_key_conflicts"] for h in strategy.history[1:]] == [1] * 119
    assert all(h["num_replies"] == 4 for h in strategy.history)


def test_each_node_receives_the_acknowledgement_of_its_own_key():
    strategy = FedDyn(alpha=1.0, min_train_nodes=2, min_available_nodes=2)
    grid = FakeGrid([1, 2])
    x = named({"w": np.array([1.0, 2.0])})
    with flower_task_identity():
        sent = strategy.configure_train(1, x, ConfigRecord(), grid)
        assert [m.content["config"]["admm-ack-round"] for m in sent] == [0, 0]
        good = reply(2, {"w": np.array([0.0, 2.0])}, **{"num-examples": 2, "partition-id": 1})
        strategy.aggregate_train(1, [good])
        sent = strategy.configure_train(2, x, ConfigRecord(), grid)
    acks = {m.metadata.dst_node_id: m.content["config"]["admm-ack-round"] for m in sent}
    assert acks == {1: 0, 2: 1}
