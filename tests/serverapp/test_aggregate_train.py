"""serverapp.FedADMM.aggregate_train: keys, bad replies rejected and counted, metrics."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from flwr.app import ArrayRecord, MetricRecord, RecordDict
from message_replies import FakeGrid, configure, error_reply, named, raw_reply, reply

from flwr_admm import ClientPolicy, Uplink
from flwr_admm.core import ConsensusADMM
from flwr_admm.core.types import Reply
from flwr_admm.protocol import START_MARK
from flwr_admm.rounds.identity import ABSENT_GRACE
from flwr_admm.serverapp import FedADMM
from flwr_admm.serverapp.fedadmm import textbook
from flwr_admm.uplink import StochasticQuantizer

Z0 = {"w": np.zeros((2, 3), dtype=np.float32), "step": np.array(0.0)}
NODES = [21, 22, 23, 24]


def w_of(i: int) -> dict[str, np.ndarray]:
    return {"w": np.full((2, 3), i + 1.0, dtype=np.float32), "step": np.array(float(i))}


def good(i: int, **extra: Any) -> Any:
    """A reply of one of our client helpers (START_MARK: it solved the ADMM step)."""
    metrics = {"num-examples": 10 * (i + 1), "partition-id": i, START_MARK: 0, **extra}
    return reply(NODES[i], w_of(i), **metrics)


def started(**kwargs: Any) -> FedADMM:
    strategy = textbook(rho=0.5, fraction_evaluate=0.0, **kwargs)
    configure(strategy, 1, named(Z0), FakeGrid(NODES))
    return strategy


def expected_z(replies: list[tuple[str, int, int]]) -> list[np.ndarray]:
    """z' of the numpy core fed (key, i, n) replies, z0 = Z0."""
    core = ConsensusADMM([np.zeros((2, 3)), np.array(0.0)], 0.5)
    rep = [
        Reply(k, [np.asarray(a, dtype=np.float64) for a in w_of(i).values()], n)
        for k, i, n in replies
    ]
    core.step(rep, 1)
    return core.z


def bad_replies() -> dict[str, Any]:
    n = {"num-examples": 5}
    nan = {"w": np.full((2, 3), np.nan, dtype=np.float32), "step": np.array(0.0)}
    two = RecordDict({"a": named(w_of(0)), "b": named(w_of(0)), "m": MetricRecord(n)})
    two_metrics = RecordDict({"a": named(w_of(0)), "m": MetricRecord(n), "k": MetricRecord(n)})
    return {
        "missing arrays": reply(31, None, **n),
        "extra ArrayRecord": raw_reply(32, dict(two)),
        "two MetricRecords": raw_reply(33, dict(two_metrics)),
        "wrong names": reply(34, {"v": w_of(0)["w"], "step": w_of(0)["step"]}, **n),
        "missing tensor": reply(35, {"w": w_of(0)["w"]}, **n),
        "wrong shape": reply(36, {"w": np.zeros((3, 2)), "step": np.array(0.0)}, **n),
        "non-numeric dtype": reply(37, {"w": np.full((2, 3), "x"), "step": np.array(0.0)}, **n),
        "bool dtype": reply(38, {"w": np.ones((2, 3), dtype=bool), "step": np.array(0.0)}, **n),
        "NaN": reply(39, nan, **n),
        "no num-examples": reply(40, w_of(0), loss=1.0),
        "zero num-examples": reply(41, w_of(0), **{"num-examples": 0}),
        "negative num-examples": reply(42, w_of(0), **{"num-examples": -3}),
        "float num-examples": reply(43, w_of(0), **{"num-examples": 5.0}),
        "bad client-key": reply(44, w_of(0), **{"num-examples": 5, "client-key": -1.5}),
    }


def test_bad_replies_are_rejected_and_counted_and_the_round_goes_on() -> None:
    strategy = started()
    bad = bad_replies()
    replies = [good(0), error_reply(29), *bad.values(), good(1), error_reply(30)]
    z, metrics = strategy.aggregate_train(1, replies)
    assert z is not None and metrics is not None
    assert metrics["num_failures"] == 2
    assert metrics["num_rejected"] == len(bad)
    assert metrics["num_replies"] == 2
    assert strategy.admm is not None
    assert sorted(strategy.admm.records) == ["partition-id:0", "partition-id:1"]
    want = expected_z([("partition-id:0", 0, 10), ("partition-id:1", 1, 20)])
    np.testing.assert_array_equal(z["w"].numpy(), want[0].astype(np.float32))
    assert z["step"].numpy().shape == () and z["step"].numpy() == want[1]
    assert len(strategy.history) == 1 and strategy.history[0]["round"] == 1


