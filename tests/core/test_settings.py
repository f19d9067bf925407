"""ConsensusSettings: one validated value for the ADMM keywords both FedADMMs take."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from flwr_admm.core import L1, ConsensusADMM, Constant, ResidualBalancing
from flwr_admm.core.settings import ConsensusSettings, schedule_of


def test_new_admm_is_the_core_with_these_settings() -> None:
    settings = ConsensusSettings(rho=0.5, regularizer=L1(0.1), relaxation=1.6)
    admm = settings.new_admm([np.zeros(3)])
    assert isinstance(admm, ConsensusADMM)
    assert (admm.rho, admm.relaxation, admm.regularizer) == (0.5, 1.6, settings.regularizer)
    assert settings.new_admm([np.zeros(3)]) is not admm  # a fresh core each time


def test_schedule_of_names_none_and_objects() -> None:
    assert isinstance(schedule_of(None), Constant)
    assert isinstance(schedule_of("residual-balancing"), ResidualBalancing)
    balancing = ResidualBalancing(mu=5.0)
    assert schedule_of(balancing) is balancing
    with pytest.raises(ValueError, match="rho_schedule"):
        schedule_of("cosine")


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"rho": -1.0}, "rho"),
        ({"rho": 0.0, "regularizer": L1(0.1)}, "rho"),
        ({"client_rho": "per-client"}, "client_rho"),
        ({"relaxation": 2.0}, "relaxation"),
        ({"eps_abs": float("nan")}, "eps_abs"),
        ({"regularizer": "l1"}, "regularizer"),
        ({"rho_schedule": 3}, "rho_schedule"),
    ],
)
def test_bad_settings_name_the_field(changes: dict[str, object], field: str) -> None:
    with pytest.raises(ValueError, match=field):
        ConsensusSettings(**changes)  # type: ignore[arg-type]


def test_settings_are_frozen() -> None:
    settings = ConsensusSettings()
    with pytest.raises(dataclasses.FrozenInstanceError):
        settings.rho = 2.0  # type: ignore[misc]


def test_a_deleted_schedule_name_is_a_value_error_naming_the_allowed_ones() -> None:
    with pytest.raises(ValueError, match=r"rho_schedule: must be one of \['constant', "):
        schedule_of("geometric")
