"""Client identity and eviction (issue 12, items 2, 4 and 7), beyond test_robustness.py.

Both strategies reject a conflicting claim and keep the owner's single reply of a
shared key; a node that changes its key every round cannot pile up votes;
`ClientPolicy.max_count` keeps the most recently heard keys; reserved fit-config keys are
refused; what Flower's FedAvg accepts is accepted. `KeyBinding`'s rules on their own:
tests/rounds/test_identity.py.
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np
import pytest
from fit_replies import Proxy, fit_res
from flower_run import NUM_CLIENTS, D, admm_client_fn, zeros_parameters
from flwr.client import NumPyClient
from flwr.common import (
    Context,
    FitRes,
    NDArrays,
    Scalar,
)
from flwr.server.client_manager import SimpleClientManager

from flwr_admm import ClientPolicy
from flwr_admm.rounds.identity import ABSENT_GRACE
from flwr_admm.server import FedADMM, FedADMMClientDuals
from flwr_admm.testing import make_proxies, run_rounds

CLIENT = {"local_steps": 5, "learning_rate": 0.5}


def first_reply(strategy_class: Any, value: float, n: int, metrics: dict[str, Scalar]) -> FitRes:
    """A first reply of either protocol (client-held duals send n_i c_i, previous round 0)."""
    if strategy_class is FedADMM:
        return fit_res([np.full(D, value)], n, metrics)
    protocol = {
        "admm-previous-round": 0,
        "admm-examples-change": n,
        "admm-w-sq-norm": float(D * value**2),
        "admm-u-sq-norm": 0.0,
    }
    return fit_res([n * np.full(D, value)], n, {**metrics, **protocol})


def configured(strategy: Any, cids: list[str]) -> Any:
    """Run configure_fit with `cids` connected (only the binding's view matters here)."""
    manager = SimpleClientManager()
    for proxy in make_proxies(admm_client_fn(**CLIENT), len(cids), node_ids=[int(c) for c in cids]):
        manager.register(proxy)
    strategy.configure_fit(1, zeros_parameters(), manager)
    return strategy


def client_keys(strategy: Any) -> list[str]:
    return sorted(
        strategy.admm.records if isinstance(strategy, FedADMM) else strategy.state.clients
    )


# ------------------------------------------------------ both strategies, one base
@pytest.mark.parametrize("strategy_class", [FedADMM, FedADMMClientDuals])
def test_a_conflicting_claim_is_rejected_in_both_strategies(strategy_class: Any) -> None:
    strategy = configured(
        strategy_class(rho=0.1, initial_parameters=zeros_parameters()), ["1", "2"]
    )
    owner = first_reply(strategy_class, 0.5, 10, {"partition-id": 0})
    strategy.aggregate_fit(1, [(Proxy("1"), owner)], [])
    configured(strategy, ["1", "2"])
    claim = first_reply(strategy_class, 3.0, 500, {"partition-id": 0})
    _, metrics = strategy.aggregate_fit(2, [(Proxy("2"), claim)], [])
    assert (metrics["num_key_conflicts"], metrics["num_rejected"]) == (1, 1)
    assert strategy.binding.node_of == {"partition-id:0": "1"}


@pytest.mark.parametrize("strategy_class", [FedADMM, FedADMMClientDuals])
def test_a_shared_key_keeps_the_single_reply_of_its_own_node(strategy_class: Any) -> None:
    strategy = configured(
        strategy_class(rho=0.1, initial_parameters=zeros_parameters()), ["1", "2"]
    )
    strategy.aggregate_fit(
        1, [(Proxy("1"), first_reply(strategy_class, 0.5, 10, {"partition-id": 0}))], []
    )
    configured(strategy, ["1", "2"])
    own = fit_res([np.full(D, 0.5)], 10, {"partition-id": 0})
    if strategy_class is FedADMMClientDuals:  # a follow-up reply: no change
        own = fit_res(
            [np.zeros(D)],
            10,
            {
                "partition-id": 0,
                "admm-previous-round": 1,
                "admm-examples-change": 0,
                "admm-w-sq-norm": float(D * 0.25),
                "admm-u-sq-norm": 0.0,
                "admm-delayed-sq-residual": 0.0,
            },
        )
    intruder = first_reply(strategy_class, 3.0, 500, {"partition-id": 0})
    _, metrics = strategy.aggregate_fit(2, [(Proxy("2"), intruder), (Proxy("1"), own)], [])
    assert metrics["num_key_conflicts"] == 1
    assert metrics["num_replies"] == 1


def test_unbound_shared_keys_are_all_rejected() -> None:
    strategy = configured(FedADMM(rho=0.1, initial_parameters=zeros_parameters()), ["1", "2"])
    replies = [(Proxy(c), fit_res([np.full(D, 0.5)], 10, {"partition-id": 0})) for c in "12"]
    parameters, metrics = strategy.aggregate_fit(1, replies, [])
    assert parameters is None and metrics["num_rejected"] == 2
    assert metrics["num_key_conflicts"] == 0


class KeyHopper(NumPyClient):
    """Reports a new client-key every round (a stale full-weight vote each time)."""

    def __init__(self, context: Context) -> None:
        self.context = context

    def fit(
        self, parameters: NDArrays, config: dict[str, Scalar]
    ) -> tuple[NDArrays, int, dict[str, Scalar]]:
        key = f"hop-{config['server_round']}"
        return [np.full(D, 5.0)], 500, {"client-key": key}


@pytest.mark.parametrize(("key_binding", "max_clients"), [("node", None), ("reported", 3)])
def test_a_key_hopping_node_cannot_pile_up_votes(key_binding: str, max_clients: int | None) -> None:
    strategy = FedADMM(
        rho=0.1,
        initial_parameters=zeros_parameters(),
        clients=ClientPolicy(key_binding=key_binding, max_count=max_clients),
        min_available_clients=3,
    )
    honest = make_proxies(admm_client_fn(**CLIENT), 2)
    hopper = make_proxies(KeyHopper, 3)[2]
    result = run_rounds(strategy, [*honest, hopper], 8)
    keys = client_keys(strategy)
    if key_binding == "node":  # its first key is its only one
        assert keys == ["client-key:hop-1", "partition-id:0", "partition-id:1"]
        assert [m["num_key_conflicts"] for m in result.fit_metrics] == [0] + [1] * 7
    else:  # trusted keys, but memory stays bounded: the oldest keys go
        assert keys == ["client-key:hop-8", "partition-id:0", "partition-id:1"]
        assert sum(int(m["num_evicted"]) for m in result.fit_metrics) == 7


def test_max_clients_keeps_the_most_recently_heard() -> None:
    strategy = FedADMM(
        rho=0.1, initial_parameters=zeros_parameters(), clients=ClientPolicy(max_count=4)
    )
    proxies = make_proxies(admm_client_fn(**CLIENT), NUM_CLIENTS)
    first = run_rounds(strategy, proxies, 1)
    assert client_keys(strategy) == [f"partition-id:{i}" for i in range(NUM_CLIENTS)]
    second = run_rounds(strategy, proxies[6:], 2, initial_parameters=first.parameters)
    # Before round 2 (all heard in round 1): ties in key order, so 0-5 go.
    assert second.fit_metrics[0]["num_evicted"] == 6
    assert client_keys(strategy) == [f"partition-id:{i}" for i in range(6, 10)]
    assert strategy.admm is not None and strategy.admm.sums.n == 4 * 500


# -------------------------------------------------------------------- drop-in
@pytest.mark.parametrize(
    "key", ["uplink", "uplink-bits", "dp-clip", "dp-noise", "admm-ack-round", "admm-anything"]
)
def test_reserved_fit_config_keys_are_an_error(key: str) -> None:
    for strategy_class in (FedADMM, FedADMMClientDuals):
        strategy = strategy_class(
            rho=0.1, initial_parameters=zeros_parameters(), on_fit_config_fn=lambda r: {key: 1}
        )
        with pytest.raises(ValueError, match=key):
            configured(strategy, ["1", "2"])


def test_user_fit_config_keys_reach_every_client() -> None:
    strategy = FedADMMClientDuals(
        rho=0.1, initial_parameters=zeros_parameters(), on_fit_config_fn=lambda r: {"tag": "x"}
    )
    manager = SimpleClientManager()
    for proxy in make_proxies(admm_client_fn(**CLIENT), 3):
        manager.register(proxy)
    instructions = strategy.configure_fit(1, zeros_parameters(), manager)
    assert [ins.config["tag"] for _, ins in instructions] == ["x"] * 3


@pytest.mark.parametrize(
    "kwargs",
    [
        {"min_fit_clients": 3},
        {"min_evaluate_clients": 5},
        {"min_available_clients": 0, "min_fit_clients": 0},
        {"fraction_fit": np.float32(0.5)},
        {"min_fit_clients": np.int64(2)},
        {"accept_failures": np.bool_(False)},
        {"inplace": False},
    ],
)
def test_what_fedavg_accepts_both_strategies_accept(kwargs: dict[str, Any]) -> None:
    for strategy_class in (FedADMM, FedADMMClientDuals):
        strategy_class(rho=0.1, **kwargs)


def test_flowers_own_warning_is_kept(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING):
        FedADMM(min_fit_clients=3)
    assert "min_available_clients" in caplog.text


def test_client_duals_metric_clashes_are_warned_and_ours_win(
    caplog: pytest.LogCaptureFixture,
) -> None:
    seen: list[int] = []

    def aggregate(replies: list[tuple[int, dict[str, Scalar]]]) -> dict[str, Scalar]:
        seen.append(len(replies))
        return {"num_replies": -1, "mine": 1.0}

    strategy = configured(
        FedADMMClientDuals(
            rho=0.1, initial_parameters=zeros_parameters(), fit_metrics_aggregation_fn=aggregate
        ),
        ["1", "2"],
    )
    good = first_reply(FedADMMClientDuals, 0.5, 10, {"partition-id": 0})
    bad = first_reply(FedADMMClientDuals, 0.5, 10, {"partition-id": "0"})
    with caplog.at_level(logging.WARNING):
        _, metrics = strategy.aggregate_fit(1, [(Proxy("1"), good), (Proxy("2"), bad)], [])
    assert seen == [1]
    assert metrics["num_replies"] == 1 and metrics["mine"] == 1.0
    assert "num_replies" in caplog.text


class SizedClient(NumPyClient):
    """Partition i holds 100 (i + 1) examples and returns w = center + 0.1 (i + 1)."""

    def __init__(self, context: Context) -> None:
        self.pid = int(context.node_config["partition-id"])

    def fit(
        self, parameters: NDArrays, config: dict[str, Scalar]
    ) -> tuple[NDArrays, int, dict[str, Scalar]]:
        step = 0.1 * (self.pid + 1)
        return [p + step for p in parameters], 100 * (self.pid + 1), {"partition-id": self.pid}


@pytest.mark.parametrize("strategy_class", [FedADMM, FedADMMClientDuals])
@pytest.mark.parametrize(("key_binding", "taken_over"), [("authenticated", False), ("node", True)])
def test_an_absent_owners_key_is_not_taken_over_under_authenticated(
    strategy_class: Any, key_binding: str, taken_over: bool
) -> None:
    """Node 1 owns partition 0 and leaves; node 2 claims partition 0. Under "node" the
    key is freed and rebound once node 1 has been absent for more than ABSENT_GRACE
    samplings (right for insecure restarts, which get new node ids);
    under "authenticated" (node ids fixed by registered keys) it is a conflict and
    node 1's state stays, so an authenticated node cannot report another node's key."""
    strategy = configured(
        strategy_class(
            rho=0.1,
            initial_parameters=zeros_parameters(),
            clients=ClientPolicy(key_binding=key_binding),
        ),
        ["1", "2"],
    )
    owner = first_reply(strategy_class, 0.5, 10, {"partition-id": 0})
    strategy.aggregate_fit(1, [(Proxy("1"), owner)], [])
    claim = first_reply(strategy_class, 3.0, 500, {"partition-id": 0})
    for _ in range(ABSENT_GRACE if taken_over else 0):  # node 1 within its grace: refused
        configured(strategy, ["2", "3"])
        _, metrics = strategy.aggregate_fit(2, [(Proxy("2"), claim)], [])
        assert (metrics["num_key_conflicts"], metrics["num_evicted"]) == (1, 0)
    configured(strategy, ["2", "3"])  # node 1 is not connected now
    _, metrics = strategy.aggregate_fit(2, [(Proxy("2"), claim)], [])
    if taken_over:
        assert (metrics["num_evicted"], metrics["num_key_conflicts"]) == (1, 0)
        assert strategy.binding.node_of == {"partition-id:0": "2"}
    else:
        assert (metrics["num_key_conflicts"], metrics["num_rejected"]) == (1, 1)
        assert metrics["num_evicted"] == 0
        assert strategy.binding.node_of == {"partition-id:0": "1"}
        assert client_keys(strategy) == ["partition-id:0"]
