"""Message-API SCAFFOLD / FedDyn against the legacy classes: the same x sequence, bit for bit.

Both APIs run one round (`flwr_admm.rounds.scaffold`, `.feddyn`) through their
translators, so this holds by construction; one run per algorithm checks the
translators' part of it: the same seeded sample (3 of 6 nodes a round, the round
layer's draw over client keys) of the same `ADMMClient`s (ridge clients of
`peer_reference`; legacy: the in-process loop, Message API: `InProcessGrid` around
`make_client_app` and ``strategy.start``), the same x, c / h and kept client states.
"""

from __future__ import annotations

import numpy as np
import pytest
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, RecordDict
from flwr.clientapp import ClientApp
from flwr.common import parameters_to_ndarrays
from message_apps import ZRecorder
from message_replies import metadata
from peer_reference import (
    client_fn_for,
    common_kwargs,
    gradient,
    next_round,
    ridge_clients,
    scaffold_reference,
)

import flwr_admm.server
from flwr_admm.clientapp import (
    build_scaffold_reply,
    make_client_app,
    received_arrays,
    received_control,
)
from flwr_admm.serverapp import SCAFFOLD, FedDyn
from flwr_admm.serverapp.testing import InProcessGrid, run_strategy
from flwr_admm.testing import make_proxies

ROUNDS = 6
SIZES = [5, 12, 8, 20, 9, 14]
D = 4
SAMPLING_SEED = 11

PEERS = {
    "scaffold": (flwr_admm.server.SCAFFOLD, SCAFFOLD, {"server_learning_rate": 0.7}),
    "feddyn": (flwr_admm.server.FedDyn, FedDyn, {"alpha": 0.5}),
}


def _message_run(cls, options, data, fraction, client_fn, rounds=ROUNDS):
    n = len(data)
    strategy = cls(
        fraction_train=fraction,
        min_train_nodes=2,
        min_available_nodes=n,
        fraction_evaluate=0.0,
        sampling_seed=SAMPLING_SEED,
        **options,
    )
    grid = InProcessGrid(make_client_app(client_fn), n)
    recorder = ZRecorder()
    run_strategy(strategy, grid, ArrayRecord([np.zeros(D)]), rounds, evaluate_fn=recorder)
    return strategy, grid, recorder.matrix[1:]  # start() also records round 0


@pytest.mark.parametrize("peer", list(PEERS))
def test_identical_x_sequences_and_state_as_legacy(peer):
    legacy_cls, message_cls, options = PEERS[peer]
    data = ridge_clients(SIZES, d=D, seed=5)
    client_fn = client_fn_for(data, 5, 0.1, "exact")
    fraction = 0.5
    legacy = legacy_cls(**options, **common_kwargs(D, fraction), sampling_seed=SAMPLING_SEED)
    proxies = make_proxies(client_fn, len(data))
    xs = [parameters_to_ndarrays(next_round(legacy, proxies))[0] for _ in range(ROUNDS)]
    message, grid, x_message = _message_run(message_cls, options, data, fraction, client_fn)
    np.testing.assert_array_equal(x_message, np.array(xs))
    replies = [h["num_replies"] for h in legacy.history]
    assert [h["num_replies"] for h in message.history] == replies
    assert all(h["num_rejected"] == 0 == h["num_failures"] for h in message.history)
    assert max(replies) < len(data)  # the sample really was partial
    state = "control" if peer == "scaffold" else "h"
    np.testing.assert_array_equal(getattr(message, state)()[0], getattr(legacy, state)()[0])
    # the nodes kept the same client state as the legacy clients
    name = "flwr_admm.scaffold.c" if peer == "scaffold" else "flwr_admm.feddyn.grad"
    for proxy, context in zip(proxies, grid.contexts.values(), strict=True):
        kept = proxy.context.state.array_records.get(name)
        if kept is None:
            assert name not in context.state.array_records
            continue
        np.testing.assert_array_equal(
            context.state.array_records[name].to_numpy_ndarrays()[0],
            kept.to_numpy_ndarrays()[0],
        )


def test_scaffold_sends_x_and_c_under_two_records_and_the_reply_carries_both():
    data = ridge_clients([6, 6], d=D, seed=1)
    strategy, grid, _ = _message_run(SCAFFOLD, {}, data, 1.0, client_fn_for(data, 3, 0.1), rounds=2)
    train = [m for m in grid.sent if m.metadata.message_type == "train"]
    assert len(train) == 4
    last = train[-1].content
    assert sorted(last.array_records) == ["arrays", "scaffold-control"]
    assert last["config"]["peer-algorithm"] == "scaffold"
    # round 2 sends the c the strategy held after round 1 (round 1: c = 0)
    np.testing.assert_array_equal(train[0].content["scaffold-control"]["0"].numpy(), np.zeros(D))
    assert not np.array_equal(last["scaffold-control"]["0"].numpy(), np.zeros(D))
    assert strategy.history[-1]["server_step"] == 1.0


# ------------------------------------------- a user's own SCAFFOLD handler (the helpers)
STEPS, LR = 4, 0.1
DATA = ridge_clients([8, 8, 8], d=3, seed=1)
user_app = ClientApp()


@user_app.train()
def user_train(msg: Message, context: Context) -> Message:
    """SCAFFOLD option II with plain gradient steps, c_i kept in context.state."""
    X, y = DATA[int(context.node_config["partition-id"])]
    x = received_arrays(msg)["0"]
    c = received_control(msg)["0"]
    kept = context.state.array_records.get("c_i")
    c_i = np.zeros_like(c) if kept is None else kept.to_numpy_ndarrays()[0]
    w = x.copy()
    for _ in range(STEPS):
        w = w - LR * (gradient(X, y, w) - c_i + c)
    c_plus = c_i - c + (x - w) / (STEPS * LR)
    context.state.array_records["c_i"] = ArrayRecord([c_plus])
    return build_scaffold_reply(msg, [w], [c_plus - c_i], len(y), {"loss": 0.0}, context)


def test_a_user_handler_with_the_helpers_follows_the_papers_loop():
    reference = scaffold_reference(DATA, rounds=3, steps=STEPS, lr=LR, eta_g=0.7)
    strategy = SCAFFOLD(server_learning_rate=0.7, min_train_nodes=3, min_available_nodes=3)
    grid = InProcessGrid(user_app, 3)
    recorder = ZRecorder()
    run_strategy(strategy, grid, ArrayRecord([np.zeros(3)]), 3, evaluate_fn=recorder)
    for x, (x_ref, _) in zip(recorder.z[1:], reference, strict=True):
        np.testing.assert_allclose(x, x_ref, rtol=1e-12)
    np.testing.assert_allclose(strategy.control()[0], reference[-1][1], rtol=1e-12, atol=1e-15)
    assert [h["num_replies"] for h in strategy.history] == [3, 3, 3]


def test_the_ready_app_answers_a_scaffold_message_without_c_with_an_error_reply():
    data = ridge_clients([6], d=D, seed=1)
    grid = InProcessGrid(make_client_app(client_fn_for(data, 3, 0.1)), 1)
    config = ConfigRecord({"peer-algorithm": "scaffold", "server-round": 1})
    content = RecordDict({"arrays": ArrayRecord([np.zeros(D)]), "config": config})
    (answer,) = grid.send_and_receive([Message(content=content, metadata=metadata(0))])
    assert answer.has_error() and "scaffold-control" in answer.error.reason
    assert "flwr_admm.scaffold.c" not in grid.contexts[1].state.array_records
