"""Message-API SCAFFOLD and FedDyn: each node is sent the acknowledgement of its own key.

The fault runs (lost, NaN, wiped, impostor) of both APIs are in
tests/rounds/test_peers_recovery.py.
"""

from __future__ import annotations

import numpy as np
from flwr.app import ConfigRecord
from message_replies import FakeGrid, named, reply

from flwr_admm.serverapp import FedDyn
from flwr_admm.serverapp.testing import flower_task_identity


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
