"""Message-API FedADMMClientDuals: the legacy z sequence, bit for bit, on seed 000's task.

Both strategies run in process with the same numpy client computation (`ADMMClient`,
served on the Message side by `flwr_admm.clientapp.make_client_app`) and the same
sampling seed: the legacy one through `flwr_admm.testing.run_rounds`, the Message-API
one through `flwr_admm.serverapp.testing.InProcessGrid` and ``strategy.start``. A user
handler written with `ADMMTrainStep` gives the same sequence too.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from flower_run import NUM_CLIENTS, admm_client_fn, run_seed
from message_apps import ZRecorder, zeros
from message_duals import steps_app

import flwr_admm.server
from flwr_admm import Uplink
from flwr_admm.clientapp import make_client_app
from flwr_admm.serverapp import FedADMMClientDuals
from flwr_admm.serverapp.testing import InProcessGrid, run_strategy
from flwr_admm.uplink import StochasticQuantizer, TopK

ROUNDS = 15
CLIENT = {"local_steps": 20, "learning_rate": 1.0}
CASES = {
    "full participation": {"fraction": 1.0, "minimum": 2, "seed": 0},
    "partial participation": {"fraction": 0.3, "minimum": 3, "seed": 5},
}


def message_run(case: dict[str, Any], app: Any, rounds: int = ROUNDS, **extra: Any) -> Any:
    recorder = ZRecorder()
    strategy = FedADMMClientDuals(
        rho=0.1,
        fraction_train=case["fraction"],
        min_train_nodes=case["minimum"],
        min_available_nodes=NUM_CLIENTS,
        fraction_evaluate=0.0,
        sampling_seed=case["seed"],
        **extra,
    )
    grid = InProcessGrid(app, NUM_CLIENTS)
    run_strategy(strategy, grid, zeros(), rounds, evaluate_fn=recorder)
    return strategy, recorder.matrix[1:]  # start() also records round 0


def legacy_run(case: dict[str, Any], **extra: Any) -> Any:
    strategy, recorder, _ = run_seed(
        flwr_admm.server.FedADMMClientDuals,
        ROUNDS,
        client_kwargs=CLIENT,
        rho=0.1,
        fraction_fit=case["fraction"],
        min_fit_clients=case["minimum"],
        min_available_clients=NUM_CLIENTS,
        sampling_seed=case["seed"],
        **extra,
    )
    return strategy, recorder.matrix


@pytest.mark.parametrize("case", list(CASES))
def test_legacy_and_message_api_client_duals_give_identical_z_sequences(case: str) -> None:
    legacy, z_legacy = legacy_run(CASES[case])
    message, z_message = message_run(CASES[case], make_client_app(admm_client_fn(**CLIENT)))
    np.testing.assert_array_equal(z_message, z_legacy)
    for name in ("contribution_sum", "z"):
        for ours, theirs in zip(
            getattr(message.state, name), getattr(legacy.state, name), strict=True
        ):
            np.testing.assert_array_equal(ours, theirs)
    assert message.state.total_examples == legacy.state.total_examples
    assert message.state.clients == legacy.state.clients
    replies = [h["num_replies"] for h in legacy.history]
    assert [h["num_replies"] for h in message.history] == replies
    for ours, theirs in zip(message.history, legacy.history, strict=True):
        assert ours["dual_residual"] == theirs["dual_residual"]
    if CASES[case]["fraction"] < 1.0:
        assert max(replies) == 3  # the sample really was partial


def test_a_users_handler_with_admm_train_step_gives_the_same_z_sequence() -> None:
    _, z_legacy = legacy_run(CASES["partial participation"])
    _, z_steps = message_run(CASES["partial participation"], steps_app)
    np.testing.assert_array_equal(z_steps, z_legacy)


@pytest.mark.parametrize(
    "compressor", [StochasticQuantizer(bits=8), TopK(fraction=0.25)], ids=["8-bit", "top-25%"]
)
def test_compressed_uplink_gives_the_legacy_z_sequence_and_bytes(compressor: Any) -> None:
    case = CASES["partial participation"]
    legacy, z_legacy = legacy_run(case, uplink=Uplink(compressor))
    app = make_client_app(admm_client_fn(**CLIENT))
    message, z_message = message_run(case, app, uplink=Uplink(compressor))
    np.testing.assert_array_equal(z_message, z_legacy)
    sent = [h["uplink_bytes"] for h in message.history]
    assert sent == [h["uplink_bytes"] for h in legacy.history]
    assert all(b < 3 * 20 * 8 for b in sent)  # 3 nodes, well under float64's 20 x 8 bytes
