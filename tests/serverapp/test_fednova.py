"""Message-API FedNova against the legacy FedNova (identical replies -> identical x')
and the hand-computed case of tests/server/test_fednova.py; bad replies are counted."""

from __future__ import annotations

import numpy as np
import pytest
from flwr.app import ConfigRecord, MetricRecord
from flwr.common import Code, FitRes, Status, ndarrays_to_parameters, parameters_to_ndarrays
from flwr.server.client_manager import SimpleClientManager
from message_replies import FakeGrid, error_reply, named, raw_reply, reply

from flwr_admm.server import FedNova as LegacyFedNova
from flwr_admm.serverapp import FedNova
from flwr_admm.serverapp.testing import flower_task_identity
from flwr_admm.testing import make_proxies

X = {"w": np.array([1.0, 2.0]), "b": np.array([0.5])}


def _configured(x=X, num_nodes=2):
    strategy = FedNova(min_train_nodes=num_nodes, min_available_nodes=num_nodes)
    grid = FakeGrid(list(range(1, num_nodes + 1)))
    with flower_task_identity():
        sent = list(strategy.configure_train(1, named(x), ConfigRecord(), grid))
    assert len(sent) == num_nodes
    return strategy


def test_hand_computed_case():
    # as tests/server/test_fednova.py: n = (1, 3), tau = (1, 4)
    strategy = _configured()
    replies = [
        reply(
            1,
            {"w": np.array([0.0, 2.0]), "b": np.array([0.5])},
            **{"num-examples": 1, "local_steps": 1},
        ),
        reply(
            2,
            {"w": np.array([1.0, -2.0]), "b": np.array([-1.5])},
            **{"num-examples": 3, "local_steps": 4},
        ),
    ]
    arrays, metrics = strategy.aggregate_train(1, replies)
    assert list(arrays.keys()) == ["w", "b"]
    np.testing.assert_allclose(arrays["w"].numpy(), [0.1875, -0.4375], rtol=0, atol=1e-15)
    np.testing.assert_allclose(arrays["b"].numpy(), [-0.71875], rtol=0, atol=1e-15)
    assert metrics["tau_eff"] == pytest.approx(3.25)
    assert metrics["num_replies"] == 2 and metrics["num_rejected"] == 0


def test_identical_replies_give_the_legacy_update_bit_for_bit():
    rng = np.random.default_rng(0)
    x = {"w": rng.normal(size=5), "b": rng.normal(size=1)}
    ws = [{k: v + rng.normal(size=v.shape) for k, v in x.items()} for _ in range(4)]
    ns, taus = [5, 17, 3, 11], [7, 2, 0, 13]
    ws[2] = {k: v.copy() for k, v in x.items()}  # 0 steps: unchanged model
    strategy = _configured(x, 4)
    arrays, metrics = strategy.aggregate_train(
        1,
        [
            reply(i + 1, w, **{"num-examples": n, "local_steps": t})
            for i, (w, n, t) in enumerate(zip(ws, ns, taus, strict=True))
        ],
    )
    legacy = LegacyFedNova(min_fit_clients=4, min_available_clients=4)
    manager = SimpleClientManager()
    proxies = make_proxies(lambda c: None, 4)
    for proxy in proxies:
        manager.register(proxy)
    legacy.configure_fit(1, ndarrays_to_parameters(list(x.values())), manager)
    results = [
        (
            p,
            FitRes(
                Status(Code.OK, ""), ndarrays_to_parameters(list(w.values())), n, {"local_steps": t}
            ),
        )
        for p, w, n, t in zip(proxies, ws, ns, taus, strict=True)
    ]
    params, legacy_metrics = legacy.aggregate_fit(1, results, [])
    expected = parameters_to_ndarrays(params)
    assert np.array_equal(arrays["w"].numpy(), expected[0])
    assert np.array_equal(arrays["b"].numpy(), expected[1])
    assert metrics["tau_eff"] == legacy_metrics["tau_eff"]


def test_bad_replies_are_rejected_and_counted_and_the_run_goes_on():
    strategy = _configured(num_nodes=7)
    good = {"w": np.array([0.0, 2.0]), "b": np.array([0.5])}
    replies = [
        reply(1, good, **{"num-examples": 2, "local_steps": 3}),
        reply(2, good, **{"num-examples": 2}),  # no local_steps
        reply(
            3,
            {"w": np.array([np.nan, 0.0]), "b": np.array([0.5])},
            **{"num-examples": 2, "local_steps": 3},
        ),
        reply(4, {"w": np.zeros(3), "b": np.array([0.5])}, **{"num-examples": 2, "local_steps": 3}),
        reply(5, good, **{"num-examples": 2, "local_steps": 0}),  # 0 steps but changed
        raw_reply(6, {"metrics": MetricRecord({"num-examples": 2, "local_steps": 3})}),  # no arrays
        error_reply(7),
    ]
    arrays, metrics = strategy.aggregate_train(1, replies)
    assert metrics["num_replies"] == 1 and metrics["num_rejected"] == 5
    assert metrics["num_failures"] == 1
    # one usable reply with tau = 3: x' = x - 3 * (x - w) / 3 = w
    np.testing.assert_array_equal(arrays["w"].numpy(), good["w"])
    nothing, counts = strategy.aggregate_train(2, [error_reply(1)])
    assert nothing is None and counts["num_failures"] == 1
