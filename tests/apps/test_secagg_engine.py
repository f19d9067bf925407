"""FedADMMClientDualsSecAgg under Flower's real SecAgg+ (Simulation Engine, Ray).

An ``@app.main()`` ServerApp drives ``DefaultWorkflow(fit_workflow=SecAggPlusWorkflow)``
with the legacy strategy; the ClientApp is a ``client_fn`` app with ``secaggplus_mod``.
4 nodes of seed 000's task (SecAgg+ with 3 shares, threshold 2), 3 rounds; in round 2
partition 2 trains, writes what it would have sent, and fails (a dropout after the
key exchange: SecAgg+ rebuilds its masks from its neighbours' shares). Both forms: the
prox form, and the linearized one, whose step budget b_i must cross ``secaggplus_mod``
as clear metadata.

Every client writes its reply arrays to a file, so the test knows each individual
contribution; a spy on ``aggregate_fit`` records what the strategy was handed.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from flower_run import admm_client_fn, zeros_parameters
from flwr.client import ClientApp
from flwr.client.mod import secaggplus_mod
from flwr.common import Context, NDArrays, Scalar, parameters_to_ndarrays
from flwr.server import ServerApp, ServerConfig
from flwr.server.compat import LegacyContext
from flwr.server.workflow import DefaultWorkflow
from flwr.serverapp import Grid
from flwr.simulation import run_simulation
from secagg_emulation import SecureSumEmulation, faulty_proxies

from flwr_admm.client import ADMMClient
from flwr_admm.server.client_duals_secagg import FedADMMClientDualsSecAgg
from flwr_admm.testing import run_rounds

pytestmark = pytest.mark.ray

NODES = 4
ROUNDS = 3
CLIENT = {"local_steps": 20, "learning_rate": 1.0}
DROPOUT = (2, 2)  # (partition, round)


class Spy(FedADMMClientDualsSecAgg):
    """Record, per round, the arrays of every result and the ack of the dropout's key."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.seen: list[dict[str, Any]] = []

    def aggregate_fit(self, server_round: int, results: list[Any], failures: list[Any]) -> Any:
        entry = self.state.clients.get(f"partition-id:{DROPOUT[0]}")
        self.seen.append(
            {
                "arrays": [parameters_to_ndarrays(res.parameters) for _, res in results],
                "partitions": sorted(int(res.metrics["partition-id"]) for _, res in results),
                "failures": len(failures),
                "dropout_ack": None if entry is None else entry.last_round,
            }
        )
        return super().aggregate_fit(server_round, results, failures)


def recording_client_fn(out: Path) -> Any:
    make = admm_client_fn(**CLIENT)

    class Recording(ADMMClient):
        def fit(
            self, parameters: NDArrays, config: dict[str, Scalar]
        ) -> tuple[NDArrays, int, dict[str, Scalar]]:
            arrays, n, metrics = super().fit(parameters, config)
            server_round, partition = int(config["server_round"]), int(self.partition_id)
            np.save(out / f"r{server_round}-p{partition}.npy", arrays[0])
            if (partition, server_round) == DROPOUT:
                raise RuntimeError("dropout after training (test)")
            return arrays, n, metrics

    def client_fn(context: Context) -> Any:
        client = make(context)
        client.__class__ = Recording
        return client.to_client()

    return client_fn


RHO = {"prox": {"rho": 0.1}, "linearized": {}}  # the linearized form: rho_i = 1 / b_i


@pytest.mark.parametrize("form", ["prox", "linearized"])
def test_strategy_sees_only_the_aggregate_and_survives_a_dropout(form: str, tmp_path: Path) -> None:
    strategy = Spy(
        **RHO[form], initial_parameters=zeros_parameters(), min_available_clients=NODES, form=form
    )
    app = ServerApp()

    @app.main()
    def main(grid: Grid, context: Context) -> None:
        legacy = LegacyContext(context, config=ServerConfig(num_rounds=ROUNDS), strategy=strategy)
        DefaultWorkflow(fit_workflow=strategy.workflow(3, 2))(grid, legacy)

    run_simulation(
        server_app=app,
        client_app=ClientApp(client_fn=recording_client_fn(tmp_path), mods=[secaggplus_mod]),
        num_supernodes=NODES,
        backend_config={
            "client_resources": {"num_cpus": 1, "num_gpus": 0.0},
            "init_args": {"num_cpus": 2, "include_dashboard": False},
        },
    )
    assert len(strategy.seen) == ROUNDS, "the ServerApp never ran every round"
    grid, count = strategy.grid, len(strategy.z)
    for server_round, seen in enumerate(strategy.seen, start=1):
        dropped = server_round == DROPOUT[1]
        expected = [p for p in range(NODES) if not (dropped and p == DROPOUT[0])]
        # flwr 1.42's collect_masked_vectors_stage appends a failed reply to the
        # failures twice (two loops over the replies): one dropout counts 2.
        assert seen["partitions"] == expected and seen["failures"] == 2 * int(dropped)
        # One aggregate, the same in every result: no result carries a client's own arrays.
        first = seen["arrays"][0]
        for arrays in seen["arrays"][1:]:
            assert all(np.array_equal(a, b) for a, b in zip(arrays, first, strict=True))
        own = {p: np.load(tmp_path / f"r{server_round}-p{p}.npy") for p in range(NODES)}
        summed = grid.levels(first[:count], len(expected))[0]
        # It is exactly the sum of the contributing clients' grid values, the dropout's
        # excluded, and equals no single client's contribution (nor its mean-scaled copy).
        np.testing.assert_array_equal(summed, sum(np.rint(own[p] / grid.step) for p in expected))
        for p in range(NODES):
            assert not np.allclose(first[0], own[p]) and not np.allclose(summed * grid.step, own[p])
        if dropped:
            dropout_sum = summed + np.rint(own[DROPOUT[0]] / grid.step)
            assert not np.array_equal(summed, dropout_sum)
    assert strategy.seen[2]["dropout_ack"] == 1  # its round-2 contribution was never in S
    assert [h["num_secure_dropped"] for h in strategy.history] == [0] * ROUNDS
    assert [h["num_rejected"] for h in strategy.history] == [0] * ROUNDS  # b_i arrived
    # Bit-for-bit the in-process run with SecAgg+'s arithmetic emulated and the same fault.
    reference = FedADMMClientDualsSecAgg(
        **RHO[form], initial_parameters=zeros_parameters(), form=form
    )
    proxies = faulty_proxies(admm_client_fn(**CLIENT), NODES, {DROPOUT[0]: {DROPOUT[1]: "lost"}})
    run_rounds(SecureSumEmulation(reference), proxies, ROUNDS)
    np.testing.assert_allclose(strategy.z[0], reference.z[0], rtol=1e-12, atol=0)
