"""serverapp strategies as drop-ins for Flower's FedAvg / FedProx: constructor spelling
and positional order, aggregate_train without configure_train, round metrics."""

from __future__ import annotations

import inspect
from typing import Any

import numpy as np
import pytest
from flower_run import admm_client_fn
from flwr.app import MetricRecord, RecordDict
from flwr.serverapp.strategy import FedAvg, FedProx, strategy_utils
from message_apps import zeros
from message_replies import FakeGrid, configure, named, reply

from flwr_admm.clientapp import make_client_app
from flwr_admm.core.settings import DEFAULT_RHO
from flwr_admm.serverapp import SCAFFOLD, FedADMM, FedADMMClientDuals, FedDyn, FedNova
from flwr_admm.serverapp.testing import InProcessGrid, run_strategy

CONSENSUS = [FedADMM, FedADMMClientDuals]
FEDAVG_FIELDS = list(inspect.signature(FedAvg.__init__).parameters)[1:]
Z0 = {"w": np.zeros(3)}


def rho_of(strategy: Any) -> float:
    rho = strategy.admm_settings.rho if isinstance(strategy, FedADMM) else strategy.state.rho
    return float(rho)


def train_aggr(records: list[RecordDict], key: str) -> MetricRecord:
    return MetricRecord({"seen": len(records)})


def evaluate_aggr(records: list[RecordDict], key: str) -> MetricRecord:
    return MetricRecord({"seen": -len(records)})


# One value per FedAvg parameter, in Flower's order, none of them a default.
FEDAVG_ARGS = (0.5, 0.25, 3, 1, 4, "weight", "model", "settings", train_aggr, evaluate_aggr)


# ------------------------------------------------------------ rho / proximal_mu
@pytest.mark.parametrize("cls", CONSENSUS)
def test_proximal_mu_is_accepted_as_rho(cls: type) -> None:
    assert rho_of(cls(proximal_mu=0.1)) == 0.1
    assert rho_of(cls(rho=0.1, proximal_mu=0.1)) == 0.1  # both, equal
    assert rho_of(cls(form="prox")) == DEFAULT_RHO == 0.1  # neither: the default


@pytest.mark.parametrize("cls", CONSENSUS)
def test_rho_and_a_different_proximal_mu_is_a_value_error_naming_both(cls: type) -> None:
    with pytest.raises(ValueError, match=r"rho, proximal_mu: .*rho=0.1, proximal_mu=0.2"):
        cls(rho=0.1, proximal_mu=0.2)


def test_a_fedprox_call_site_sends_its_proximal_mu_as_rho() -> None:
    strategy = FedADMM(fraction_evaluate=0.0, proximal_mu=0.25)
    messages = configure(strategy, 1, named(Z0), FakeGrid([7, 8]))
    config = messages[0].content["config"]
    assert config["proximal-mu"] == config["rho"] == 0.25


# ---------------------------------------------------------- positional order
@pytest.mark.parametrize("cls", CONSENSUS)
def test_fedavg_parameters_come_first_in_flowers_order(cls: type) -> None:
    params = list(inspect.signature(cls.__init__).parameters.values())[1:]
    positional = [p.name for p in params if p.kind is p.POSITIONAL_OR_KEYWORD]
    assert positional == FEDAVG_FIELDS
    ours = {p.name for p in params if p.kind is p.KEYWORD_ONLY}
    assert {"rho", "proximal_mu"} <= ours


@pytest.mark.parametrize("cls", CONSENSUS)
def test_positional_arguments_mean_what_they_mean_to_flowers_fedavg(cls: type) -> None:
    flower, ours = FedAvg(*FEDAVG_ARGS), cls(*FEDAVG_ARGS)
    for name in FEDAVG_FIELDS:
        assert getattr(ours, name) == getattr(flower, name), name


@pytest.mark.parametrize("cls", CONSENSUS)
def test_fedprox_positional_proximal_mu_is_a_type_error(cls: type) -> None:
    assert FedProx(*FEDAVG_ARGS, 0.1).proximal_mu == 0.1  # Flower's FedProx: 11th
    with pytest.raises(TypeError):
        cls(*FEDAVG_ARGS, 0.1)


