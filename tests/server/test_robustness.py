"""Robustness of the legacy strategies against hostile or unlucky replies.

Hostile client keys never crash `aggregate_fit`; a key belongs to the node it was
first bound to (a conflicting claim is rejected, the owner's dual untouched); stale
keys can be evicted; 0-d tensors keep their shape; rho = 0 with the default client is
Flower's FedAvg; FedADMM accepts what Flower's FedAvg accepts. Each test failed on the
code before the fix it covers.
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np
import pytest
from fit_replies import Proxy, fit_res
from flower_run import NUM_CLIENTS, D, admm_client_fn, run_seed, zeros_parameters
from flwr.client import NumPyClient
from flwr.common import (
    Context,
    NDArrays,
    Scalar,
    ndarrays_to_parameters,
    parameters_to_ndarrays,
)
from flwr.server.client_manager import SimpleClientManager
from flwr.server.strategy import FedAvg

from flwr_admm import ClientPolicy
from flwr_admm.rounds.identity import ABSENT_GRACE
from flwr_admm.server import FedADMM, FedADMMClientDuals
from flwr_admm.server.fedadmm import textbook
from flwr_admm.testing import make_proxies, run_rounds

CLIENT = {"local_steps": 20, "learning_rate": 1.0}


def started(strategy: Any, num_clients: int = 3) -> tuple[Any, list[Any]]:
    """A strategy after one configure_fit over `num_clients` seed-task clients."""
    manager = SimpleClientManager()
    proxies = make_proxies(admm_client_fn(**CLIENT), num_clients)
    for proxy in proxies:
        manager.register(proxy)
    strategy.configure_fit(1, zeros_parameters(), manager)
    return strategy, proxies


# -------------------------------------------------------------- hostile keys
HOSTILE: list[dict[str, Scalar]] = [
    {"client-key": "a1\u00b2"},  # isdigit() but not int()
    {"client-key": "9" * 4301},  # beyond int()'s digit limit
    {"client-key": "\x00" * 10_000},
    {"partition-id": 1.9},
    {"partition-id": True},
    {"partition-id": "1"},
    {"partition-id": float("nan")},
    {"partition-id": -(2**80)},
]


@pytest.mark.parametrize("strategy_class", [FedADMM, FedADMMClientDuals])
@pytest.mark.parametrize("metrics", HOSTILE, ids=range(len(HOSTILE)))
def test_a_hostile_client_key_never_raises_and_never_collides(
    strategy_class: Any, metrics: dict[str, Scalar]
) -> None:
    strategy, _ = started(strategy_class(rho=0.1, initial_parameters=zeros_parameters()))
    honest = fit_res([np.full(D, 0.5)], 10, {"partition-id": 1})
    hostile = fit_res([np.full(D, 0.25)], 10, dict(metrics))
    if strategy_class is FedADMMClientDuals:  # a first reply of the protocol
        for res in (honest, hostile):
            res.metrics.update(
                {
                    "admm-previous-round": 0,
                    "admm-examples-change": 10,
                    "admm-w-sq-norm": 1.0,
                    "admm-u-sq-norm": 0.0,
                }
            )
            res.parameters = ndarrays_to_parameters([10 * np.full(D, 0.5)])
    parameters, round_metrics = strategy.aggregate_fit(
        1, [(Proxy("1"), honest), (Proxy("2"), hostile)], []
    )
    assert parameters is not None
    keys = strategy.admm.records if strategy_class is FedADMM else strategy.state.clients
    # The honest client 1 is filed alone under its own key.
    assert "partition-id:1" in keys
    assert round_metrics["num_replies"] + round_metrics["num_rejected"] == 2


def test_client_key_normal_form_is_canonical() -> None:
    from flwr_admm.rounds.identity import client_key_of

    assert client_key_of("5", {"partition-id": 3}) == "partition-id:3"
    assert client_key_of("5", {"client-key": "bank-a"}) == "client-key:bank-a"
    assert client_key_of("5", {}) == "cid:5"
    for bad in (1.9, True, "1", float("inf"), -1):
        with pytest.raises(ValueError, match="partition-id"):
            client_key_of("5", {"partition-id": bad})
    with pytest.raises(ValueError, match="client-key"):
        client_key_of("5", {"client-key": "x" * 1000})


# ------------------------------------------------------------ identity binding
def test_a_client_claiming_an_absent_clients_key_leaves_its_dual_unchanged() -> None:
    strategy = FedADMM(rho=0.1, initial_parameters=zeros_parameters())
    proxies = make_proxies(admm_client_fn(**CLIENT), NUM_CLIENTS)
    run_rounds(strategy, proxies, 4)
    manager = SimpleClientManager()
    for proxy in proxies:
        manager.register(proxy)
    strategy.configure_fit(5, zeros_parameters(), manager)
    admm = strategy.admm
    victim = "partition-id:0"
    y_before = [t.copy() for t in admm.records[victim].y]
    w_before = [t.copy() for t in admm.records[victim].w]
    # Node of partition 5 now reports partition 0 (which is not in this round).
    attacker = proxies[5]
    res = fit_res([np.full(D, 3.0)], 500, {"partition-id": 0})
    _, metrics = strategy.aggregate_fit(5, [(attacker, res)], [])
    assert metrics["num_key_conflicts"] == 1
    assert metrics["num_rejected"] == 1
    for before, after in zip(y_before, admm.records[victim].y, strict=True):
        np.testing.assert_array_equal(before, after)
    for before, after in zip(w_before, admm.records[victim].w, strict=True):
        np.testing.assert_array_equal(before, after)
    # The attacker is never sent the victim's center.
    for proxy, ins in strategy.configure_fit(6, zeros_parameters(), manager):
        if proxy.cid == attacker.cid:
            sent = parameters_to_ndarrays(ins.parameters)[0]
            np.testing.assert_array_equal(sent, strategy.admm.center("partition-id:5")[0])


def test_a_key_whose_node_left_is_freed_and_restarts_fresh() -> None:
    strategy = FedADMM(rho=0.1, initial_parameters=zeros_parameters())
    proxies = make_proxies(admm_client_fn(**CLIENT), 3)
    first = run_rounds(strategy, proxies, 3)
    # Partition 0 comes back under a new node id (restarted SuperNode); its old node
    # is gone from the federation. While the old node is within its grace the key is
    # still its own (the new node's claims are conflicts); then the key is freed.
    renewed = make_proxies(admm_client_fn(**CLIENT), 3, node_ids=[101, 2, 3])
    second = run_rounds(strategy, renewed, ABSENT_GRACE + 1, initial_parameters=first.parameters)
    for metrics in second.fit_metrics[:ABSENT_GRACE]:
        assert (metrics["num_key_conflicts"], metrics["num_replies"]) == (1, 2)
    last = second.fit_metrics[ABSENT_GRACE]
    assert (last["num_key_conflicts"], last["num_evicted"], last["num_replies"]) == (0, 1, 3)
    assert sorted(strategy.admm.records) == [f"partition-id:{i}" for i in range(3)]
    assert strategy.binding.owner("partition-id:0") == "101"


def test_a_node_that_misses_a_round_keeps_its_key_against_a_claimant() -> None:
    """Issue 25, item 2: node 0 is away for one sampling, a new node reports its key;
    the claim is a conflict, node 0's dual is untouched, and node 0 is accepted on
    return (the old code evicted node 0's state, bound the key to the newcomer and
    refused node 0 for good)."""
    strategy = FedADMM(rho=0.1, initial_parameters=zeros_parameters())
    proxies = make_proxies(admm_client_fn(**CLIENT), 6)
    result = run_rounds(strategy, proxies, 2)
    y_before = [t.copy() for t in strategy.admm.records["partition-id:0"].y]
    manager = SimpleClientManager()
    newcomer = make_proxies(admm_client_fn(**CLIENT), 1, node_ids=[99])[0]
    for proxy in [*proxies[1:], newcomer]:  # node of partition 0 is away this round
        manager.register(proxy)
    strategy.configure_fit(3, result.parameters, manager)
    res = fit_res([np.full(D, 3.0)], 500, {"partition-id": 0})
    _, metrics = strategy.aggregate_fit(3, [(newcomer, res)], [])
    assert metrics["num_key_conflicts"] == 1 and metrics["num_evicted"] == 0
    for before, after in zip(y_before, strategy.admm.records["partition-id:0"].y, strict=True):
        np.testing.assert_array_equal(before, after)
    back = run_rounds(strategy, proxies, 2, initial_parameters=result.parameters)
    assert all(m["num_key_conflicts"] == 0 and m["num_replies"] == 6 for m in back.fit_metrics)
    assert strategy.binding.owner("partition-id:0") == proxies[0].cid


def test_key_binding_reported_keeps_the_old_re_identification() -> None:
    strategy = FedADMM(
        rho=0.1, initial_parameters=zeros_parameters(), clients=ClientPolicy(key_binding="reported")
    )
    proxies = make_proxies(admm_client_fn(**CLIENT), 3)
    run_rounds(strategy, proxies, 2)
    res = fit_res([np.full(D, 3.0)], 500, {"partition-id": 0})
    _, metrics = strategy.aggregate_fit(3, [(proxies[2], res)], [])
    assert metrics["num_key_conflicts"] == 0


def test_max_client_age_evicts_stale_keys_and_their_votes() -> None:
    strategy = FedADMM(
        rho=0.1, initial_parameters=zeros_parameters(), clients=ClientPolicy(max_age=3)
    )
    proxies = make_proxies(admm_client_fn(**CLIENT), NUM_CLIENTS)
    result = run_rounds(strategy, proxies, 2)
    # Only partitions 0-4 keep replying.
    run_rounds(strategy, proxies[:5], 5, initial_parameters=result.parameters)
    assert sorted(strategy.admm.records) == [f"partition-id:{i}" for i in range(5)]
    # The sums equal a fresh recomputation over the kept records.
    z = [t.copy() for t in strategy.admm.z]
    assert all(np.isfinite(t).all() for t in z)


# ---------------------------------------------------------------- 0-d tensors
class ZeroDimClient(NumPyClient):
    """Returns w = center + 1 for a model [vector (3,), scalar ()], echoing shapes."""

    def __init__(self, context: Context) -> None:
        self.pid = int(context.node_config["partition-id"])
        self.shapes: list[tuple[int, ...]] = []

    def fit(
        self, parameters: NDArrays, config: dict[str, Scalar]
    ) -> tuple[NDArrays, int, dict[str, Scalar]]:
        SEEN.append([np.shape(p) for p in parameters])
        return [np.asarray(p) + 1.0 + self.pid for p in parameters], 10, {"partition-id": self.pid}


SEEN: list[list[tuple[int, ...]]] = []


@pytest.mark.parametrize("rho", [0.0, 0.5])
def test_a_0d_tensor_keeps_its_shape_every_round(rho: float) -> None:
    SEEN.clear()
    initial = ndarrays_to_parameters([np.zeros(3), np.array(0.0)])
    strategy = FedADMM(rho=rho, initial_parameters=initial)
    result = run_rounds(strategy, make_proxies(ZeroDimClient, 3), 4)
    assert all(m["num_rejected"] == 0 for m in result.fit_metrics)
    assert SEEN and all(shapes == [(3,), ()] for shapes in SEEN)
    final = parameters_to_ndarrays(result.parameters)
    assert [a.shape for a in final] == [(3,), ()]
    assert all(r.w[1].shape == () for r in strategy.admm.records.values())


# ------------------------------------------------------------- rho = 0 is FedAvg
def test_rho_zero_with_the_default_client_is_flowers_fedavg() -> None:
    _, fedadmm, _ = run_seed(textbook, 20, client_kwargs=CLIENT, rho=0.0)
    _, fedavg, _ = run_seed(FedAvg, 20, client_kwargs=CLIENT)
    np.testing.assert_allclose(fedadmm.matrix, fedavg.matrix, rtol=1e-12, atol=1e-15)


# --------------------------------------------------------------------- drop-in
def test_what_fedavg_accepts_fedadmm_accepts(caplog: pytest.LogCaptureFixture) -> None:
    FedAvg(min_fit_clients=3)  # Flower only warns (min_available_clients=2)
    with caplog.at_level(logging.WARNING):
        FedADMM(min_fit_clients=3)
        FedADMMClientDuals(min_fit_clients=3)


@pytest.mark.parametrize("key", ["rho", "proximal_mu", "server_round", "admm-duals"])
def test_on_fit_config_keys_that_collide_with_ours_are_an_error(key: str) -> None:
    strategy = FedADMM(
        rho=0.1, initial_parameters=zeros_parameters(), on_fit_config_fn=lambda r: {key: 7.0}
    )
    manager = SimpleClientManager()
    for proxy in make_proxies(admm_client_fn(**CLIENT), 2):
        manager.register(proxy)
    with pytest.raises(ValueError, match=key):
        strategy.configure_fit(1, zeros_parameters(), manager)


def test_the_round_in_a_users_fit_config_is_no_clash() -> None:
    # Flower's tutorials return {"server_round": server_round, ...}: same value as ours.
    strategy = FedADMM(
        rho=0.1,
        initial_parameters=zeros_parameters(),
        on_fit_config_fn=lambda r: {"server_round": r, "local_epochs": 2},
    )
    manager = SimpleClientManager()
    for proxy in make_proxies(admm_client_fn(**CLIENT), 2):
        manager.register(proxy)
    sent = strategy.configure_fit(1, zeros_parameters(), manager)
    assert [ins.config["server_round"] for _, ins in sent] == [1, 1]
    assert all(ins.config["local_epochs"] == 2 for _, ins in sent)


def test_fit_metrics_aggregation_sees_only_the_accepted_replies() -> None:
    seen: list[int] = []

    def aggregate(replies: list[tuple[int, dict[str, Scalar]]]) -> dict[str, Scalar]:
        seen.append(len(replies))
        return {"custom": float(len(replies))}

    strategy, proxies = started(
        FedADMM(
            rho=0.1,
            initial_parameters=zeros_parameters(),
            fit_metrics_aggregation_fn=aggregate,
        )
    )
    good = fit_res([np.full(D, 0.5)], 10, {"partition-id": 0})
    bad = fit_res([np.full(D, np.nan)], 10, {"partition-id": 1})
    _, metrics = strategy.aggregate_fit(1, [(proxies[0], good), (proxies[1], bad)], [])
    assert seen == [1]
    assert metrics["custom"] == 1.0


def test_a_nan_reply_among_several_is_rejected_and_the_round_is_that_of_the_others() -> None:
    """The replies are absorbed together (`absorb_all`); the NaN one is refused."""
    rng = np.random.default_rng(4)
    models = [rng.normal(size=D) for _ in range(4)]
    poisoned = models[1].copy()
    poisoned[3] = np.nan
    got, proxies = started(FedADMM(rho=0.5, initial_parameters=zeros_parameters()), 4)
    want, twins = started(FedADMM(rho=0.5, initial_parameters=zeros_parameters()), 4)
    replies = [
        (proxies[i], fit_res([m], 10 + i, {"partition-id": i})) for i, m in enumerate(models)
    ]
    replies[1] = (proxies[1], fit_res([poisoned], 11, {"partition-id": 1}))
    _, metrics = got.aggregate_fit(1, replies, [])
    others = [(twins[i], fit_res([models[i]], 10 + i, {"partition-id": i})) for i in (0, 2, 3)]
    _, want_metrics = want.aggregate_fit(1, others, [])
    assert metrics["num_rejected"] == 1 and want_metrics["num_rejected"] == 0
    assert sorted(got.admm.records) == sorted(want.admm.records) and len(got.admm.records) == 3
    np.testing.assert_array_equal(got.admm.z[0], want.admm.z[0])  # bit for bit
    assert metrics["primal_residual"] == want_metrics["primal_residual"]


def test_user_metrics_that_collide_with_ours_are_warned_and_ours_win(
    caplog: pytest.LogCaptureFixture,
) -> None:
    strategy, proxies = started(
        FedADMM(
            rho=0.1,
            initial_parameters=zeros_parameters(),
            fit_metrics_aggregation_fn=lambda replies: {"rho": -1.0},
        )
    )
    good = fit_res([np.full(D, 0.5)], 10, {"partition-id": 0})
    with caplog.at_level(logging.WARNING):
        _, metrics = strategy.aggregate_fit(1, [(proxies[0], good)], [])
    assert metrics["rho"] == 0.1
    assert "rho" in caplog.text


def test_a_0d_tensor_keeps_its_shape_with_client_held_duals() -> None:
    initial = ndarrays_to_parameters([np.zeros(3), np.array(0.0)])
    strategy = FedADMMClientDuals(rho=0.5, initial_parameters=initial)
    manager = SimpleClientManager()
    for proxy in make_proxies(ZeroDimClient, 2):
        manager.register(proxy)
    sent = strategy.configure_fit(1, initial, manager)
    replies = []
    for i, (proxy, ins) in enumerate(sent):
        z = parameters_to_ndarrays(ins.parameters)
        assert [a.shape for a in z] == [(3,), ()]
        w = [a + 1.0 + i for a in z]  # first round: Delta_i = n_i (w_i + 0)
        metrics: dict[str, Scalar] = {
            "partition-id": i,
            "admm-previous-round": 0,
            "admm-examples-change": 10,
            "admm-w-sq-norm": float(sum(np.vdot(a, a) for a in w)),
            "admm-u-sq-norm": 0.0,
        }
        replies.append((proxy, fit_res([10.0 * a for a in w], 10, metrics)))
    parameters, metrics = strategy.aggregate_fit(1, replies, [])
    assert metrics["num_rejected"] == 0 and parameters is not None
    z = parameters_to_ndarrays(parameters)
    assert [a.shape for a in z] == [(3,), ()]
    assert float(z[1]) == pytest.approx(1.5)  # the mean of 1 and 2
    again = strategy.configure_fit(2, parameters, manager)
    assert all(
        [a.shape for a in parameters_to_ndarrays(ins.parameters)] == [(3,), ()] for _, ins in again
    )
