"""A node's SCAFFOLD / FedDyn round (`flwr_admm.node.peers`), run by `ADMMClient`: one
step by hand, its state and acknowledgement, clear errors."""

from __future__ import annotations

import numpy as np
import pytest
from flwr.common import ArrayRecord, Context, RecordDict
from peer_reference import Ridge, gradient, ridge_clients

from flwr_admm.client import ADMMClient

X, Y = ridge_clients([6], d=2, seed=4)[0]


def _client(context=None, **kwargs):
    options = {"local_steps": 1, "learning_rate": 0.1, "prox_step": "gradient", **kwargs}
    return ADMMClient(Ridge(2), X, Y, context=context, **options)


def _context():
    return Context(1, 1, {"partition-id": 0}, RecordDict(), {})


def test_scaffold_one_step_by_hand():
    x, c = np.array([0.5, -1.0]), np.array([0.2, 0.1])
    client = _client(_context())
    arrays, n, metrics = client.fit([x, c], {"peer-algorithm": "scaffold", "server_round": 1})
    y = x - 0.1 * (gradient(X, Y, x) - 0.0 + c)  # c_i = 0 at first
    np.testing.assert_allclose(arrays[0], y, rtol=1e-14)
    np.testing.assert_allclose(arrays[1], -c + (x - y) / 0.1, rtol=1e-12)  # c_i+ - c_i
    assert n == 6 and metrics["local_steps"] == 1 and metrics["partition-id"] == 0


def test_state_lives_in_the_context_and_survives_a_new_client_object():
    context = _context()
    x, c = np.array([0.5, -1.0]), np.zeros(2)
    first, _, _ = _client(context).fit([x, c], {"peer-algorithm": "scaffold"})
    c_i = first[1]  # c_i was 0
    second, _, _ = _client(context).fit([x, c], {"peer-algorithm": "scaffold"})
    y = x - 0.1 * (gradient(X, Y, x) - c_i + c)
    np.testing.assert_allclose(second[0], y, rtol=1e-14)


def test_without_a_context_the_client_object_keeps_the_state():
    client = _client(None)
    x = np.array([0.3, 0.2])
    config = {"peer-algorithm": "feddyn", "feddyn-alpha": 0.5}
    w1 = client.fit([x], config)[0][0]
    grad_i = -0.5 * (w1 - x)
    w2 = client.fit([x], config)[0][0]
    np.testing.assert_allclose(w2, x - 0.1 * (gradient(X, Y, x) - grad_i), rtol=1e-14)


def test_a_state_of_other_shapes_is_reset():
    context = _context()
    context.state.array_records["flwr_admm.scaffold.c"] = ArrayRecord([np.ones(5)])
    x, c = np.array([0.5, -1.0]), np.zeros(2)
    arrays, _, _ = _client(context).fit([x, c], {"peer-algorithm": "scaffold"})
    np.testing.assert_allclose(arrays[0], x - 0.1 * gradient(X, Y, x), rtol=1e-14)


def _scaffold(context, x, c, server_round, ack):
    config = {"peer-algorithm": "scaffold", "server_round": server_round, "admm-ack-round": ack}
    arrays, _, metrics = _client(context).fit([x, c], config)
    return arrays, metrics["admm-previous-round"]


def test_the_acknowledgement_names_the_state_to_train_from():
    context = _context()
    x, c = np.array([0.5, -1.0]), np.array([0.2, 0.1])
    step = lambda c_i: x - 0.1 * (gradient(X, Y, x) - c_i + c)  # noqa: E731
    first, previous = _scaffold(context, x, c, 1, 0)
    c_1 = first[1]  # c_i was 0
    assert previous == 0
    second, previous = _scaffold(context, x, c, 2, 1)  # round 1 folded: commit c_1
    np.testing.assert_allclose(second[0], step(c_1), rtol=1e-14)
    assert previous == 1
    third, previous = _scaffold(context, x, c, 3, 1)  # round 2's reply lost: c_1 again
    np.testing.assert_array_equal(third[0], second[0])
    assert previous == 1
    fourth, previous = _scaffold(context, x, c, 4, 3)  # round 3 folded: c_1 + its change
    np.testing.assert_allclose(fourth[0], step(c_1 + third[1]), rtol=1e-14)
    assert previous == 3
    for ack in (9, 0):  # a state the server never folded, or none held: start from zero
        fresh, previous = _scaffold(context, x, c, 5, ack)
        np.testing.assert_allclose(fresh[0], step(0.0), rtol=1e-14)
        assert previous == 0


def test_feddyn_drops_a_reply_the_server_never_folded():
    client, x = _client(None), np.array([0.3, 0.2])
    config = {"peer-algorithm": "feddyn", "feddyn-alpha": 0.5, "admm-ack-round": 0}
    w1 = client.fit([x], {**config, "server_round": 1})[0][0]
    client.fit([x], {**config, "server_round": 2, "admm-ack-round": 1})  # lost
    w3, _, metrics = client.fit([x], {**config, "server_round": 3, "admm-ack-round": 1})
    grad_i = -0.5 * (w1 - x)  # round 1's state, not round 2's
    np.testing.assert_allclose(w3[0], x - 0.1 * (gradient(X, Y, x) - grad_i), rtol=1e-14)
    assert metrics["admm-previous-round"] == 1


def test_zero_local_steps_change_nothing():
    client = _client(_context(), grad_tol=1e9)
    x, c = np.array([0.5, -1.0]), np.array([0.2, 0.1])
    arrays, _, metrics = client.fit([x, c], {"peer-algorithm": "scaffold"})
    assert metrics["local_steps"] == 0
    np.testing.assert_array_equal(arrays[0], x)
    np.testing.assert_array_equal(arrays[1], np.zeros(2))


@pytest.mark.parametrize(
    ("parameters", "config", "field"),
    [
        ([np.zeros(2)], {"peer-algorithm": "fedsomething"}, "peer-algorithm"),
        ([np.zeros(2)], {"peer-algorithm": "feddyn"}, "feddyn-alpha"),
        ([np.zeros(2)], {"peer-algorithm": "feddyn", "feddyn-alpha": 0.0}, "feddyn-alpha"),
        ([np.zeros(2)], {"peer-algorithm": "feddyn", "feddyn-alpha": "1"}, "feddyn-alpha"),
        ([np.zeros(2)], {"peer-algorithm": "scaffold"}, "parameters"),
        ([np.zeros(2), np.zeros(3)], {"peer-algorithm": "scaffold"}, "parameters"),
        ([np.zeros(3), np.zeros(3)], {"peer-algorithm": "scaffold"}, "parameters"),
        (
            [np.zeros(2)],
            {"peer-algorithm": "feddyn", "feddyn-alpha": 1.0, "uplink": "topk"},
            "uplink",
        ),
        ([np.zeros(2)] * 2, {"peer-algorithm": "scaffold", "admm-ack-round": -1}, "ack-round"),
        ([np.zeros(2)] * 2, {"peer-algorithm": "scaffold", "admm-ack-round": 1.5}, "ack-round"),
    ],
)
def test_bad_configs_name_the_field_and_keep_the_state(parameters, config, field):
    context = _context()
    with pytest.raises(ValueError, match=field):
        _client(context).fit(parameters, config)
    assert not context.state.array_records
