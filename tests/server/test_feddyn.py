"""FedDyn against a hand-computed round, an independent numpy loop and the pooled optimum."""

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
    feddyn_reference,
    next_round,
    pooled_optimum,
    ridge_clients,
)

from flwr_admm.server import FedDyn
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
    # x = [1, 2], alpha = 0.5, h = 0. A: n=1, w=[0, 2]; B: n=3, w=[1, -2].
    strategy = FedDyn(alpha=0.5, min_fit_clients=2, min_available_clients=2)
    instructions = _configured(strategy, [np.array([1.0, 2.0])])
    assert instructions[0][1].config["peer-algorithm"] == "feddyn"
    assert instructions[0][1].config["feddyn-alpha"] == 0.5
    results = [
        (Proxy("1"), fit_res([np.array([0.0, 2.0])], 1, {"partition-id": 0})),
        (Proxy("2"), fit_res([np.array([1.0, -2.0])], 3, {"partition-id": 1})),
    ]
    params, metrics = strategy.aggregate_fit(1, results, [])
    # h = -alpha (1 * [-1, 0] + 3 * [0, -4]) / 4 = -0.5 [-0.25, -3] = [0.125, 1.5]
    np.testing.assert_allclose(strategy.h()[0], [0.125, 1.5], atol=1e-15)
    # x' = sum p_i w_i - h / alpha = [0.75, -1] - [0.25, 3] = [0.5, -4]
    np.testing.assert_allclose(parameters_to_ndarrays(params)[0], [0.5, -4.0], atol=1e-15)
    assert metrics["num_replies"] == 2 and metrics["num_rejected"] == 0


def test_three_rounds_match_the_papers_loop():
    # Equal n_i, full participation, plain gradient steps: Acar et al.'s Algorithm 1.
    data = ridge_clients([8, 8, 8], d=3, seed=2)
    reference = feddyn_reference(data, rounds=3, steps=4, lr=0.1, alpha=0.3)
    strategy = FedDyn(alpha=0.3, **common_kwargs(3, min_clients=3))
    proxies = make_proxies(client_fn_for(data, 4, 0.1, "gradient"), 3)
    for x_ref, h_ref in reference:
        result = next_round(strategy, proxies)
        np.testing.assert_allclose(parameters_to_ndarrays(result)[0], x_ref, rtol=1e-12)
        np.testing.assert_allclose(strategy.h()[0], h_ref, rtol=1e-12, atol=1e-15)
    records = [p.context.state.array_records["flwr_admm.feddyn.grad"] for p in proxies]
    grads = [r.to_numpy_ndarrays()[0] for r in records]
    np.testing.assert_allclose(np.mean(grads, axis=0), strategy.h()[0], rtol=1e-12)


@pytest.mark.parametrize("fraction", [1.0, 0.5])
@pytest.mark.parametrize("prox_step", ["gradient", "exact"])
def test_converges_to_the_pooled_optimum_where_fedavg_does_not(fraction, prox_step):
    data = ridge_clients([5, 12, 8, 20], d=4, seed=3)
    optimum = pooled_optimum(data)
    proxies = make_proxies(client_fn_for(data, 5, 0.1, prox_step), 4)
    feddyn = FedDyn(alpha=1.0, **common_kwargs(4, fraction))
    x = parameters_to_ndarrays(run_rounds(feddyn, proxies, 150).parameters)[0]
    assert _rel(x, optimum) < 1e-8
    random.seed(0)  # Flower's ClientManager.sample draws from the global generator
    fedavg = FedAvg(**common_kwargs(4, fraction))
    proxies = make_proxies(client_fn_for(data, 5, 0.1, prox_step), 4)
    x_avg = parameters_to_ndarrays(run_rounds(fedavg, proxies, 150).parameters)[0]
    assert _rel(x_avg, optimum) > 1e-3


def test_bad_replies_are_rejected_counted_and_leave_the_state():
    strategy = FedDyn(alpha=1.0, min_fit_clients=2, min_available_clients=2)
    _configured(strategy, [np.array([1.0, 2.0])])
    good = fit_res([np.array([0.0, 2.0])], 2, {"partition-id": 0})
    bad = [
        fit_res([np.array([0.0, 2.0]), np.array([1.0, 0.0])], 2, {"partition-id": 1}),
        fit_res([np.array([np.inf, 2.0])], 2, {"partition-id": 2}),
        fit_res([np.array([0.0, 2.0])], -1, {"partition-id": 3}),
        fit_res([np.array([0.0, 2.0, 1.0])], 2, {"partition-id": 4}),
        fit_res([np.array([0.0, 2.0])], 2, {"client-key": ""}),
    ]
    results = [(Proxy("1"), good)] + [(Proxy(str(i + 2)), r) for i, r in enumerate(bad)]
    params, metrics = strategy.aggregate_fit(1, results, [])
    assert metrics["num_rejected"] == len(bad) and metrics["num_replies"] == 1
    # h = -1 * 2 * ([0, 2] - [1, 2]) / 2 = [1, 0]; x' = [0, 2] - h = [-1, 2]
    np.testing.assert_allclose(strategy.h()[0], [1.0, 0.0])
    np.testing.assert_allclose(parameters_to_ndarrays(params)[0], [-1.0, 2.0])
    # another node claiming partition-id 0, bound to cid 1 (connected): a key conflict
    _configured(strategy, [np.array([-1.0, 2.0])])
    impostor = fit_res([np.array([7.0, 7.0])], 2, {"partition-id": 0})
    owner = fit_res([np.array([-1.0, 2.0])], 2, {"partition-id": 0})
    params, metrics = strategy.aggregate_fit(2, [(Proxy("7"), impostor), (Proxy("1"), owner)], [])
    assert metrics["num_key_conflicts"] == 1 and metrics["num_rejected"] == 1
    np.testing.assert_allclose(strategy.h()[0], [1.0, 0.0])  # the owner's w_i = x: no change
    np.testing.assert_allclose(parameters_to_ndarrays(params)[0], [-2.0, 2.0])


@pytest.mark.parametrize("value", [0, -0.1, float("nan"), None, "0.1", False])
def test_bad_alpha_names_the_field(value):
    with pytest.raises(ValueError, match="alpha"):
        FedDyn(alpha=value)


def test_a_user_config_may_not_set_alpha():
    strategy = FedDyn(alpha=0.1, on_fit_config_fn=lambda r: {"feddyn-alpha": 1.0})
    with pytest.raises(ValueError, match="feddyn-alpha"):
        _configured(strategy, [np.zeros(2)])
