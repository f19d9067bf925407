"""Seeded sampling by partition-id on the app's Message-API path, and legacy parity.

References: the legacy path's own results (its `PartitionClientManager` draws by
partition-id, asked with get_properties); both paths run in process (no Ray) with
different random node ids, so equal objectives mean the same clients were drawn and
aggregated alike. Flower's own FedAvg/FedProx (``random.sample`` of node ids) fail
this comparison.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from app_runs import run_legacy, run_message

from flwr_admm.serverapp.testing import InProcessGrid, flower_task_identity
from simulations.admm_app import client_app
from simulations.admm_app.message_sampling import PartitionSampler

SYNTHETIC = {"task": "synthetic", "num-server-rounds": 3, "local-epochs": 1}


def _node_ids(seed, n):
    return [int(i) for i in np.random.default_rng(seed).choice(10**9, size=n, replace=False)]


@pytest.fixture(scope="module")
def output_dir(tmp_path_factory):
    """One output dir for the module: the task's F* is computed (and cached) once."""
    return tmp_path_factory.mktemp("outputs")


@pytest.mark.parametrize(
    "strategy", ["fedavg", "fedprox", "fedadmm", "fednova", "scaffold", "feddyn"]
)
def test_both_apis_draw_the_same_clients_and_reach_the_same_objectives(output_dir, strategy):
    config = {**SYNTHETIC, "strategy": strategy, "output-dir": str(output_dir)}
    run_legacy({**config, "run-tag": "legacy"}, 30, node_ids=_node_ids(1, 30))
    run_message({**config, "run-tag": "message"}, 30, node_ids=_node_ids(2, 30))
    rounds = {
        api: {
            r["round"]: r
            for r in json.loads((output_dir / "synthetic" / f"{strategy}-{api}.json").read_text())[
                "rounds"
            ]
        }
        for api in ("legacy", "message")
    }
    for k in (1, 2, 3):
        legacy, message = rounds["legacy"][k], rounds["message"][k]
        assert legacy["num_sampled"] == message["num_sampled"] == 10  # 10 of 30 a round
        assert legacy["num_results"] == message["num_results"] == 10
        # same clients, same float64 arithmetic: bit-identical
        for key in ("objective", "model_change", "client_drift", "train_loss"):
            assert message[key] == legacy[key], (k, key)


def _draws(node_ids, rounds=3):
    grid = InProcessGrid(client_app.app, 10, node_ids=node_ids)
    sampler = PartitionSampler(seed=7, wait_seconds=1)
    partition = {n: i for i, n in enumerate(node_ids)}
    with flower_task_identity():
        picks = [
            sorted(partition[n] for n in sampler.sample(grid, k, 0.4, 1, 10))
            for k in range(1, rounds + 1)
        ]
    assert sampler.queries == 1  # each node asked once, then remembered
    assert sampler.partitions == partition
    return picks


def test_the_draw_depends_on_partition_ids_not_node_ids():
    first, second = _draws(_node_ids(3, 10)), _draws(_node_ids(4, 10))
    assert first == second
    assert all(len(p) == 4 for p in first)
    assert len({tuple(p) for p in first}) > 1  # it does vary from round to round


def test_full_participation_asks_nothing():
    grid = InProcessGrid(client_app.app, 3, node_ids=[30, 10, 20])
    sampler = PartitionSampler(seed=0, wait_seconds=1)
    assert sampler.sample(grid, 1, 1.0, 1, 3) == [10, 20, 30]
    assert sampler.queries == 0 and grid.sent == []


def test_a_node_that_does_not_answer_the_query_sorts_last():
    node_ids = [5, 6, 7, 8]
    grid = InProcessGrid(client_app.app, 4, node_ids=node_ids)
    grid.offline.add(5)  # partition 0's reply never arrives
    sampler = PartitionSampler(seed=0, wait_seconds=1)
    with flower_task_identity():
        sampler.sample(grid, 1, 0.5, 1, 4)
    assert sampler.partitions == {5: None, 6: 1, 7: 2, 8: 3}
