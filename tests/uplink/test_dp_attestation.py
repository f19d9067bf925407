"""Local DP is accounted only for replies that attest it (issue 25, item 5, server half).

A strategy configured with ``Uplink(local_dp=...)`` sends ``dp-clip`` / ``dp-noise``; the ready
client (`ADMMClient`, and `make_client_app` around it) clips and noises and says so in
its reply (``admm-dp-applied`` = 1 with the C and sigma it used). A handler that
ignores the keys (a plain FedProx-style one) used to have its unprotected update
folded while ``dp_epsilon`` was reported; now its replies are rejected
(``num_rejected``, a warning naming ``admm-dp-applied``) and no epsilon is charged for
them. Both APIs; FedADMM and the legacy `UplinkWrapper`.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from flower_run import NUM_CLIENTS, admm_client_fn, run_seed, zeros_parameters
from flwr.client import NumPyClient
from flwr.common import Context, NDArrays, Scalar
from flwr.server.strategy import FedAvg
from message_apps import plain_app, zeros

import flwr_admm.server
from flwr_admm import Uplink
from flwr_admm.clientapp import make_client_app
from flwr_admm.serverapp import FedADMM
from flwr_admm.serverapp.testing import InProcessGrid, run_strategy
from flwr_admm.testing import make_proxies, run_rounds
from flwr_admm.uplink import LocalDP, PrivacyLedger, UplinkWrapper

DP = LocalDP(clip=0.01, noise_multiplier=1.0)
ROUNDS = 3
STALL = 2  # rounds without an accepted reply before the watchdog would end the run
CLIENT = {"local_steps": 20, "learning_rate": 1.0, "dp_seed": 5}


class PlainClient(NumPyClient):
    """A legacy client that ignores the dp-* keys: one FedProx-style step, no clipping."""

    def fit(
        self, parameters: NDArrays, config: dict[str, Scalar]
    ) -> tuple[NDArrays, int, dict[str, Scalar]]:
        return [p + 0.5 for p in parameters], 10, {}


def plain_client_fn(context: Context) -> Any:
    return PlainClient().to_client()


def expected_epsilon(rounds: int) -> float:
    ledger = PrivacyLedger(DP.noise_multiplier, DP.delta)
    for _ in range(rounds):
        ledger.record(NUM_CLIENTS, NUM_CLIENTS)
    return ledger.epsilon()


def message_run(client_app: Any, rounds: int = ROUNDS) -> FedADMM:
    strategy = FedADMM(
        rho=0.1,
        uplink=Uplink(local_dp=DP),
        min_train_nodes=NUM_CLIENTS,
        min_available_nodes=NUM_CLIENTS,
    )
    strategy.fraction_evaluate = 0.0
    run_strategy(strategy, InProcessGrid(client_app, NUM_CLIENTS), zeros(), rounds)
    return strategy


def test_attestation_must_match_the_configured_clip_and_noise() -> None:
    assert DP.attestation_problem(DP.attestation()) is None
    assert "admm-dp-applied" in str(DP.attestation_problem({}))
    other = LocalDP(clip=0.02, noise_multiplier=1.0).attestation()
    assert "clip 0.01" in str(DP.attestation_problem(other))


def test_message_api_replies_that_ignore_local_dp_are_rejected_and_not_accounted(
    caplog: pytest.LogCaptureFixture,
) -> None:
    strategy = message_run(plain_app, rounds=STALL)
    assert strategy.history == []  # no round folded an unprotected update
    assert (
        strategy.algorithm.channel.ledger is not None
        and strategy.algorithm.channel.ledger.rounds == 0
    )
    assert "admm-dp-applied" in caplog.text


def test_message_api_ready_client_is_accepted_with_the_epsilon_as_before() -> None:
    strategy = message_run(make_client_app(admm_client_fn(**CLIENT)))
    assert [h["num_rejected"] for h in strategy.history] == [0] * ROUNDS
    assert [h["num_replies"] for h in strategy.history] == [NUM_CLIENTS] * ROUNDS
    assert strategy.history[-1]["dp_epsilon"] == pytest.approx(expected_epsilon(ROUNDS))


@pytest.mark.parametrize("wrapped", [False, True], ids=["FedADMM", "UplinkWrapper(FedAvg)"])
def test_legacy_replies_that_ignore_local_dp_are_rejected_and_not_accounted(
    wrapped: bool, caplog: pytest.LogCaptureFixture
) -> None:
    def factory(**kwargs: Any) -> Any:
        if wrapped:
            kwargs.pop("rho")
            return UplinkWrapper(FedAvg(**kwargs), local_dp=DP)
        return flwr_admm.server.FedADMM(uplink=Uplink(local_dp=DP), **kwargs)

    def run(client_fn: Any) -> Any:
        strategy = factory(rho=0.1, initial_parameters=zeros_parameters())
        rounds = ROUNDS if client_fn is not plain_client_fn else STALL
        return run_rounds(strategy, make_proxies(client_fn, NUM_CLIENTS), rounds)

    result = run(plain_client_fn)
    assert [m["num_rejected"] for m in result.fit_metrics] == [NUM_CLIENTS] * STALL
    assert all(m.get("dp_epsilon", 0.0) == 0.0 for m in result.fit_metrics)
    assert "admm-dp-applied" in caplog.text
    result = run(admm_client_fn(**CLIENT))  # the ready client: as before
    assert [m["num_rejected"] for m in result.fit_metrics] == [0] * ROUNDS
    assert result.fit_metrics[-1]["dp_epsilon"] == pytest.approx(expected_epsilon(ROUNDS))


def test_legacy_and_message_ready_clients_agree() -> None:
    legacy, _, _ = run_seed(
        flwr_admm.server.FedADMM, ROUNDS, client_kwargs=CLIENT, rho=0.1, uplink=Uplink(local_dp=DP)
    )
    message = message_run(make_client_app(admm_client_fn(**CLIENT)))
    eps = [h["dp_epsilon"] for h in message.history]
    assert eps == [h["dp_epsilon"] for h in legacy.history]
    assert np.all(np.diff(eps) > 0)
