"""Legacy strategies as drop-ins for Flower's FedAvg / FedProx: constructor spelling
and keyword-only arguments, aggregate_fit without configure_fit, round metrics."""

from __future__ import annotations

import inspect
from typing import Any

import numpy as np
import pytest
from fit_replies import Proxy, fit_res
from flower_run import admm_client_fn, zeros_parameters
from flwr.common import ndarrays_to_parameters
from flwr.server.client_manager import SimpleClientManager
from flwr.server.strategy import FedAvg, FedProx

from flwr_admm.core.settings import DEFAULT_RHO
from flwr_admm.server import (
    SCAFFOLD,
    FedADMM,
    FedADMMClientDuals,
    FedADMMClientDualsSecAgg,
    FedDyn,
    FedNova,
)
from flwr_admm.testing import make_proxies, run_rounds

CONSENSUS = [FedADMM, FedADMMClientDuals, FedADMMClientDualsSecAgg]


def rho_of(strategy: Any) -> float:
    rho = strategy.admm_settings.rho if isinstance(strategy, FedADMM) else strategy.state.rho
    return float(rho)


# ------------------------------------------------------------ rho / proximal_mu
@pytest.mark.parametrize("cls", CONSENSUS)
def test_proximal_mu_is_accepted_as_rho(cls: type) -> None:
    assert rho_of(cls(proximal_mu=0.1)) == 0.1
    assert rho_of(cls(rho=0.1, proximal_mu=0.1)) == 0.1  # both, equal
    assert rho_of(cls()) == DEFAULT_RHO == 0.1  # neither: the default


@pytest.mark.parametrize("cls", CONSENSUS)
def test_rho_and_a_different_proximal_mu_is_a_value_error_naming_both(cls: type) -> None:
    with pytest.raises(ValueError, match=r"rho, proximal_mu: .*rho=0.1, proximal_mu=0.2"):
        cls(rho=0.1, proximal_mu=0.2)


def test_a_fedprox_call_site_runs_unchanged() -> None:
    kwargs = {"fraction_fit": 0.5, "min_fit_clients": 3, "proximal_mu": 0.25}
    flower, ours = FedProx(**kwargs), FedADMM(**kwargs)
    got = (ours.fraction_fit, ours.min_fit_clients, ours.admm_settings.rho)
    assert got == (0.5, 3, flower.proximal_mu)


# ---------------------------------------------------------- keyword-only, as Flower
@pytest.mark.parametrize("cls", [FedAvg, FedProx, *CONSENSUS])
def test_no_positional_argument_as_in_flowers_legacy_fedavg(cls: type) -> None:
    params = list(inspect.signature(cls.__init__).parameters.values())[1:]
    assert [p.name for p in params if p.kind is p.POSITIONAL_OR_KEYWORD] == []
    with pytest.raises(TypeError):
        cls(0.5)


# ------------------------------------------------ aggregate_fit without configure_fit
STRATEGIES = {
    "FedADMM": lambda: FedADMM(rho=0.5),
    "FedADMMClientDuals": lambda: FedADMMClientDuals(),
    "FedADMMClientDualsSecAgg": lambda: FedADMMClientDualsSecAgg(),
    "SCAFFOLD": lambda: SCAFFOLD(),
    "FedDyn": lambda: FedDyn(alpha=0.1),
    "FedNova": lambda: FedNova(),
}
NOT_OPEN = r"\.aggregate_fit: call configure_fit first"
X0 = [np.zeros(3)]


def _unused_client_fn(context: Any) -> Any:  # pragma: no cover - never called
    raise AssertionError("client_fn must not be called in these tests")


def started(strategy: Any) -> Any:
    """Register two in-process clients and run configure_fit of round 1 from X0."""
    manager = SimpleClientManager()
    for proxy in make_proxies(_unused_client_fn, 2):
        manager.register(proxy)
    assert len(strategy.configure_fit(1, ndarrays_to_parameters(X0), manager)) == 2
    return strategy


def flower_test_results() -> list[Any]:
    """Results as Flower's strategy tests hand-build them: arrays and num_examples."""
    return [
        (Proxy("1"), fit_res([np.ones(3)], 10, {})),
        (Proxy("2"), fit_res([np.full(3, 3.0)], 30, {})),
    ]


@pytest.mark.parametrize("make", STRATEGIES.values(), ids=list(STRATEGIES))
def test_aggregate_fit_before_any_configure_fit_is_a_value_error(make: Any) -> None:
    strategy = make()
    with pytest.raises(ValueError, match=NOT_OPEN):
        strategy.aggregate_fit(1, flower_test_results(), [])
    started(strategy).aggregate_fit(1, [], [])  # and the strategy still runs


def test_a_refused_aggregate_fit_leaves_no_trace() -> None:
    refused, fresh = STRATEGIES["FedADMM"](), STRATEGIES["FedADMM"]()
    with pytest.raises(ValueError, match=NOT_OPEN):
        refused.aggregate_fit(1, flower_test_results(), [])
    for strategy in (refused, fresh):
        started(strategy).aggregate_fit(1, flower_test_results(), [])
    (arrays, meta), (want, want_meta) = refused.admm.state_dict(), fresh.admm.state_dict()
    assert arrays.keys() == want.keys() and meta == want_meta
    for name, value in want.items():
        np.testing.assert_array_equal(arrays[name], value)
    assert refused.history == fresh.history


# ------------------------------------------------------------------ round metrics
RUN = {"min_available_clients": 4, "min_fit_clients": 4}
RUNS = {
    "FedADMM": lambda **kw: FedADMM(rho=0.1, **RUN, **kw),
    "FedADMMClientDuals": lambda **kw: FedADMMClientDuals(rho=0.1, **RUN, **kw),
    "SCAFFOLD": lambda **kw: SCAFFOLD(**RUN, **kw),
    "FedDyn": lambda **kw: FedDyn(alpha=0.1, **RUN, **kw),
    "FedNova": lambda **kw: FedNova(**RUN, **kw),
}
CLIENT = {"local_steps": 5, "learning_rate": 0.5}


def reply_only(name: str) -> bool:
    return name in ("partition-id", "client-key", "num-examples") or name.startswith("admm-")


def weighted_mean_of_every_metric(fit_metrics: list[tuple[int, dict[str, Any]]]) -> dict:
    """A user's fit_metrics_aggregation_fn: Flower's Message-API default, for legacy."""
    total = sum(n for n, _ in fit_metrics)
    names = {k for _, m in fit_metrics for k, v in m.items() if isinstance(v, int | float)}
    return {k: sum(n * float(m.get(k, 0.0)) for n, m in fit_metrics) / total for k in names}


@pytest.mark.parametrize("make", RUNS.values(), ids=list(RUNS))
def test_round_metrics_hold_no_identity_or_protocol_key(make: Any) -> None:
    seen: list[set[str]] = []

    def user(fit_metrics: list[tuple[int, dict[str, Any]]]) -> dict:
        seen.extend(set(m) for _, m in fit_metrics)
        return weighted_mean_of_every_metric(fit_metrics)

    strategy = make(fit_metrics_aggregation_fn=user)
    proxies = make_proxies(admm_client_fn(**CLIENT), 4)
    result = run_rounds(strategy, proxies, 2, initial_parameters=zeros_parameters())
    for metrics in result.fit_metrics:
        assert [name for name in metrics if reply_only(name)] == []
        assert "loss" in metrics  # the replies' own metrics are still averaged
    assert seen and all({"partition-id", "loss"} <= keys for keys in seen)  # unchanged
