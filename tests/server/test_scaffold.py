"""SCAFFOLD against a hand-computed round, an independent numpy loop and the pooled optimum.

Measured (in-process driver, 4 ridge clients of 5-20 examples, lr 0.1, 5 steps, 150
rounds, full participation): SCAFFOLD ends 5.8e-16 from the pooled optimum (relative),
FedDyn 3.9e-16 with alpha 1 (3.7e-4 with alpha 0.1: slow, not biased), FedAvg 4.8e-2
(the command is in docs/peers.md).
"""

from __future__ import annotations

import random

import numpy as np
import pytest
from fit_replies import Proxy, fit_res
from flwr.common import ndarrays_to_parameters, parameters_to_ndarrays
from flwr.server.client_manager import SimpleClientManager
from flwr.server.strategy import FedAvg
from peer_reference import (
    client_fn_for,
    common_kwargs,
    next_round,
    pooled_optimum,
    ridge_clients,
    scaffold_reference,
)

from flwr_admm.server import SCAFFOLD
from flwr_admm.testing import make_proxies, run_rounds


def _unused_client_fn(context):  # pragma: no cover - never called
    raise AssertionError("client_fn must not be called in these tests")


def _configured(strategy, x, num_clients=2):
    manager = SimpleClientManager()
    for proxy in make_proxies(_unused_client_fn, num_clients):
        manager.register(proxy)
    return strategy.configure_fit(1, ndarrays_to_parameters(x), manager)


def _rel(a, b):
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


def test_hand_computed_round():
    # x = [1, 2], c = 0. A: n=1, y=[0, 2], dc=[1, 0]; B: n=3, y=[1, -2], dc=[0, 4].
    strategy = SCAFFOLD(server_learning_rate=0.5, min_fit_clients=2, min_available_clients=2)
    instructions = _configured(strategy, [np.array([1.0, 2.0])])
    sent = parameters_to_ndarrays(instructions[0][1].parameters)
    np.testing.assert_array_equal(sent[0], [1.0, 2.0])  # x
    np.testing.assert_array_equal(sent[1], [0.0, 0.0])  # c
    assert instructions[0][1].config["peer-algorithm"] == "scaffold"
    results = [
        (Proxy("1"), fit_res([np.array([0.0, 2.0]), np.array([1.0, 0.0])], 1, {"partition-id": 0})),
        (
            Proxy("2"),
            fit_res([np.array([1.0, -2.0]), np.array([0.0, 4.0])], 3, {"partition-id": 1}),
        ),
    ]
    params, metrics = strategy.aggregate_fit(1, results, [])
    # p = [1/4, 3/4]: sum p_i (y_i - x) = 1/4 [-1, 0] + 3/4 [0, -4] = [-0.25, -3]
    # x' = x + 0.5 * that = [0.875, 0.5]
    np.testing.assert_allclose(parameters_to_ndarrays(params)[0], [0.875, 0.5], atol=1e-15)
    # c = (1 * [1, 0] + 3 * [0, 4]) / 4 = [0.25, 3]
    np.testing.assert_allclose(strategy.control()[0], [0.25, 3.0], atol=1e-15)
    assert metrics["num_replies"] == 2 and metrics["num_rejected"] == 0
    assert metrics["server_step"] == 0.5


@pytest.mark.parametrize("prox_step", ["gradient", "exact"])
def test_three_rounds_match_the_papers_loop(prox_step):
    # Equal n_i, full participation: the example weights are the paper's uniform ones.
    data = ridge_clients([8, 8, 8], d=3, seed=1)
    reference = scaffold_reference(data, rounds=3, steps=4, lr=0.1, eta_g=0.7)
    strategy = SCAFFOLD(server_learning_rate=0.7, **common_kwargs(3, min_clients=3))
    proxies = make_proxies(client_fn_for(data, 4, 0.1, prox_step), 3)
    for x_ref, c_ref in reference:
        result = next_round(strategy, proxies)
        np.testing.assert_allclose(parameters_to_ndarrays(result)[0], x_ref, rtol=1e-12)
        np.testing.assert_allclose(strategy.control()[0], c_ref, rtol=1e-12, atol=1e-15)
    # every client keeps its c_i in context.state, and they average to c
    kept = [
        p.context.state.array_records["flwr_admm.scaffold.c"].to_numpy_ndarrays()[0]
        for p in proxies
    ]
    np.testing.assert_allclose(np.mean(kept, axis=0), strategy.control()[0], rtol=1e-12)


