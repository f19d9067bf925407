"""Fast ADMM and the measured defaults through the legacy FedADMM strategy.

The seed task's clients solve their w-step inexactly (20 gradient steps of lr 1), so
these runs check what the core's exact-solve tests (tests/core/test_acceleration.py)
cannot: restarts keep accelerated FedADMM from diverging over a 1000x range of rho.
"""

from __future__ import annotations

import re

import numpy as np
import pytest
from flower_run import run_seed
from seed_task import first_round_below, gaps

from flwr_admm.core import AdaptiveDualStep, ResidualBalancing
from flwr_admm.core.schedules import Constant
from flwr_admm.server import FedADMM, FedADMMClientDuals
from flwr_admm.server.fedadmm import fast_convex, textbook

CLIENT = {"local_steps": 20, "learning_rate": 1.0}


@pytest.mark.parametrize("rho", [0.01, 1.0, 10.0])
def test_fast_admm_with_inexact_solves_never_diverges(rho: float) -> None:
    strategy, recorder, _ = run_seed(
        FedADMM,
        60,
        client_kwargs=CLIENT,
        rho=rho,
        rho_schedule=Constant(),
        relaxation=1.0,
        acceleration="nesterov",
        dual_step=1.0,
    )
    gap = gaps(recorder.matrix)
    assert np.all(np.isfinite(gap)) and gap.max() < 1.0  # measured max 0.89 (rho 10, round 1)
    assert gap[-1] <= 1e-4  # measured 6.5e-14, 3.4e-11, 3.5e-5
    assert strategy.admm.fast is not None and strategy.admm.fast.restarts >= 1


@pytest.mark.parametrize(("rho", "measured"), [(0.01, 28), (0.1, 6), (1.0, 10), (10.0, 12)])
def test_fast_convex_reaches_1e6_without_tuning_rho(rho: float, measured: int) -> None:
    """FAST_CONVEX (the defaults before the CNN task) from any rho0 over 1000x."""
    _, recorder, _ = run_seed(fast_convex, 40, client_kwargs=CLIENT, rho=rho)
    reached = first_round_below(gaps(recorder.matrix), 1e-6)
    assert reached is not None and reached <= measured + 2


@pytest.mark.parametrize(("rho", "measured"), [(0.01, 32), (0.1, 30), (1.0, 28)])
def test_defaults_reach_1e6_without_tuning_rho(rho: float, measured: int) -> None:
    """The defaults (chosen on the CNN task) still reach 1e-6 here: 3x FAST_CONVEX's rounds."""
    _, recorder, _ = run_seed(FedADMM, 80, client_kwargs=CLIENT, rho=rho)
    reached = first_round_below(gaps(recorder.matrix), 1e-6)
    assert reached is not None and reached <= measured + 2


def test_defaults_are_the_measured_ones_and_rho_zero_is_fedavg() -> None:
    strategy = FedADMM()
    settings = strategy.admm_settings
    assert settings.acceleration is None and settings.relaxation == 1.0
    assert settings.rho == 0.1 and settings.dual_step == AdaptiveDualStep(floor=0.2)
    assert isinstance(settings.rho_schedule, ResidualBalancing)
    assert strategy.configuration()["dual_step"] == AdaptiveDualStep().describe()
    assert fast_convex().configuration()["acceleration"] == "nesterov"
    fedavg = FedADMM(rho=0.0)
    assert isinstance(fedavg.admm_settings.rho_schedule, Constant)
    assert fedavg.admm_settings.relaxation == 1.0
    plain = textbook()
    assert plain.admm_settings.new_admm([np.zeros(1)]).fast is None
    assert plain.admm_settings.dual_step == 1.0


def test_bad_acceleration_is_refused_naming_the_field() -> None:
    with pytest.raises(ValueError, match="acceleration"):
        FedADMM(acceleration="aitken")


def test_client_held_duals_refuse_a_bad_acceleration_naming_the_field() -> None:
    with pytest.raises(ValueError, match="acceleration: must be one of"):
        FedADMMClientDuals(acceleration="aitken")


@pytest.mark.parametrize("factory", [FedADMM, FedADMMClientDuals])
@pytest.mark.parametrize("deleted", ["anderson", "goldstein"])
def test_deleted_accelerations_are_refused_naming_the_allowed_values(
    factory: type, deleted: str
) -> None:
    with pytest.raises(ValueError, match=re.escape("must be one of [None, 'nesterov']")):
        factory(acceleration=deleted)
