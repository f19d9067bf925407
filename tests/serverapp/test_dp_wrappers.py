"""Flower's Message-API central-DP wrappers around FedADMM: why their contract fails.

Read against flwr 1.42's ``flwr/serverapp/strategy/dp_fixed_clipping.py`` (see
docs/message_api.md, "Flower's DP wrappers"). In short: with an accountant Flower
itself refuses any strategy whose ``aggregate_train`` is not FedAvg's; without one, the
wrapper's noise (std = noise_multiplier * C / m) is calibrated to a release that moves
by the mean of m updates clipped to C, which FedADMM's z-step is not (cached w_i and
duals of absent clients enter it; the dual step uses the noiseless z'), and for
client-held duals the clipped "updates" are changes of a sum, so clipping corrupts S.
Seed 000's task, 10 nodes, in process, noise_multiplier 0 (clipping only).
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
from flwr.serverapp.strategy import (
    DifferentialPrivacyClientSideFixedClipping,
    DifferentialPrivacyServerSideFixedClipping,
    FedAvg,
)
from flwr.supercore.privacy_accounting import SamplingMethod
from message_apps import ZRecorder, plain_app, warm_app, zeros
from seed_task import gaps

from flwr_admm.serverapp import FedADMM, FedADMMClientDuals
from flwr_admm.serverapp.testing import InProcessGrid, run_strategy

HALF = {"fraction_train": 0.5, "min_train_nodes": 5, "min_available_nodes": 10}
FULL = {"fraction_train": 1.0, "min_train_nodes": 10, "min_available_nodes": 10}
CLIP = 0.05


def released(strategy: Any, app: Any, rounds: int) -> np.ndarray:
    recorder = ZRecorder()
    run_strategy(strategy, InProcessGrid(app, 10), zeros(), rounds, evaluate_fn=recorder)
    return recorder.matrix


@pytest.mark.parametrize(
    "wrapper",
    [DifferentialPrivacyServerSideFixedClipping, DifferentialPrivacyClientSideFixedClipping],
)
@pytest.mark.parametrize("factory", [FedADMM, FedADMMClientDuals])
def test_flower_refuses_to_account_for_fedadmm(wrapper: Any, factory: Any) -> None:
    # What the wrapper reads of an accountant before its FedAvg check (lines 103-115).
    accountant = SimpleNamespace(
        config=SimpleNamespace(sampling_method=SamplingMethod.NO_AMPLIFICATION)
    )
    with pytest.raises(ValueError, match=r"FedAvg\.aggregate_train"):
        wrapper(factory(rho=0.1), 1.0, 1.0, 10, accountant=accountant)


def test_fedadmm_moves_z_further_than_the_clipped_mean_the_noise_is_calibrated_to() -> None:
    """FedAvg: ||z' - z|| <= C every round; FedADMM (half participation): not."""
    moves = {}
    for name, inner in (
        ("fedavg", FedAvg(fraction_evaluate=0.0, **HALF)),
        ("fedadmm", FedADMM(rho=0.1, relaxation=1.6, dual_step=1.0, fraction_evaluate=0.0, **HALF)),
    ):
        dp = DifferentialPrivacyServerSideFixedClipping(inner, 0.0, CLIP, 5)
        z = released(dp, plain_app, 20)
        moves[name] = np.linalg.norm(np.diff(z, axis=0), axis=1).max() / CLIP
    assert moves["fedavg"] <= 1.0  # measured 0.979
    # measured 1.54 with over-relaxation 1.6 and gamma 1 (0.96 with the defaults): cached
    # w_i, u_i of absent nodes and the relaxed step are not a clipped mean
    assert moves["fedadmm"] > 1.1, moves


def test_server_side_clipping_corrupts_client_held_duals() -> None:
    """The wrapper clips Delta_i - z (and sigma_i' - z): S no longer sums the shares."""
    inner = FedADMMClientDuals(rho=0.1, fraction_evaluate=0.0, **FULL)
    z = released(DifferentialPrivacyServerSideFixedClipping(inner, 0.0, 1.0, 10), warm_app, 30)
    plain = released(FedADMMClientDuals(rho=0.1, fraction_evaluate=0.0, **FULL), warm_app, 30)
    assert gaps(plain)[-1] <= 1e-10  # measured 2.0e-11
    assert gaps(z)[-1] >= 0.1  # measured 0.89: far from the optimum
