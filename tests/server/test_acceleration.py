"""Fast ADMM and the measured defaults through the legacy FedADMM strategy.

The seed task's clients solve their w-step inexactly (20 gradient steps of lr 1), so
these runs check what the core's exact-solve tests (tests/core/test_acceleration.py)
cannot: restarts keep accelerated FedADMM from diverging over a 1000x range of rho.
"""

from __future__ import annotations

import numpy as np
import pytest
from flower_run import run_seed
from seed_task import first_round_below, gaps

from flwr_admm import FedADMM, FedADMMClientDuals, ResidualBalancing
from flwr_admm.core.schedules import Constant

CLIENT = {"local_steps": 20, "learning_rate": 1.0}


@pytest.mark.parametrize("rho", [0.01, 1.0, 10.0])
def test_fast_admm_with_inexact_solves_never_diverges(rho: float) -> None:
    strategy, recorder, _ = run_seed(
        FedADMM, 60, client_kwargs=CLIENT, rho=rho, rho_schedule=Constant(), relaxation=1.0
    )
    gap = gaps(recorder.matrix)
    assert np.all(np.isfinite(gap)) and gap.max() < 1.0  # measured max 0.89 (rho 10, round 1)
    assert gap[-1] <= 1e-4  # measured 6.5e-14, 3.4e-11, 3.5e-5
    assert strategy.admm.fast is not None and strategy.admm.fast.restarts >= 1


@pytest.mark.parametrize(("rho", "measured"), [(0.01, 28), (0.1, 6), (1.0, 10), (10.0, 12)])
def test_defaults_reach_1e6_without_tuning_rho(rho: float, measured: int) -> None:
    _, recorder, _ = run_seed(FedADMM, 40, client_kwargs=CLIENT, rho=rho)
    reached = first_round_below(gaps(recorder.matrix), 1e-6)
    assert reached is not None and reached <= measured + 2


def test_defaults_are_the_measured_ones_and_rho_zero_is_fedavg() -> None:
    strategy = FedADMM()
    assert strategy.acceleration == "nesterov" and strategy.relaxation == 1.6
    assert isinstance(strategy.rho_schedule, ResidualBalancing)
    assert strategy.configuration()["acceleration"] == "nesterov"
    fedavg = FedADMM(rho=0.0)
    assert isinstance(fedavg.rho_schedule, Constant) and fedavg.relaxation == 1.0
    plain = FedADMM(rho_schedule="constant", relaxation=1.0, acceleration=None)
    assert plain.admm_settings.new_admm([np.zeros(1)]).fast is None


def test_bad_acceleration_is_refused_naming_the_field() -> None:
    with pytest.raises(ValueError, match="acceleration"):
        FedADMM(acceleration="aitken")
    with pytest.raises(ValueError, match="restart_eta"):
        FedADMM(restart_eta=0.0)


def test_client_held_duals_refuse_a_bad_acceleration_naming_the_field() -> None:
    with pytest.raises(ValueError, match="acceleration: must be one of"):
        FedADMMClientDuals(acceleration="aitken")
    with pytest.raises(ValueError, match="with client-held duals, got 'anderson'"):
        FedADMMClientDuals(acceleration="anderson")  # FedADMM only
    with pytest.raises(ValueError, match="restart_eta"):
        FedADMMClientDuals(acceleration="nesterov", restart_eta=0.0)


# Rounds to a 1e-6 gap at constant rho, alpha 1 (measured): Anderson 7, 10, 17;
# fast ADMM 10, 29, > 60; plain 17, > 60, > 60.
@pytest.mark.parametrize(("rho", "measured"), [(0.1, 7), (1.0, 10), (10.0, 17)])
def test_anderson_with_inexact_solves_reaches_the_optimum(rho: float, measured: int) -> None:
    strategy, recorder, _ = run_seed(
        FedADMM,
        60,
        client_kwargs=CLIENT,
        rho=rho,
        rho_schedule=Constant(),
        relaxation=1.0,
        acceleration="anderson",
    )
    gap = gaps(recorder.matrix)
    reached = first_round_below(gap, 1e-6)
    assert np.all(np.isfinite(gap)) and reached is not None and reached <= measured + 2
    assert strategy.admm.anderson is not None and strategy.admm.anderson.accel.accepted >= 1