def test_replies_sharing_a_key_are_all_rejected() -> None:
    strategy = started()
    _, metrics = strategy.aggregate_train(
        1, [good(0), reply(NODES[2], w_of(2), **{"num-examples": 5, "partition-id": 0}), good(1)]
    )
    assert metrics is not None and metrics["num_rejected"] == 2 and metrics["num_replies"] == 1
    assert strategy.admm is not None and list(strategy.admm.records) == ["partition-id:1"]


def test_only_bad_replies_leave_the_state_unchanged() -> None:
    strategy = started()
    z, metrics = strategy.aggregate_train(1, [error_reply(21), *bad_replies().values()])
    assert z is None and metrics is not None
    assert metrics["num_failures"] == 1 and metrics["num_rejected"] == len(bad_replies())
    assert strategy.admm is not None and strategy.admm.records == {} and strategy.history == []
    z, metrics = strategy.aggregate_train(1, [good(0), good(1)])  # the next round works
    assert z is not None and metrics is not None and metrics["num_replies"] == 2


def test_key_is_client_key_else_partition_id_else_node_id() -> None:
    strategy = started()
    strategy.aggregate_train(
        1,
        [
            reply(21, w_of(0), **{"num-examples": 5, "client-key": 7, "partition-id": 3}),
            reply(22, w_of(1), **{"num-examples": 5, "partition-id": 3}),
            reply(23, w_of(2), **{"num-examples": 5}),
        ],
    )
    assert strategy.admm is not None
    assert sorted(strategy.admm.records) == ["cid:23", "client-key:7", "partition-id:3"]


def test_a_key_claimed_by_another_connected_node_is_a_conflict() -> None:
    strategy = started()
    z1, _ = strategy.aggregate_train(1, [good(0), good(1)])
    assert z1 is not None
    configure(strategy, 2, z1, FakeGrid(NODES))
    hijack = reply(NODES[3], w_of(3), **{"num-examples": 5, "partition-id": 0})
    _, metrics = strategy.aggregate_train(2, [hijack, good(1)])
    assert metrics is not None
    assert metrics["num_key_conflicts"] == 1 and metrics["num_rejected"] == 1
    assert strategy.binding.node_of["partition-id:0"] == str(NODES[0])


def test_metrics_are_plain_numbers_and_the_users_aggregation_sees_accepted_replies() -> None:
    seen: list[RecordDict] = []

    def aggregate(contents: list[RecordDict], weight_key: str) -> MetricRecord:
        seen.extend(contents)
        return MetricRecord({"rho": 123.0, "mine": float(len(contents))})

    strategy = started(train_metrics_aggr_fn=aggregate)
    _, metrics = strategy.aggregate_train(
        1, [good(0, loss=2.0), good(1, loss=4.0), bad_replies()["NaN"], error_reply(9)]
    )
    assert metrics is not None and len(seen) == 2
    assert metrics["mine"] == 2.0 and metrics["rho"] == 0.5  # ours wins a name clash
    assert metrics["objective"] == pytest.approx((10 * 2.0 + 20 * 4.0) / 30)
    for name, value in metrics.items():
        assert type(value) in (int, float), (name, type(value))
    assert {
        "primal_residual",
        "dual_residual",
        "eps_primal",
        "eps_dual",
        "converged",
        "num_replies",
        "num_rejected",
        "num_failures",
        "next_rho",
    } <= set(metrics)
    assert strategy.history[0]["mine"] == 2.0


def test_a_failing_user_aggregation_does_not_end_the_run() -> None:
    def broken(contents: list[RecordDict], weight_key: str) -> MetricRecord:
        raise KeyError("oops")

    strategy = started(train_metrics_aggr_fn=broken)
    z, metrics = strategy.aggregate_train(1, [good(0), good(1)])
    assert z is not None and metrics is not None and metrics["num_replies"] == 2


def test_evaluate_ignores_unusable_replies() -> None:
    strategy = started()
    ok = raw_reply(21, {"metrics": MetricRecord({"num-examples": 4, "loss": 1.0})})
    no_weight = raw_reply(22, {"metrics": MetricRecord({"loss": 9.0})})
    arrays_only = raw_reply(23, {"arrays": ArrayRecord([np.zeros(2)])})
    metrics = strategy.aggregate_evaluate(1, [ok, no_weight, arrays_only, error_reply(24)])
    assert metrics is not None and metrics["loss"] == 1.0


