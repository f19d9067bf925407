"""A node that loses its state before every round, on a small task, both APIs (issue 25).

4 clients of 60 examples each (the first 60 rows of seed 000's partitions 0-3; N =
240), rho 0.1, 20 local steps of lr 1.0, every client every round, 80 rounds; node 2's
``context.state`` is wiped before every round. Its first loss is a resync (the server
never had its share); from then on the server holds that share (the resync's full
contribution, K in `flwr_admm.rounds.client_duals_sweep`) and offers it back
(``admm-restore``), so the node trains from the state it lost instead of from scratch.
Before the offer it was a memoryless client: relative objective gap 1.2e-2 at round
80, against the 5e-3 the issue asks for.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from centralized import Pooled, ridge_optimum
from flower_run import C, Recorder, seed_data, seed_model, zeros_parameters
from flwr.common import Context, FitIns, FitRes, RecordDict
from message_apps import ZRecorder, zeros
from message_duals import FaultyGrid

import flwr_admm.server
import flwr_admm.serverapp
from flwr_admm.client import ADMMClient
from flwr_admm.clientapp import make_client_app
from flwr_admm.serverapp.testing import run_strategy
from flwr_admm.testing import InProcessClientProxy, make_proxies, run_rounds

NUM_CLIENTS, ROWS, ROUNDS = 4, 60, 80
WIPED = 2
CLIENT = {"local_steps": 20, "learning_rate": 1.0}


def client_fn(context: Context) -> ADMMClient:
    i = int(context.node_config["partition-id"])
    data = seed_data()
    return ADMMClient(seed_model(), data.X[i][:ROWS], data.y[i][:ROWS], context=context, **CLIENT)


def relative_gaps(z_per_round: np.ndarray) -> np.ndarray:
    data = seed_data()
    pooled = Pooled.of(
        [data.X[i][:ROWS] for i in range(NUM_CLIENTS)],
        [data.y[i][:ROWS] for i in range(NUM_CLIENTS)],
        C,
    )
    f_star = pooled.objective(ridge_optimum(pooled))
    return np.array([(pooled.objective(z) - f_star) / abs(f_star) for z in z_per_round])


class WipingProxy(InProcessClientProxy):
    """Loses the node's ``context.state`` before every round when `wipe` is set."""

    wipe = False

    def fit(self, ins: FitIns, timeout: float | None, group_id: int | None) -> FitRes:
        if self.wipe:
            self.context.state = RecordDict()
        return super().fit(ins, timeout, group_id)


def run_legacy(wiped: bool) -> tuple[np.ndarray, list[dict[str, Any]]]:
    recorder = Recorder()
    strategy = flwr_admm.server.FedADMMClientDuals(
        rho=0.1,
        initial_parameters=zeros_parameters(),
        evaluate_fn=recorder,
    )
    proxies = make_proxies(client_fn, NUM_CLIENTS)
    for i, proxy in enumerate(proxies):
        proxy.__class__ = WipingProxy
        proxy.wipe = wiped and i == WIPED  # type: ignore[attr-defined]
    result = run_rounds(strategy, proxies, ROUNDS)
    return recorder.matrix[1:], [dict(m) for m in result.fit_metrics]


def run_message(wiped: bool) -> tuple[np.ndarray, list[dict[str, Any]]]:
    strategy = flwr_admm.serverapp.FedADMMClientDuals(
        rho=0.1, fraction_evaluate=0.0, min_available_nodes=NUM_CLIENTS
    )
    recorder = ZRecorder()
    faults = {WIPED: {r: "wipe" for r in range(1, ROUNDS + 1)}} if wiped else {}
    grid = FaultyGrid(make_client_app(client_fn), NUM_CLIENTS, faults)
    run_strategy(strategy, grid, zeros(), ROUNDS, evaluate_fn=recorder)
    return recorder.matrix[1:], [dict(h) for h in strategy.history]


RUNS = {"legacy": run_legacy, "message": run_message}


@pytest.mark.parametrize("api", sorted(RUNS))
def test_a_node_wiped_every_round_trains_from_the_share_the_server_kept(api: str) -> None:
    z, metrics = RUNS[api](wiped=True)
    gap = relative_gaps(z)
    assert gap[-1] <= 5e-3, gap[-1]  # the bar; 1.2e-2 as a memoryless client
    resynced = [int(m["num_resynced"]) for m in metrics]
    assert resynced[1] == 1 and sum(resynced) == 1  # round 2 only: no share kept before it
    assert all(int(m.get("num_rejected", 0)) == 0 for m in metrics)
    clean, _ = RUNS[api](wiped=False)
    # from round 3 on node 2 trains from its restored state: the run is the clean one's
    # but for round 2's fresh start, whose trace the ADMM iteration contracts away
    np.testing.assert_allclose(z[-1], clean[-1], rtol=1e-9, atol=0)  # 4.8e-13