@pytest.mark.parametrize("fraction", [1.0, 0.5])
def test_converges_to_the_pooled_optimum_where_fedavg_does_not(fraction):
    data = ridge_clients([5, 12, 8, 20], d=4, seed=3)
    optimum = pooled_optimum(data)
    proxies = make_proxies(client_fn_for(data, 5, 0.1), 4)
    scaffold = SCAFFOLD(**common_kwargs(4, fraction))
    x = parameters_to_ndarrays(run_rounds(scaffold, proxies, 150).parameters)[0]
    assert _rel(x, optimum) < 1e-8
    random.seed(0)  # Flower's ClientManager.sample draws from the global generator
    fedavg = FedAvg(**common_kwargs(4, fraction))
    proxies = make_proxies(client_fn_for(data, 5, 0.1), 4)
    x_avg = parameters_to_ndarrays(run_rounds(fedavg, proxies, 150).parameters)[0]
    assert _rel(x_avg, optimum) > 1e-3  # client drift: a biased fixed point


def test_bad_replies_are_rejected_counted_and_leave_the_state():
    strategy = SCAFFOLD(min_fit_clients=2, min_available_clients=2)
    _configured(strategy, [np.array([1.0, 2.0])])
    good = fit_res([np.array([0.0, 2.0]), np.array([1.0, 0.0])], 2, {"partition-id": 0})
    bad = [
        fit_res([np.array([0.0, 2.0])], 2, {"partition-id": 1}),  # no control block
        fit_res([np.array([np.nan, 2.0]), np.array([1.0, 0.0])], 2, {"partition-id": 2}),
        fit_res([np.array([0.0, 2.0]), np.array([1.0, 0.0])], 0, {"partition-id": 3}),
        fit_res([np.array([0.0, 2.0]), np.array([1.0, 0.0, 3.0])], 2, {"partition-id": 4}),
        fit_res([np.array([0.0, 2.0]), np.array([1.0, 0.0])], 2, {"partition-id": 1.5}),
    ]
    results = [(Proxy("1"), good)] + [(Proxy(str(i + 2)), r) for i, r in enumerate(bad)]
    params, metrics = strategy.aggregate_fit(1, results, [RuntimeError("lost")])
    assert metrics["num_rejected"] == len(bad) and metrics["num_failures"] == 1
    assert metrics["num_replies"] == 1
    np.testing.assert_array_equal(parameters_to_ndarrays(params)[0], [0.0, 2.0])
    np.testing.assert_array_equal(strategy.control()[0], [1.0, 0.0])
    # only bad replies: no update at all
    _configured(strategy, [np.array([0.0, 2.0])])
    params, metrics = strategy.aggregate_fit(2, [(Proxy("3"), bad[1])], [])
    assert params is None and metrics["num_rejected"] == 1
    np.testing.assert_array_equal(strategy.control()[0], [1.0, 0.0])
    # another node claiming partition-id 0, bound to cid 1 (connected): a key conflict
    _configured(strategy, [np.array([0.0, 2.0])])
    impostor = fit_res([np.array([5.0, 5.0]), np.array([9.0, 9.0])], 2, {"partition-id": 0})
    owner = fit_res([np.array([0.0, 2.0]), np.array([0.0, 0.0])], 2, {"partition-id": 0})
    params, metrics = strategy.aggregate_fit(3, [(Proxy("7"), impostor), (Proxy("1"), owner)], [])
    assert metrics["num_key_conflicts"] == 1 and metrics["num_rejected"] == 1
    assert metrics["num_replies"] == 1
    np.testing.assert_array_equal(parameters_to_ndarrays(params)[0], [0.0, 2.0])
    np.testing.assert_array_equal(strategy.control()[0], [1.0, 0.0])


@pytest.mark.parametrize("value", [0, -1.0, float("nan"), float("inf"), "1", True])
def test_bad_server_learning_rate_names_the_field(value):
    with pytest.raises(ValueError, match="server_learning_rate"):
        SCAFFOLD(server_learning_rate=value)


@pytest.mark.parametrize("key", ["peer-algorithm", "server_round", "rho"])
def test_a_user_config_may_not_set_the_strategys_keys(key):
    # round 1: a server_round of 0 clashes (the round itself is accepted, as by FedADMM)
    strategy = SCAFFOLD(on_fit_config_fn=lambda r: {key: 0}, min_available_clients=2)
    with pytest.raises(ValueError, match=key):
        _configured(strategy, [np.zeros(2)])


def test_a_float32_model_travels_as_float32_both_blocks():
    strategy = SCAFFOLD(min_fit_clients=2, min_available_clients=2)
    instructions = _configured(strategy, [np.array([1.0, 2.0], dtype=np.float32)])
    sent = parameters_to_ndarrays(instructions[0][1].parameters)
    assert [a.dtype for a in sent] == [np.float32, np.float32]
    reply = fit_res([np.array([0.5, 2.0]), np.array([1.0, 0.0])], 2, {"partition-id": 0})
    params, _ = strategy.aggregate_fit(1, [(Proxy("1"), reply)], [])
    assert parameters_to_ndarrays(params)[0].dtype == np.float32
    np.testing.assert_allclose(strategy.current[0], [0.5, 2.0])  # kept in float64
