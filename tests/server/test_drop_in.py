"""Legacy strategies as drop-ins for Flower's FedAvg / FedProx: constructor spelling
and keyword-only arguments, aggregate_fit without configure_fit, round metrics."""

from __future__ import annotations

import inspect
from typing import Any

import pytest
from flwr.server.strategy import FedAvg, FedProx

from flwr_admm.server import FedADMM, FedADMMClientDuals, FedADMMClientDualsSecAgg

CONSENSUS = [FedADMM, FedADMMClientDuals, FedADMMClientDualsSecAgg]


def rho_of(strategy: Any) -> float:
    return float(strategy.rho if isinstance(strategy, FedADMM) else strategy.state.rho)


# ------------------------------------------------------------ rho / proximal_mu
@pytest.mark.parametrize("cls", CONSENSUS)
def test_proximal_mu_is_accepted_as_rho(cls: type) -> None:
    assert rho_of(cls(proximal_mu=0.1)) == 0.1
    assert rho_of(cls(rho=0.1, proximal_mu=0.1)) == 0.1  # both, equal
    assert rho_of(cls()) == 1.0  # neither: the default is unchanged


@pytest.mark.parametrize("cls", CONSENSUS)
def test_rho_and_a_different_proximal_mu_is_a_value_error_naming_both(cls: type) -> None:
    with pytest.raises(ValueError, match=r"rho, proximal_mu: .*rho=0.1, proximal_mu=0.2"):
        cls(rho=0.1, proximal_mu=0.2)


def test_a_fedprox_call_site_runs_unchanged() -> None:
    kwargs = {"fraction_fit": 0.5, "min_fit_clients": 3, "proximal_mu": 0.25}
    flower, ours = FedProx(**kwargs), FedADMM(**kwargs)
    assert (ours.fraction_fit, ours.min_fit_clients, ours.rho) == (0.5, 3, flower.proximal_mu)


# ---------------------------------------------------------- keyword-only, as Flower
@pytest.mark.parametrize("cls", [FedAvg, FedProx, *CONSENSUS])
def test_no_positional_argument_as_in_flowers_legacy_fedavg(cls: type) -> None:
    params = list(inspect.signature(cls.__init__).parameters.values())[1:]
    assert [p.name for p in params if p.kind is p.POSITIONAL_OR_KEYWORD] == []
    with pytest.raises(TypeError):
        cls(0.5)
