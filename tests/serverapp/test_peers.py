"""Message-API SCAFFOLD / FedDyn: the hand-computed rounds of tests/server/test_scaffold.py
and test_feddyn.py, bad replies counted (never raised), config and keyword checks."""

from __future__ import annotations

import numpy as np
import pytest
from flwr.app import ConfigRecord, MetricRecord
from message_replies import FakeGrid, error_reply, named, raw_reply, reply

from flwr_admm.serverapp import SCAFFOLD, FedDyn
from flwr_admm.serverapp.testing import flower_task_identity

X = {"w": np.array([1.0, 2.0])}


def _configured(strategy, x=X, num_nodes=2, **config):
    grid = FakeGrid(list(range(1, num_nodes + 1)))
    with flower_task_identity():
        sent = list(strategy.configure_train(1, named(x), ConfigRecord(config), grid))
    assert len(sent) == num_nodes
    return sent


def _scaffold_reply(node, y, dc, **metrics):
    records = {"arrays": named({"w": y}), "metrics": MetricRecord(metrics)}
    if dc is not None:
        records["scaffold-control"] = named({"w": dc})
    return raw_reply(node, records)


def test_scaffold_hand_computed_round():
    # x = [1, 2], c = 0. A: n=1, y=[0, 2], dc=[1, 0]; B: n=3, y=[1, -2], dc=[0, 4].
    strategy = SCAFFOLD(server_learning_rate=0.5, min_train_nodes=2, min_available_nodes=2)
    sent = _configured(strategy)
    np.testing.assert_array_equal(sent[0].content["arrays"]["w"].numpy(), [1.0, 2.0])  # x
    np.testing.assert_array_equal(sent[0].content["scaffold-control"]["w"].numpy(), [0.0, 0.0])
    assert sent[0].content["config"]["peer-algorithm"] == "scaffold"
    replies = [
        _scaffold_reply(
            1, np.array([0.0, 2.0]), np.array([1.0, 0.0]), **{"num-examples": 1, "partition-id": 0}
        ),
        _scaffold_reply(
            2, np.array([1.0, -2.0]), np.array([0.0, 4.0]), **{"num-examples": 3, "partition-id": 1}
        ),
    ]
    arrays, metrics = strategy.aggregate_train(1, replies)
    # x' = x + 0.5 (1/4 [-1, 0] + 3/4 [0, -4]) = [0.875, 0.5]; c = [0.25, 3]
    assert list(arrays.keys()) == ["w"]
    np.testing.assert_allclose(arrays["w"].numpy(), [0.875, 0.5], atol=1e-15)
    np.testing.assert_allclose(strategy.control()[0], [0.25, 3.0], atol=1e-15)
    assert metrics["num_replies"] == 2 and metrics["num_rejected"] == 0
    assert metrics["server_step"] == 0.5


def test_feddyn_hand_computed_round():
    # x = [1, 2], alpha = 0.5, h = 0. A: n=1, w=[0, 2]; B: n=3, w=[1, -2].
    strategy = FedDyn(alpha=0.5, min_train_nodes=2, min_available_nodes=2)
    sent = _configured(strategy)
    assert sorted(sent[0].content.array_records) == ["arrays"]
    assert sent[0].content["config"]["peer-algorithm"] == "feddyn"
    assert sent[0].content["config"]["feddyn-alpha"] == 0.5
    replies = [
        reply(1, {"w": np.array([0.0, 2.0])}, **{"num-examples": 1, "partition-id": 0}),
        reply(2, {"w": np.array([1.0, -2.0])}, **{"num-examples": 3, "partition-id": 1}),
    ]
    arrays, metrics = strategy.aggregate_train(1, replies)
    # h = [0.125, 1.5]; x' = [0.75, -1] - h / 0.5 = [0.5, -4]
    np.testing.assert_allclose(strategy.h()[0], [0.125, 1.5], atol=1e-15)
    np.testing.assert_allclose(arrays["w"].numpy(), [0.5, -4.0], atol=1e-15)
    assert metrics["num_replies"] == 2 and metrics["num_rejected"] == 0


def test_scaffold_bad_replies_are_rejected_counted_and_leave_the_state():
    strategy = SCAFFOLD(min_train_nodes=9, min_available_nodes=9)
    _configured(strategy, num_nodes=9)
    y, dc = np.array([0.0, 2.0]), np.array([1.0, 0.0])
    good = _scaffold_reply(1, y, dc, **{"num-examples": 2, "partition-id": 0})
    bad = [
        _scaffold_reply(2, y, None, **{"num-examples": 2, "partition-id": 1}),  # no control
        _scaffold_reply(3, np.array([np.nan, 2.0]), dc, **{"num-examples": 2, "partition-id": 2}),
        _scaffold_reply(4, y, dc, **{"num-examples": 0, "partition-id": 3}),
        _scaffold_reply(5, y, np.array([1.0, 0.0, 3.0]), **{"num-examples": 2, "partition-id": 4}),
        _scaffold_reply(6, y, np.array([np.inf, 0.0]), **{"num-examples": 2, "partition-id": 5}),
        raw_reply(8, {"metrics": MetricRecord({"num-examples": 2})}),  # no arrays at all
    ]
    arrays, metrics = strategy.aggregate_train(1, [good, *bad, error_reply(9)])
    assert metrics["num_rejected"] == len(bad) and metrics["num_failures"] == 1
    assert metrics["num_replies"] == 1
    np.testing.assert_array_equal(arrays["w"].numpy(), [0.0, 2.0])
    np.testing.assert_array_equal(strategy.control()[0], [1.0, 0.0])
    # only bad replies: no update at all, no exception
    nothing, counts = strategy.aggregate_train(2, [bad[1], error_reply(1)])
    assert nothing is None and counts["num_rejected"] == 1 and counts["num_failures"] == 1
    np.testing.assert_array_equal(strategy.control()[0], [1.0, 0.0])
    # node 7 claiming partition-id 0, bound to node 1 (connected): a key conflict
    _configured(strategy, {"w": np.array([0.0, 2.0])}, num_nodes=9)
    impostor = _scaffold_reply(7, y + 5, dc + 9, **{"num-examples": 2, "partition-id": 0})
    owner = _scaffold_reply(1, y, 0 * dc, **{"num-examples": 2, "partition-id": 0})
    arrays, metrics = strategy.aggregate_train(3, [impostor, owner])
    assert metrics["num_key_conflicts"] == 1 and metrics["num_rejected"] == 1
    assert metrics["num_replies"] == 1
    np.testing.assert_array_equal(arrays["w"].numpy(), [0.0, 2.0])
    np.testing.assert_array_equal(strategy.control()[0], [1.0, 0.0])


