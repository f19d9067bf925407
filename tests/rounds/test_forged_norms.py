"""Client-held duals: one node's forged norms cannot stop the run early (issue 25, item 7).

The stopping test of `FedADMMClientDuals` read the clients' reported ||w_i'||^2,
||u_i||^2 and d2_i: one node reporting huge norms stopped the run at round 2 (gap
0.24). Now each reported norm counts at most as the other replies' largest, and the
test also needs the server's own primal residual, computed from the Delta_i it folds
(`flwr_admm.rounds.client_duals_replies`). A node forging its reports (all 0, or huge
norms with d2 = 0) leaves the run stopping where the honest run stops, at the honest
gap; both APIs, the legacy one through `run_rounds`, the Message API through
`InProcessGrid`.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import cache

import pytest
from flower_run import NUM_CLIENTS, Recorder, admm_client_fn, zeros_parameters
from flwr.common import Context, NDArrays, Scalar
from message_apps import ZRecorder, zeros
from seed_task import gaps

import flwr_admm.server
import flwr_admm.serverapp
from flwr_admm import Convergence
from flwr_admm.client import ADMMClient
from flwr_admm.clientapp import make_client_app
from flwr_admm.protocol import DELAYED_SQ_RESIDUAL, U_SQ_NORM, W_SQ_NORM
from flwr_admm.serverapp.testing import InProcessGrid, run_strategy
from flwr_admm.testing import make_proxies, run_rounds

CLIENT = {"local_steps": 20, "learning_rate": 1.0}
ROUNDS = 40
FORGERIES: dict[str, dict[str, float]] = {
    "honest": {},
    "zeros": {W_SQ_NORM: 0.0, U_SQ_NORM: 0.0, DELAYED_SQ_RESIDUAL: 0.0},
    "inflated": {W_SQ_NORM: 1e12, U_SQ_NORM: 1e12, DELAYED_SQ_RESIDUAL: 0.0},
}


def forging_client_fn(forged: dict[str, float]) -> Callable[[Context], ADMMClient]:
    """Partition 0 replies as `ADMMClient`, but with `forged` norms in its metrics."""
    honest = admm_client_fn(**CLIENT)

    def client_fn(context: Context) -> ADMMClient:
        client = honest(context)
        if int(context.node_config["partition-id"]) != 0 or not forged:
            return client
        fit = client.fit

        def forged_fit(
            parameters: NDArrays, config: dict[str, Scalar]
        ) -> tuple[NDArrays, int, dict[str, Scalar]]:
            arrays, n, metrics = fit(parameters, config)
            metrics.update({k: v for k, v in forged.items() if k in metrics})
            return arrays, n, metrics

        client.fit = forged_fit  # type: ignore[method-assign]
        return client

    return client_fn


def legacy_run(forged: dict[str, float]) -> tuple[int, float]:
    recorder = Recorder()
    strategy = flwr_admm.server.FedADMMClientDuals(
        rho=0.1,
        initial_parameters=zeros_parameters(),
        evaluate_fn=recorder,
        convergence=Convergence(stop=True),
    )
    run_rounds(strategy, make_proxies(forging_client_fn(forged), NUM_CLIENTS), ROUNDS)
    stopped = len(strategy.history)
    return stopped, float(gaps(recorder.matrix)[stopped - 1])


def message_run(forged: dict[str, float]) -> tuple[int, float]:
    recorder = ZRecorder()
    strategy = flwr_admm.serverapp.FedADMMClientDuals(
        rho=0.1,
        min_train_nodes=NUM_CLIENTS,
        min_available_nodes=NUM_CLIENTS,
        fraction_evaluate=0.0,
        convergence=Convergence(stop=True),
    )
    grid = InProcessGrid(make_client_app(forging_client_fn(forged)), NUM_CLIENTS)
    run_strategy(strategy, grid, zeros(), ROUNDS, evaluate_fn=recorder)
    stopped = len(strategy.history)
    return stopped, float(gaps(recorder.matrix[1:])[stopped - 1])


RUNS: dict[str, Callable[[dict[str, float]], tuple[int, float]]] = {
    "legacy": legacy_run,
    "message": message_run,
}


@cache
def stop(api: str, forgery: str) -> tuple[int, float]:
    """(rounds run, relative gap at the last one) of a run with `forgery` by node 0."""
    return RUNS[api](FORGERIES[forgery])


@pytest.mark.parametrize("forgery", ["zeros", "inflated"])
@pytest.mark.parametrize("api", list(RUNS))
def test_one_node_forging_its_norms_does_not_stop_the_run_early(api: str, forgery: str) -> None:
    honest_round, honest_gap = stop(api, "honest")
    forged_round, forged_gap = stop(api, forgery)
    assert honest_round < ROUNDS and honest_gap < 1e-5  # the honest run does stop
    assert forged_round >= honest_round
    assert forged_gap <= 1.5 * honest_gap