# ------------------------------------------- aggregate_train without configure_train
STRATEGIES = {
    "FedADMM": lambda: FedADMM(fraction_evaluate=0.0, rho=0.5),
    "FedADMMClientDuals": lambda: FedADMMClientDuals(fraction_evaluate=0.0),
    "SCAFFOLD": lambda: SCAFFOLD(fraction_evaluate=0.0),
    "FedDyn": lambda: FedDyn(alpha=0.1, fraction_evaluate=0.0),
    "FedNova": lambda: FedNova(fraction_evaluate=0.0),
}
NOT_OPEN = r"\.aggregate_train: call configure_train first"


def flower_test_replies() -> list[Any]:
    """Replies as Flower's strategy tests hand-build them: arrays and num-examples."""
    return [
        reply(7, {"w": np.ones(3)}, **{"num-examples": 10}),
        reply(8, {"w": np.full(3, 3.0)}, **{"num-examples": 30}),
    ]


@pytest.mark.parametrize("make", STRATEGIES.values(), ids=list(STRATEGIES))
def test_aggregate_train_before_any_configure_train_is_a_value_error(make: Any) -> None:
    strategy = make()
    with pytest.raises(ValueError, match=NOT_OPEN):
        strategy.aggregate_train(1, flower_test_replies())
    configure(strategy, 1, named(Z0), FakeGrid([7, 8]))  # and the strategy still runs
    strategy.aggregate_train(1, [])


def test_a_refused_aggregate_train_leaves_no_trace() -> None:
    refused, fresh = STRATEGIES["FedADMM"](), STRATEGIES["FedADMM"]()
    with pytest.raises(ValueError, match=NOT_OPEN):
        refused.aggregate_train(1, flower_test_replies())
    for strategy in (refused, fresh):
        configure(strategy, 1, named(Z0), FakeGrid([7, 8]))
        strategy.aggregate_train(1, flower_test_replies())
    assert refused.admm is not None and fresh.admm is not None
    (arrays, meta), (want, want_meta) = refused.admm.state_dict(), fresh.admm.state_dict()
    assert arrays.keys() == want.keys() and meta == want_meta
    for name, value in want.items():
        np.testing.assert_array_equal(arrays[name], value)
    assert refused.history == fresh.history


# ------------------------------------------------------------------ round metrics
RUN = {"fraction_evaluate": 0.0, "min_available_nodes": 4, "min_train_nodes": 4}
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


def two_rounds(strategy: Any) -> list[dict[str, Any]]:
    """Round metrics of two rounds of `make_client_app` around ADMMClients, 4 nodes."""
    grid = InProcessGrid(make_client_app(admm_client_fn(**CLIENT)), 4)
    result = run_strategy(strategy, grid, zeros(), 2)
    return [dict(result.train_metrics_clientapp[k]) for k in (1, 2)]


@pytest.mark.parametrize("make", RUNS.values(), ids=list(RUNS))
def test_round_metrics_hold_no_identity_or_protocol_key(make: Any) -> None:
    for metrics in two_rounds(make()):  # Flower's default train_metrics_aggr_fn
        assert [name for name in metrics if reply_only(name)] == []
        assert "loss" in metrics  # the replies' own metrics are still averaged


@pytest.mark.parametrize("make", RUNS.values(), ids=list(RUNS))
def test_a_users_train_metrics_aggr_fn_sees_the_replies_unchanged(make: Any) -> None:
    seen: list[set[str]] = []

    def user(records: list[RecordDict], key: str) -> MetricRecord:
        seen.extend(set(next(iter(r.metric_records.values()))) for r in records)
        return strategy_utils.aggregate_metricrecords(records, key)

    for metrics in two_rounds(make(train_metrics_aggr_fn=user)):
        assert [name for name in metrics if reply_only(name)] == []
    assert seen and all({"partition-id", "num-examples", "loss"} <= keys for keys in seen)