def test_feddyn_bad_replies_are_rejected_counted_and_leave_the_state():
    strategy = FedDyn(alpha=1.0, min_train_nodes=7, min_available_nodes=7)
    _configured(strategy, num_nodes=7)
    good = reply(1, {"w": np.array([0.0, 2.0])}, **{"num-examples": 2, "partition-id": 0})
    bad = [
        _scaffold_reply(  # a second ArrayRecord
            2, np.array([0.0, 2.0]), np.array([1.0, 0.0]), **{"num-examples": 2, "partition-id": 1}
        ),
        reply(3, {"w": np.array([np.inf, 2.0])}, **{"num-examples": 2, "partition-id": 2}),
        reply(4, {"w": np.array([0.0, 2.0])}, **{"num-examples": -1, "partition-id": 3}),
        reply(5, {"w": np.array([0.0, 2.0, 1.0])}, **{"num-examples": 2, "partition-id": 4}),
        reply(7, {"v": np.array([0.0, 2.0])}, **{"num-examples": 2, "partition-id": 6}),  # name
    ]
    arrays, metrics = strategy.aggregate_train(1, [good, *bad])
    assert metrics["num_rejected"] == len(bad) and metrics["num_replies"] == 1
    # h = -1 * 2 * ([0, 2] - [1, 2]) / 2 = [1, 0]; x' = [0, 2] - h = [-1, 2]
    np.testing.assert_allclose(strategy.h()[0], [1.0, 0.0])
    np.testing.assert_allclose(arrays["w"].numpy(), [-1.0, 2.0])
    # node 6 claiming partition-id 0, bound to node 1 (connected): a key conflict
    _configured(strategy, {"w": np.array([-1.0, 2.0])}, num_nodes=7)
    impostor = reply(6, {"w": np.array([7.0, 7.0])}, **{"num-examples": 2, "partition-id": 0})
    owner = reply(1, {"w": np.array([-1.0, 2.0])}, **{"num-examples": 2, "partition-id": 0})
    arrays, metrics = strategy.aggregate_train(2, [impostor, owner])
    assert metrics["num_key_conflicts"] == 1 and metrics["num_rejected"] == 1
    np.testing.assert_allclose(strategy.h()[0], [1.0, 0.0])  # the owner's w_i = x: no change
    np.testing.assert_allclose(arrays["w"].numpy(), [-2.0, 2.0])


@pytest.mark.parametrize("key", ["peer-algorithm", "rho", "proximal-mu", "server_round"])
def test_a_train_config_may_not_set_the_strategys_keys(key):
    with pytest.raises(ValueError, match=key):
        _configured(SCAFFOLD(), **{key: 1})
    with pytest.raises(ValueError, match="feddyn-alpha"):
        _configured(FedDyn(alpha=0.1), **{"feddyn-alpha": 1.0})


def test_the_given_config_is_not_touched_and_is_reusable():
    strategy, config = FedDyn(alpha=0.1), ConfigRecord({"local_steps": 3})
    grid = FakeGrid([1, 2])
    with flower_task_identity():
        for server_round in (1, 2):
            sent = list(strategy.configure_train(server_round, named(X), config, grid))
            assert sent[0].content["config"]["server-round"] == server_round
    assert dict(config) == {"local_steps": 3}


@pytest.mark.parametrize("value", [0, -1.0, float("nan"), "1", True])
def test_bad_keywords_name_the_field(value):
    with pytest.raises(ValueError, match="server_learning_rate"):
        SCAFFOLD(server_learning_rate=value)
    with pytest.raises(ValueError, match="alpha"):
        FedDyn(alpha=value)
    with pytest.raises(ValueError, match="fraction_train"):
        FedDyn(alpha=1.0, fraction_train=2.0)


def test_a_float32_model_travels_as_float32_and_is_kept_in_float64():
    strategy = SCAFFOLD(min_train_nodes=2, min_available_nodes=2)
    sent = _configured(strategy, {"w": np.array([1.0, 2.0], dtype=np.float32)})
    assert sent[0].content["arrays"]["w"].dtype == "float32"
    assert sent[0].content["scaffold-control"]["w"].dtype == "float32"
    y = np.array([0.5, 2.0], dtype=np.float32)
    good = _scaffold_reply(1, y, np.array([1.0, 0.0]), **{"num-examples": 2})
    arrays, _ = strategy.aggregate_train(1, [good])
    assert arrays["w"].dtype == "float32"
    assert strategy.current[0].dtype == np.float64
