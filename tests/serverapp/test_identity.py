"""The identity query (`ClientPolicy(identify=True)`, `flwr_admm.serverapp.identity`): a
seeded partial run draws the
same clients whatever ids Flower gives the nodes, each node is asked once, and nodes
that cannot or will not answer keep their node-id place without stopping the run."""

from __future__ import annotations

import numpy as np
import pytest
from flower_run import admm_client_fn
from flwr.app import ArrayRecord, Context, Message, MessageType, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from message_apps import ZRecorder

from flwr_admm import ClientPolicy
from flwr_admm.clientapp import make_client_app
from flwr_admm.protocol import IDENTITY_QUERY
from flwr_admm.serverapp import SCAFFOLD, FedADMM
from flwr_admm.serverapp.identity import ask_keys
from flwr_admm.serverapp.testing import InProcessGrid, flower_task_identity, run_strategy

N = 10
SHUFFLED = [9071, 13, 5521, 808, 42, 77123, 3, 650, 1999, 24]  # partition i -> node id


def _run(strategy, node_ids=None, app=None, rounds=8):
    app = app or make_client_app(admm_client_fn(local_steps=20, learning_rate=1.0))
    grid = InProcessGrid(app, N, node_ids=node_ids)
    recorder = ZRecorder()
    run_strategy(strategy, grid, ArrayRecord([np.zeros(20)]), rounds, evaluate_fn=recorder)
    return recorder.matrix, grid


def _partial(strategy=FedADMM, identify=True, **options):
    return strategy(
        fraction_train=0.3,
        min_available_nodes=N,
        fraction_evaluate=0.0,
        clients=ClientPolicy(identify=identify),
        **options,
    )


def _queries(grid):
    return [m for m in grid.sent if m.metadata.message_type == MessageType.QUERY]


def _sampled(grid):
    trained = [m for m in grid.sent if m.metadata.message_type == MessageType.TRAIN]
    partition = {node: i for i, node in enumerate(grid.contexts)}
    return [partition[m.metadata.dst_node_id] for m in trained]


def test_a_seeded_partial_run_draws_the_same_clients_whatever_the_node_ids():
    z, grid = _run(_partial())
    z_shuffled, shuffled = _run(_partial(), node_ids=SHUFFLED)
    assert _sampled(shuffled) == _sampled(grid)  # the same partitions, round by round
    np.testing.assert_array_equal(z_shuffled, z)
    peer, grid = _run(_partial(SCAFFOLD), rounds=4)  # every strategy samples the same way
    peer_shuffled, shuffled = _run(_partial(SCAFFOLD), node_ids=SHUFFLED, rounds=4)
    assert _sampled(shuffled) == _sampled(grid)
    np.testing.assert_array_equal(peer_shuffled, peer)


def test_each_node_is_asked_once_and_only_when_a_seeded_round_samples_a_subset():
    _, grid = _run(_partial(), node_ids=SHUFFLED)
    queries = _queries(grid)
    assert sorted(m.metadata.dst_node_id for m in queries) == sorted(SHUFFLED)
    assert all(IDENTITY_QUERY in m.content.config_records for m in queries)
    every = FedADMM(
        min_available_nodes=N, fraction_evaluate=0.0, clients=ClientPolicy(identify=True)
    )
    _, every_grid = _run(every, rounds=2)
    _, unseeded = _run(_partial(sampling_seed=None), rounds=2)
    _, default = _run(_partial(identify=False), rounds=2)  # off unless asked for
    assert _queries(every_grid) == _queries(unseeded) == _queries(default) == []


def test_a_client_app_without_a_query_handler_keeps_the_node_id_order():
    handler = make_client_app(admm_client_fn(local_steps=20, learning_rate=1.0))
    app = ClientApp()
    app.train()(lambda message, context: handler(message, context))  # no @app.query()
    strategy = _partial()
    z, grid = _run(strategy, app=app, node_ids=SHUFFLED, rounds=3)
    assert len(_queries(grid)) == N and strategy._announced == {}  # asked, none answered
    plain, plain_grid = _run(_partial(identify=False), app=app, node_ids=SHUFFLED, rounds=3)
    assert _sampled(grid) == _sampled(plain_grid)  # the node-id order of before
    np.testing.assert_array_equal(z, plain)


def test_replies_without_a_valid_key_are_left_out():
    app = ClientApp()

    @app.query()
    def query(message: Message, context: Context) -> Message:
        i = int(context.node_config["partition-id"])
        named = {0: {"partition-id": 0}, 1: {"partition-id": -1}, 2: {"partition-id": 1.5}}
        record = MetricRecord(named.get(i, {}))  # 3-9: no key at all
        return Message(RecordDict({IDENTITY_QUERY: record}), reply_to=message)

    grid = InProcessGrid(app, N, node_ids=SHUFFLED)
    with flower_task_identity(grid.run.run_id):
        keys = ask_keys(grid, SHUFFLED)
    assert keys == {str(SHUFFLED[0]): "partition-id:0"}
    assert ask_keys(grid, []) == {}


def test_the_legacy_api_refuses_identify():
    import flwr_admm.server

    with pytest.raises(ValueError, match=r"^clients\.identify: .*must be False"):
        flwr_admm.server.FedADMM(clients=ClientPolicy(identify=True))
    with pytest.raises(ValueError, match=r"^identify: must be True or False"):
        ClientPolicy(identify=1)  # type: ignore[arg-type]
