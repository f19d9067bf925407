"""The legacy strategies + ADMMClient in Flower's real Simulation Engine (Ray backend).

The legacy API's one engine-equals-driver run: one `flwr.simulation.run_simulation`
whose ``@app.main()`` calls a legacy ``ServerApp(server_fn=...)`` per strategy (the
compat path the simulations app takes for ``api = "legacy"``), one after the other on
the same nodes: textbook FedADMM, FedADMMClientDuals (client-held duals) and FedADMM
with a 4-bit stochastic uplink quantizer (error feedback in ``context.state``). The
in-process driver runs the same three strategies in the same order on one set of
proxies (so the clients' ``context.state`` carries over exactly as on the nodes); z
of every round must agree to 1e-12. `run_simulation` returns None, so the results are
read from the strategy objects, which live in this process. ``context.run_config`` is
empty under run_simulation, so every hyperparameter travels in the fit config.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from flower_run import NUM_CLIENTS, Recorder, admm_client_fn, relative_errors, zeros_parameters
from flwr.client import ClientApp
from flwr.common import Context
from flwr.server import ServerApp, ServerAppComponents, ServerConfig
from flwr.serverapp import Grid
from flwr.simulation import run_simulation

from flwr_admm import Uplink
from flwr_admm.server import FedADMMClientDuals
from flwr_admm.server.fedadmm import textbook
from flwr_admm.testing import make_proxies, run_rounds
from flwr_admm.uplink import StochasticQuantizer

pytestmark = pytest.mark.ray

RHO = 0.1
# Hyperparameters ride in the message config (run_config is empty in simulation);
# the client constructor keeps different defaults so a lost config would show.
FIT_CONFIG = {"local_steps": 5, "learning_rate": 0.02}
CLIENT = {"local_steps": 1, "learning_rate": 0.5, "prox_step": "gradient", "local_init": "previous"}
ROUNDS = {"fedadmm": 4, "client_duals": 4, "compressed": 3}


def fit_config(server_round: int) -> dict[str, Any]:
    return dict(FIT_CONFIG)


def strategies() -> dict[str, tuple[Any, Recorder]]:
    """name -> (strategy, its z recorder), in the order they run."""
    common = {
        "rho": RHO,
        "initial_parameters": zeros_parameters(),
        "on_fit_config_fn": fit_config,
        "min_available_clients": NUM_CLIENTS,
    }
    made = {}
    for name, factory, extra in (
        ("fedadmm", textbook, {}),
        ("client_duals", FedADMMClientDuals, {}),
        ("compressed", textbook, {"uplink": Uplink(StochasticQuantizer(bits=4))}),
    ):
        recorder = Recorder()
        made[name] = (factory(evaluate_fn=recorder, **common, **extra), recorder)
    return made


def test_run_simulation_matches_in_process_driver() -> None:
    engine = strategies()
    app = ServerApp()

    @app.main()
    def main(grid: Grid, context: Context) -> None:
        for name, (strategy, _) in engine.items():
            components = ServerAppComponents(
                strategy=strategy, config=ServerConfig(num_rounds=ROUNDS[name])
            )
            ServerApp(server_fn=lambda _, c=components: c)(grid, context)

    make_client = admm_client_fn(**CLIENT)

    def client_fn(context: Context) -> Any:
        return make_client(context).to_client()

    run_simulation(
        server_app=app,
        client_app=ClientApp(client_fn=client_fn),
        num_supernodes=NUM_CLIENTS,
        backend_config={
            "client_resources": {"num_cpus": 1, "num_gpus": 0.0},
            "init_args": {"num_cpus": 2, "include_dashboard": False},
        },
    )

    local = strategies()
    proxies = make_proxies(make_client, NUM_CLIENTS)
    for name, (strategy, _) in local.items():
        run_rounds(strategy, proxies, ROUNDS[name])
    partitions = sorted(f"partition-id:{i}" for i in range(NUM_CLIENTS))
    for name, (strategy, recorder) in engine.items():
        rounds, (reference, expected) = ROUNDS[name], local[name]
        # Flower evaluates the initial parameters (round 0) too; drop that entry.
        assert len(recorder.z) == rounds + 1, f"{name}: the ServerApp did not run every round"
        assert len(strategy.history) == rounds
        # Round 1 races the SuperNodes' registration; a short sample here is the bug that
        # test_strategy.py::test_sample_size_counts_clients_that_register_while_waiting pins.
        replies = [h["num_replies"] for h in strategy.history]
        assert replies == [NUM_CLIENTS] * rounds, f"{name}: clients per round: {replies}"
        errors = relative_errors(recorder.matrix[-rounds:], expected.matrix[-rounds:])
        assert errors.max() <= 1e-12, (name, errors)
        if name == "client_duals":
            assert sorted(strategy.state.clients) == partitions
            continue
        assert strategy.admm is not None, f"{name}: the ServerApp never ran the strategy"
        assert sorted(strategy.admm.records) == partitions
        np.testing.assert_allclose(strategy.admm.z[0], reference.admm.z[0], rtol=1e-12, atol=0)
        for key, record in reference.admm.records.items():
            np.testing.assert_allclose(
                strategy.admm.records[key].y[0], record.y[0], rtol=1e-12, atol=1e-300
            )
    # the compressed run: every quantized reply decoded and admitted, the same bytes
    compressed, reference = engine["compressed"][0], local["compressed"][0]
    assert [h["num_rejected"] for h in compressed.history] == [0] * ROUNDS["compressed"]
    assert [h["uplink_bytes"] for h in compressed.history] == [
        h["uplink_bytes"] for h in reference.history
    ]
