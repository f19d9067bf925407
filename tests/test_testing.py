"""flwr_admm.testing: `run_rounds` with federated evaluation (``evaluate=True``)."""

from __future__ import annotations

import numpy as np
import pytest
from flower_run import NUM_CLIENTS, admm_client_fn, zeros_parameters
from flwr.common import parameters_to_ndarrays

from flwr_admm.server import FedADMM
from flwr_admm.testing import make_proxies, run_rounds


def test_evaluate_true_records_the_example_weighted_mean_of_every_clients_loss() -> None:
    strategy = FedADMM(
        rho=0.1,
        initial_parameters=zeros_parameters(),
        min_evaluate_clients=NUM_CLIENTS,
        min_available_clients=NUM_CLIENTS,
    )
    client_fn = admm_client_fn(local_steps=5, learning_rate=1.0)
    proxies = make_proxies(client_fn, NUM_CLIENTS)
    result = run_rounds(strategy, proxies, 2, evaluate=True)
    assert len(result.evaluate_losses) == len(result.evaluate_metrics) == 2
    assert result.parameters is not None
    z = parameters_to_ndarrays(result.parameters)  # round 2's model, what round 2 evaluated
    replies = [client_fn(p.context).evaluate(z, {}) for p in proxies]  # independent
    weights = np.array([n for _, n, _ in replies], dtype=np.float64)
    expected = float(np.dot(weights, [loss for loss, _, _ in replies]) / weights.sum())
    assert result.evaluate_losses[-1] == pytest.approx(expected, rel=1e-12)
    assert result.evaluate_losses[0] != result.evaluate_losses[1]
    without = run_rounds(
        FedADMM(rho=0.1, initial_parameters=zeros_parameters()),
        make_proxies(client_fn, NUM_CLIENTS),
        2,
    )
    assert without.evaluate_losses == []  # evaluate=False (default) asks no client