def test_a_key_whose_node_left_starts_fresh_under_the_new_node() -> None:
    """Node 21 is gone and 99 claims its key: a conflict while node 21 is within its
    grace (ABSENT_GRACE samplings), then the key's state is evicted and 99 starts fresh."""
    strategy = started()
    z, _ = strategy.aggregate_train(1, [good(0), good(1)])
    assert z is not None and strategy.admm is not None
    assert np.any(strategy.admm.records["partition-id:0"].y[0] != 0)
    restarted = reply(99, w_of(3), **{"num-examples": 5, "partition-id": 0})
    for server_round in range(2, ABSENT_GRACE + 2):
        configure(strategy, server_round, z, FakeGrid([99, NODES[1]]))  # 21 gone, 99 joined
        z, metrics = strategy.aggregate_train(server_round, [restarted, good(1)])
        assert z is not None and metrics is not None
        assert (metrics["num_key_conflicts"], metrics["num_replies"]) == (1, 1)
    configure(strategy, ABSENT_GRACE + 2, z, FakeGrid([99, NODES[1]]))
    _, metrics = strategy.aggregate_train(ABSENT_GRACE + 2, [restarted, good(1)])
    assert metrics is not None
    assert metrics["num_evicted"] == 1 and metrics["num_key_conflicts"] == 0
    assert metrics["num_replies"] == 2
    assert strategy.binding.node_of["partition-id:0"] == "99"
    assert strategy.admm.records["partition-id:0"].num_examples == 5


def test_a_node_that_misses_a_round_keeps_its_key_against_a_claimant() -> None:
    """Issue 25, item 2: node 21 misses one sampling and node 24 reports its key: a
    conflict, node 21's dual untouched, node 21 accepted on return (the old code
    evicted its state, bound the key to 99 and refused node 21 for good)."""
    strategy = started()
    z1, _ = strategy.aggregate_train(1, [good(0), good(1)])
    assert z1 is not None and strategy.admm is not None
    y_before = strategy.admm.records["partition-id:0"].y[0].copy()
    configure(strategy, 2, z1, FakeGrid([NODES[1], 99]))  # node 21 is away, 99 joined
    claim = reply(99, w_of(3), **{"num-examples": 5, "partition-id": 0})
    z2, metrics = strategy.aggregate_train(2, [claim, good(1)])
    assert z2 is not None and metrics is not None
    assert (metrics["num_key_conflicts"], metrics["num_evicted"]) == (1, 0)
    np.testing.assert_array_equal(strategy.admm.records["partition-id:0"].y[0], y_before)
    configure(strategy, 3, z2, FakeGrid([*NODES, 99]))
    _, metrics = strategy.aggregate_train(3, [good(0), good(1)])
    assert metrics is not None
    assert (metrics["num_key_conflicts"], metrics["num_replies"]) == (0, 2)
    assert strategy.binding.owner("partition-id:0") == str(NODES[0])


def test_key_binding_authenticated_never_hands_a_key_to_a_new_node() -> None:
    """Under SuperNode authentication a node keeps its id: a key whose node left is not
    rebound to a newcomer (the "node" binding would evict and rebind it, above); the
    owner's dual and cached w_i stay bit for bit; the owner's return is accepted."""
    strategy = started(clients=ClientPolicy(key_binding="authenticated"))
    z1, _ = strategy.aggregate_train(1, [good(0), good(1)])
    assert z1 is not None and strategy.admm is not None
    record = strategy.admm.records["partition-id:0"]
    y_before, w_before = record.y[0].copy(), record.w[0].copy()
    configure(strategy, 2, z1, FakeGrid([99, NODES[1]]))  # node 21 is away, 99 joined
    intruder = reply(99, w_of(3), **{"num-examples": 5, "partition-id": 0})
    z2, metrics = strategy.aggregate_train(2, [intruder, good(1)])
    assert metrics is not None and z2 is not None
    assert metrics["num_key_conflicts"] == 1 and metrics["num_rejected"] == 1
    assert metrics["num_evicted"] == 0 and metrics["num_replies"] == 1
    assert strategy.binding.node_of["partition-id:0"] == str(NODES[0])
    record = strategy.admm.records["partition-id:0"]
    np.testing.assert_array_equal(record.y[0], y_before)
    np.testing.assert_array_equal(record.w[0], w_before)
    configure(strategy, 3, z2, FakeGrid(NODES))  # the owner is back under its own id
    _, metrics = strategy.aggregate_train(3, [good(0), good(1)])
    assert metrics is not None and metrics["num_replies"] == 2
    assert metrics["num_key_conflicts"] == 0


