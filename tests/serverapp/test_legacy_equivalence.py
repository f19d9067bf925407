"""Legacy and Message-API FedADMM: the same z sequence on seed 000's task, bit for bit.

Both run in process with the same numpy client computation (`ADMMClient`, served on the
Message side by `flwr_admm.clientapp.make_client_app`) and the same sampling seed:
the legacy strategy through `flwr_admm.testing.run_rounds`, the Message-API one through
`flwr_admm.serverapp.testing.InProcessGrid` and ``strategy.start``.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from flower_run import NUM_CLIENTS, admm_client_fn, run_seed
from message_apps import ZRecorder, zeros

import flwr_admm.server
from flwr_admm import Uplink
from flwr_admm.clientapp import make_client_app
from flwr_admm.serverapp import FedADMM
from flwr_admm.serverapp.testing import InProcessGrid, run_strategy
from flwr_admm.uplink import LocalDP, StochasticQuantizer, TopK

ROUNDS = 12
CLIENT = {"local_steps": 20, "learning_rate": 1.0}

CASES = {
    "half participation": ({"fraction": 0.5, "minimum": 2}, {"rho": 0.1, "sampling_seed": 7}),
    "relaxed, residual balancing": (
        {"fraction": 1.0, "minimum": 2},
        {"rho": 0.3, "relaxation": 1.6, "rho_schedule": "residual-balancing"},
    ),
    "minibatches, warm start off": (
        {"fraction": 0.7, "minimum": 2},
        {"rho": 0.1, "sampling_seed": 3, "client": {"batch_size": 64, "local_init": "center"}},
    ),
    "8-bit uplink, half participation": (
        {"fraction": 0.5, "minimum": 2},
        {"rho": 0.1, "sampling_seed": 7, "uplink": Uplink(StochasticQuantizer(bits=8))},
    ),
    "top-25% uplink": (
        {"fraction": 1.0, "minimum": 2},
        {"rho": 0.1, "uplink": Uplink(TopK(fraction=0.25))},
    ),
    "local DP (clip 0.5, noise 0.3) and 8 bits": (
        {"fraction": 0.5, "minimum": 2},
        {
            "rho": 0.1,
            "sampling_seed": 2,
            "uplink": Uplink(
                StochasticQuantizer(bits=8), local_dp=LocalDP(clip=0.5, noise_multiplier=0.3)
            ),
            "client": {"dp_seed": 11},  # the noise is secret (OS entropy) without it
        },
    ),
}


def message_run(sampling: dict[str, Any], admm: dict[str, Any], client: dict[str, Any]) -> Any:
    recorder = ZRecorder()
    strategy = FedADMM(
        fraction_train=sampling["fraction"],
        min_train_nodes=sampling["minimum"],
        min_available_nodes=NUM_CLIENTS,
        fraction_evaluate=0.0,
        **admm,
    )
    grid = InProcessGrid(make_client_app(admm_client_fn(**client)), NUM_CLIENTS)
    run_strategy(strategy, grid, zeros(), ROUNDS, evaluate_fn=recorder)
    return strategy, recorder.matrix[1:]  # start() also records round 0


@pytest.mark.parametrize("case", list(CASES))
def test_legacy_and_message_api_give_identical_z_sequences(case: str) -> None:
    sampling, admm = CASES[case]
    admm = dict(admm)
    client = {**CLIENT, **admm.pop("client", {})}
    legacy, recorder, _ = run_seed(
        flwr_admm.server.FedADMM,
        ROUNDS,
        client_kwargs=client,
        fraction_fit=sampling["fraction"],
        min_fit_clients=sampling["minimum"],
        **admm,
    )
    message, z_message = message_run(sampling, admm, client)
    np.testing.assert_array_equal(z_message, recorder.matrix)
    assert legacy.admm is not None and message.admm is not None
    assert sorted(message.admm.records) == sorted(legacy.admm.records)
    for key, record in legacy.admm.records.items():
        for y_legacy, y_message in zip(record.y, message.admm.records[key].y, strict=True):
            np.testing.assert_array_equal(y_message, y_legacy)
    legacy_replies = [h["num_replies"] for h in legacy.history]
    assert [h["num_replies"] for h in message.history] == legacy_replies
    for name in ("uplink_bytes", "dp_epsilon"):  # present when compressing / with noise
        assert [h.get(name) for h in message.history] == [h.get(name) for h in legacy.history]
    uplink = admm.get("uplink")
    if uplink is not None and uplink.compressor is not None:
        assert all(h["uplink_bytes"] > 0 for h in message.history)
    if uplink is not None and uplink.local_dp is not None:
        assert message.history[-1]["dp_epsilon"] > 0
    if sampling["fraction"] < 1.0:
        assert max(legacy_replies) < NUM_CLIENTS  # the sample really was partial


def test_both_apis_report_the_adaptive_gamma_of_every_round() -> None:
    """`FedADMM()`'s round metrics carry the gamma each round's dual step used (the same
    on both APIs, the legacy one with ``form=None``, the Message API's default; it rises
    from 0.2 on this deterministic task); a fixed step reports none."""
    sampling = {"fraction": 1.0, "minimum": 2}
    adaptive, _ = message_run(sampling, {}, CLIENT)
    assert adaptive.algorithm.form == "linearized"
    gammas = [h["dual_step"] for h in adaptive.history]
    assert gammas[0] == 0.2 and gammas[-1] > 0.2 and gammas == sorted(gammas)
    legacy, _, _ = run_seed(
        flwr_admm.server.FedADMM,
        ROUNDS,
        client_kwargs=CLIENT,
        fraction_fit=1.0,
        min_fit_clients=2,
        form=None,
    )
    assert [h["dual_step"] for h in legacy.history] == gammas
    fixed, _ = message_run(sampling, {"dual_step": 0.5}, CLIENT)
    assert all("dual_step" not in h for h in fixed.history)
