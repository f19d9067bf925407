"""FedNova's normalized averaging against hand-computed numbers and FedAvg."""

from __future__ import annotations

import numpy as np
import pytest
from flwr.common import (
    Code,
    FitRes,
    Status,
    ndarrays_to_parameters,
    parameters_to_ndarrays,
)
from flwr.server.client_manager import SimpleClientManager
from flwr.server.strategy import FedAvg

from flwr_admm.client.admm_client import ADMMClient
from flwr_admm.models import LogisticRegression
from flwr_admm.rounds.fednova import local_steps_problem, normalized_average
from flwr_admm.server import FedNova
from flwr_admm.testing import make_proxies, run_rounds


def _unused_client_fn(context):  # pragma: no cover - never called
    raise AssertionError("client_fn must not be called in these tests")


def _setup(strategy, x, num_clients):
    proxies = make_proxies(_unused_client_fn, num_clients)
    manager = SimpleClientManager()
    for proxy in proxies:
        manager.register(proxy)
    instructions = strategy.configure_fit(1, ndarrays_to_parameters(x), manager)
    assert len(instructions) == num_clients
    return proxies


def _res(arrays, n, tau):
    metrics = {} if tau is None else {"local_steps": tau}
    return FitRes(Status(Code.OK, ""), ndarrays_to_parameters(arrays), n, metrics)


def test_hand_computed_case():
    # x = [1, 2], [0.5]; client A: n=1, tau=1; client B: n=3, tau=4.
    x = [np.array([1.0, 2.0]), np.array([0.5])]
    w_a = [np.array([0.0, 2.0]), np.array([0.5])]  # x - w_a = [1, 0], [0]
    w_b = [np.array([1.0, -2.0]), np.array([-1.5])]  # x - w_b = [0, 4], [2]
    strategy = FedNova(min_fit_clients=2, min_available_clients=2)
    proxies = _setup(strategy, x, 2)
    results = [(proxies[0], _res(w_a, 1, 1)), (proxies[1], _res(w_b, 3, 4))]
    params, metrics = strategy.aggregate_fit(1, results, [])
    # p = [1/4, 3/4]; tau_eff = 1/4 + 3 = 3.25
    # sum p_i d_i = 1/4 [1, 0], [0] + 3/4 [0, 1], [0.5] = [0.25, 0.75], [0.375]
    # x' = x - 3.25 * that = [0.1875, -0.4375], [-0.71875]
    got = parameters_to_ndarrays(params)
    np.testing.assert_allclose(got[0], [0.1875, -0.4375], rtol=0, atol=1e-15)
    np.testing.assert_allclose(got[1], [-0.71875], rtol=0, atol=1e-15)
    assert metrics["tau_eff"] == pytest.approx(3.25)
    assert metrics["num_replies"] == 2 and metrics["num_rejected"] == 0
    # FedAvg would give sum p_i w_i = [0.75, -1.0], [-1.0]: FedNova differs.
    assert not np.allclose(got[0], [0.75, -1.0])


def test_equal_steps_equals_fedavg():
    rng = np.random.default_rng(0)
    x = [rng.standard_normal((3, 2)), rng.standard_normal(4)]
    ws = [[rng.standard_normal((3, 2)), rng.standard_normal(4)] for _ in range(3)]
    ns = [5, 1, 7]
    nova = FedNova(min_fit_clients=3, min_available_clients=3)
    avg = FedAvg(min_fit_clients=3, min_available_clients=3)
    proxies = _setup(nova, x, 3)
    results = [(proxies[i], _res(ws[i], ns[i], 6)) for i in range(3)]
    nova_params, _ = nova.aggregate_fit(1, results, [])
    avg_params, _ = avg.aggregate_fit(1, results, [])
    for a, b in zip(
        parameters_to_ndarrays(nova_params), parameters_to_ndarrays(avg_params), strict=True
    ):
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-12)


def test_rejects_bad_replies_and_keeps_the_rest():
    x = [np.array([1.0, 1.0])]
    strategy = FedNova(min_fit_clients=4, min_available_clients=4)
    proxies = _setup(strategy, x, 4)
    results = [
        (proxies[0], _res([np.array([0.0, 0.0])], 2, 2)),  # valid
        (proxies[1], _res([np.array([0.0, 0.0])], 2, None)),  # no local_steps
        (proxies[2], _res([np.array([np.nan, 0.0])], 2, 2)),  # NaN
        (proxies[3], _res([np.array([5.0, 5.0])], 2, 0)),  # moved with 0 steps
    ]
    params, metrics = strategy.aggregate_fit(1, results, [])
    assert metrics["num_rejected"] == 3
    np.testing.assert_allclose(parameters_to_ndarrays(params)[0], [0.0, 0.0])


def test_a_reply_claiming_1e300_steps_is_rejected_and_x_follows_the_others():
    x = [np.array([1.0, 1.0])]
    strategy = FedNova(min_fit_clients=2, min_available_clients=2)
    proxies = _setup(strategy, x, 2)
    results = [
        (proxies[0], _res([np.array([0.0, 0.0])], 2, 2)),
        (proxies[1], _res([np.array([0.5, 0.5])], 2, 1e300)),  # honest w_i, forged tau_i
    ]
    params, metrics = strategy.aggregate_fit(1, results, [])
    assert metrics["num_rejected"] == 1
    np.testing.assert_allclose(parameters_to_ndarrays(params)[0], [0.0, 0.0])


def test_no_usable_reply_returns_none():
    strategy = FedNova(min_fit_clients=1, min_available_clients=1)
    proxies = _setup(strategy, [np.zeros(2)], 1)
    params, metrics = strategy.aggregate_fit(1, [(proxies[0], _res([np.zeros(3)], 1, 1))], [])
    assert params is None and metrics["num_rejected"] == 1


@pytest.mark.parametrize(
    "tau, ok",
    [
        (3, True),
        (0, True),
        (2.0, True),
        (-1, False),
        (1.5, False),
        (True, False),
        ("3", False),
        (float("nan"), False),
        (None, False),
        (1_000_000, True),
        (1_000_001, False),
        (1e300, False),  # tau_eff = 1e299 would ruin x for good
    ],
)
def test_local_steps_validation(tau, ok):
    assert (local_steps_problem(tau) is None) == ok


def test_zero_step_client_contributes_nothing_but_weight():
    x = [np.array([2.0])]
    new_x, tau_eff = normalized_average(x, [([np.array([2.0])], 1, 0), ([np.array([0.0])], 1, 2)])
    # tau_eff = 1; sum p d = 1/2 * (2/2) = 0.5; x' = 2 - 0.5
    assert tau_eff == 1.0
    np.testing.assert_allclose(new_x[0], [1.5])


def test_runs_with_admm_clients_in_process():
    rng = np.random.default_rng(1)
    data = [(rng.standard_normal((30, 3)), rng.integers(0, 2, 30)) for _ in range(3)]

    def client_fn(context):
        pid = int(context.node_config["partition-id"])
        X, y = data[pid]
        return ADMMClient(
            LogisticRegression(3, l2=0.1),
            X,
            y,
            local_steps=2 + pid,
            learning_rate=0.5,
            context=context,
        )

    strategy = FedNova(min_fit_clients=3, min_available_clients=3, fraction_evaluate=0.0)
    result = run_rounds(strategy, make_proxies(client_fn, 3), 3)
    assert [m["num_replies"] for m in result.fit_metrics] == [3, 3, 3]
    assert result.fit_metrics[0]["tau_eff"] == pytest.approx(3.0)  # equal n: (2+3+4)/3