def test_key_binding_reported_trusts_the_reported_key_under_any_node() -> None:
    """A key under a new node keeps its dual; the round it trained around z is resynced."""
    strategy = started(clients=ClientPolicy(key_binding="reported"))
    z1, _ = strategy.aggregate_train(1, [good(0), good(1)])
    assert z1 is not None and strategy.admm is not None
    y_before = strategy.admm.records["partition-id:0"].y[0].copy()
    configure(strategy, 2, z1, FakeGrid(NODES))  # NODES[3] is unknown: it gets z
    moved = reply(NODES[3], w_of(3), **{"num-examples": 5, "partition-id": 0})
    z2, metrics = strategy.aggregate_train(2, [moved, good(1)])
    assert metrics is not None and z2 is not None
    assert metrics["num_key_conflicts"] == 0 and metrics["num_evicted"] == 0
    assert metrics["num_resynced"] == 1 and metrics["num_replies"] == 1
    np.testing.assert_array_equal(strategy.admm.records["partition-id:0"].y[0], y_before)
    messages = configure(strategy, 3, z2, FakeGrid(NODES))
    center = strategy.admm.center("partition-id:0")
    sent = next(m for m in messages if m.metadata.dst_node_id == NODES[3])
    np.testing.assert_allclose(sent.content["arrays"]["w"].numpy(), center[0], rtol=1e-6)
    _, metrics = strategy.aggregate_train(3, [moved, good(1)])
    assert metrics is not None and metrics["num_replies"] == 2 and metrics["num_resynced"] == 0
    assert strategy.admm.records["partition-id:0"].num_examples == 5


def test_compressed_replies_are_rebuilt_around_the_nodes_center_and_bad_ones_rejected() -> None:
    quantizer = StochasticQuantizer(bits=8)
    strategy = started(uplink=Uplink(quantizer))
    offset = [np.full((2, 3), 0.5), np.array(0.25)]
    payload = quantizer.encode(offset, np.random.default_rng(0))
    tensors = [np.frombuffer(t, dtype=np.uint8) for t in payload.tensors]
    n = MetricRecord({"num-examples": 10, "partition-id": 0})

    def compressed(node: int, arrays: dict[str, np.ndarray]) -> Any:
        return raw_reply(node, {"admm-payload": named(arrays), "m": n})

    truncated = compressed(NODES[1], {"w": tensors[0][:-2], "step": tensors[1]})
    z, metrics = strategy.aggregate_train(
        1, [compressed(NODES[0], {"w": tensors[0], "step": tensors[1]}), truncated]
    )
    assert z is not None and metrics is not None
    assert metrics["num_rejected"] == 1 and metrics["num_replies"] == 1
    assert metrics["uplink_bytes"] == 2 * sum(len(t) for t in payload.tensors) - 2  # both
    assert strategy.admm is not None  # w = v + decode(payload), v = z0 = 0 in round 1
    w = strategy.admm.records["partition-id:0"].w
    for ours, theirs in zip(w, quantizer.decode(payload, [(2, 3), ()]), strict=True):
        np.testing.assert_array_equal(ours, theirs)


def test_a_stock_fedprox_reply_has_its_dual_held_at_zero() -> None:
    """A reply without START_MARK (a stock FedProx handler, which starts at its center)
    keeps y_i = 0: its next center is z, its step FedProx's; the round counts it."""
    strategy = started()
    stock = reply(NODES[1], w_of(1), **{"num-examples": 20, "partition-id": 1})
    z1, metrics = strategy.aggregate_train(1, [good(0), stock])
    assert z1 is not None and metrics is not None and strategy.admm is not None
    assert metrics["num_stock_replies"] == 1
    assert np.any(strategy.admm.records["partition-id:0"].y[0] != 0)
    assert not np.any(strategy.admm.records["partition-id:1"].y[0])
    y0 = strategy.admm.records["partition-id:0"].y[0]
    np.testing.assert_array_equal(strategy.admm.sums.ny[0], 10 * y0)  # S_y = sum n_i y_i
    second = configure(strategy, 2, z1, FakeGrid(NODES))
    sent = {m.metadata.dst_node_id: m.content["arrays"] for m in second}
    np.testing.assert_array_equal(sent[NODES[1]]["w"].numpy(), z1["w"].numpy())  # v_i = z
    assert not np.array_equal(sent[NODES[0]]["w"].numpy(), z1["w"].numpy())
    for message in second:  # z goes with every center: the start of our helpers
        np.testing.assert_array_equal(message.content["admm-start"]["w"].numpy(), z1["w"].numpy())
