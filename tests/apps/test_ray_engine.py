"""FedADMM + ADMMClient in Flower's real Simulation Engine (Ray backend).

The same seed task runs through `flwr.simulation.run_simulation` (legacy ServerApp
with `server_fn`, ClientApp with `client_fn`) and through the in-process driver; the
final z must agree to 1e-12. `run_simulation` returns None, so the result is read
from the strategy object, which lives in this process. `context.run_config` is empty
under run_simulation, so every hyperparameter travels in the fit config.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import pytest
from flower_run import NUM_CLIENTS, Recorder, admm_client_fn, run_seed, zeros_parameters
from flwr.client import ClientApp
from flwr.common import Context
from flwr.server import ServerApp, ServerAppComponents, ServerConfig
from flwr.simulation import run_simulation
from textbook import textbook_fedadmm

pytestmark = pytest.mark.ray

ROUNDS = 4
RHO = 0.1
# Hyperparameters ride in the message config (run_config is empty in simulation);
# the client constructor keeps different defaults so a lost config would show.
FIT_CONFIG = {"local_steps": 5, "learning_rate": 0.02}
CLIENT = {"local_steps": 1, "learning_rate": 0.5, "prox_step": "gradient", "local_init": "previous"}


def fit_config(server_round: int) -> dict[str, Any]:
    return dict(FIT_CONFIG)


def test_run_simulation_matches_in_process_driver() -> None:
    recorder = Recorder()
    strategy = textbook_fedadmm(
        rho=RHO,
        initial_parameters=zeros_parameters(),
        evaluate_fn=recorder,
        on_fit_config_fn=fit_config,
        min_available_clients=NUM_CLIENTS,
    )

    def server_fn(context: Context) -> ServerAppComponents:
        return ServerAppComponents(strategy=strategy, config=ServerConfig(num_rounds=ROUNDS))

    make_client = admm_client_fn(**CLIENT)

    def client_fn(context: Context) -> Any:
        return make_client(context).to_client()

    started = time.monotonic()
    run_simulation(
        server_app=ServerApp(server_fn=server_fn),
        client_app=ClientApp(client_fn=client_fn),
        num_supernodes=NUM_CLIENTS,
        backend_config={
            "client_resources": {"num_cpus": 1, "num_gpus": 0.0},
            "init_args": {"num_cpus": 2, "include_dashboard": False},
        },
    )
    elapsed = time.monotonic() - started
    assert strategy.admm is not None, "the ServerApp never ran the strategy"
    # Flower evaluates the initial parameters (round 0) too; drop that entry.
    z_ray = recorder.matrix[-ROUNDS:]
    assert len(recorder.z) == ROUNDS + 1
    assert len(strategy.history) == ROUNDS
    # Round 1 races the SuperNodes' registration; a short sample here is the bug that
    # test_strategy.py::test_sample_size_counts_clients_that_register_while_waiting pins.
    replies = [h["num_replies"] for h in strategy.history]
    assert replies == [NUM_CLIENTS] * ROUNDS, f"clients per round: {replies}"
    assert sorted(strategy.admm.records) == [f"partition-id:{i}" for i in range(NUM_CLIENTS)]

    in_process, reference, _ = run_seed(
        textbook_fedadmm, ROUNDS, client_kwargs=CLIENT, rho=RHO, on_fit_config_fn=fit_config
    )
    z_ref = reference.matrix
    assert np.linalg.norm(z_ray - z_ref) <= 1e-12 * np.linalg.norm(z_ref)
    np.testing.assert_allclose(strategy.admm.z[0], in_process.admm.z[0], rtol=1e-12, atol=0)
    for key, record in in_process.admm.records.items():
        np.testing.assert_allclose(
            strategy.admm.records[key].y[0], record.y[0], rtol=1e-12, atol=1e-300
        )
    assert elapsed < 60, f"Ray run took {elapsed:.1f} s"
