"""Message-API FedADMMClientDuals: bad replies are rejected and counted, S untouched."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from flwr.app import MetricRecord, RecordDict
from message_replies import FakeGrid, configure, error_reply, named, raw_reply, reply

from flwr_admm import Checkpointing, Uplink
from flwr_admm.serverapp import FedADMMClientDuals
from flwr_admm.uplink import StochasticQuantizer

Z0 = {"w": np.zeros((2, 3), dtype=np.float32), "b": np.array(0.0)}
NODES = [21, 22, 23]


def delta(i: int) -> dict[str, np.ndarray]:
    return {"w": np.full((2, 3), 10.0 * (i + 1)), "b": np.array(float(i))}


def protocol(i: int, n: int = 10, previous: int = 0, change: int | None = None) -> dict[str, Any]:
    return {
        "num-examples": n,
        "partition-id": i,
        "admm-previous-round": previous,
        "admm-examples-change": n if change is None else change,
        "admm-w-sq-norm": 1.0,
        "admm-u-sq-norm": 0.0,
        "admm-resync": 0,
    }


def good(i: int) -> Any:
    return reply(NODES[i], delta(i), **protocol(i))


def started(**kwargs: Any) -> FedADMMClientDuals:
    strategy = FedADMMClientDuals(rho=0.5, fraction_evaluate=0.0, **kwargs)
    messages = configure(strategy, 1, named(Z0), FakeGrid(NODES))
    config = messages[0].content["config"]
    assert config["admm-duals"] == "client" and config["admm-ack-round"] == 0
    assert config["admm-rebuild"] == 0 and config["rho"] == 0.5
    return strategy


def bad_replies() -> dict[str, Any]:
    p = protocol(7)
    nan = {"w": np.full((2, 3), np.nan), "b": np.array(0.0)}
    two_metrics = RecordDict({"a": named(delta(0)), "m": MetricRecord(p), "k": MetricRecord(p)})
    without = {k: v for k, v in p.items() if k != "admm-previous-round"}
    unweighted = {k: v for k, v in p.items() if k != "num-examples"}
    return {
        "missing arrays": reply(31, None, **p),
        "two MetricRecords": raw_reply(32, dict(two_metrics)),
        "wrong names": reply(33, {"v": delta(0)["w"], "b": delta(0)["b"]}, **p),
        "wrong shape": reply(34, {"w": np.zeros((3, 2)), "b": np.array(0.0)}, **p),
        "non-numeric dtype": reply(35, {"w": np.full((2, 3), "x"), "b": np.array(0.0)}, **p),
        "NaN": reply(36, nan, **p),
        "no num-examples": reply(37, delta(0), **unweighted),
        "zero num-examples": reply(38, delta(0), **{**p, "num-examples": 0}),
        "no protocol metrics": reply(39, delta(0), **{"num-examples": 10, "partition-id": 9}),
        "missing previous round": reply(40, delta(0), **without),
        "NaN share": raw_reply(
            41, {"arrays": named(delta(0)), "admm-share": named(nan), "m": MetricRecord(p)}
        ),
        "state mismatch (claims a round S never held)": reply(
            42, delta(0), **protocol(8, previous=5, change=0)
        ),
    }


def test_bad_replies_are_rejected_counted_and_never_touch_s() -> None:
    strategy = started()
    bad = bad_replies()
    replies = [good(0), error_reply(29), *bad.values(), good(1)]
    z, metrics = strategy.aggregate_train(1, replies)
    assert z is not None and metrics is not None
    assert metrics["num_failures"] == 1
    assert metrics["num_rejected"] == len(bad)
    assert metrics["num_state_mismatch"] == 1
    assert metrics["num_replies"] == 2
    assert strategy.state.contribution_sum is not None
    expected = [delta(0)["w"] + delta(1)["w"], delta(0)["b"] + delta(1)["b"]]
    for ours, theirs in zip(strategy.state.contribution_sum, expected, strict=True):
        np.testing.assert_array_equal(ours, theirs)
    assert strategy.state.total_examples == 20
    assert sorted(strategy.state.clients) == ["partition-id:0", "partition-id:1"]
    np.testing.assert_array_equal(z["w"].numpy(), np.full((2, 3), 1.5, dtype=np.float32))
    assert z["w"].numpy().dtype == np.float32 and z["b"].numpy().shape == ()


@pytest.mark.parametrize("name", list(bad_replies()))
def test_a_round_of_bad_replies_only_changes_nothing(name: str) -> None:
    strategy = started()
    z, metrics = strategy.aggregate_train(1, [bad_replies()[name]])
    assert z is None and metrics is not None and metrics["num_rejected"] == 1
    assert strategy.state.contribution_sum is not None
    assert all(not t.any() for t in strategy.state.contribution_sum)
    assert strategy.state.clients == {} and strategy.state.total_examples == 0


def test_next_round_acknowledges_what_s_holds() -> None:
    strategy = started()
    z, _ = strategy.aggregate_train(1, [good(0), good(1)])
    assert z is not None
    messages = configure(strategy, 2, z, FakeGrid(NODES))
    acks = {m.metadata.dst_node_id: m.content["config"]["admm-ack-round"] for m in messages}
    assert acks == {21: 1, 22: 1, 23: 0}


def test_the_returned_record_is_not_re_read_so_z_stays_float64() -> None:
    """``Strategy.start`` hands back the float32 record we returned: z' is kept as the
    z-step left it (float64), while another record is read (and rounded) as z^k."""
    strategy = started()
    third = {"w": np.full((2, 3), 1.0 / 3.0), "b": np.array(0.0)}
    z, _ = strategy.aggregate_train(1, [reply(NODES[0], third, **protocol(0))])
    assert z is not None and strategy.z is not None
    kept = strategy.z[0].copy()  # S / N = (1/3) / 10
    assert kept.dtype == np.float64 and not np.array_equal(kept, kept.astype(np.float32))
    configure(strategy, 2, z, FakeGrid(NODES))
    np.testing.assert_array_equal(strategy.z[0], kept)
    configure(strategy, 2, named({"w": z["w"].numpy(), "b": z["b"].numpy()}), FakeGrid(NODES))
    np.testing.assert_array_equal(strategy.z[0], kept.astype(np.float32))


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"rho": 0.0}, "rho"),
        ({"uplink": "8-bit"}, "uplink"),
        ({"uplink": Uplink(StochasticQuantizer(bits=8, error_feedback=False))}, "error_feedback"),
        ({"fraction_train": 1.5}, "fraction_train"),
    ],
)
def test_configuration_errors_name_the_field(kwargs: dict[str, Any], field: str) -> None:
    with pytest.raises(ValueError, match=field):
        FedADMMClientDuals(**kwargs)


def test_a_checkpoint_before_the_first_round_is_refused(tmp_path: Path) -> None:
    strategy = FedADMMClientDuals(rho=0.5, checkpoint=Checkpointing(tmp_path))
    with pytest.raises(ValueError, match="nothing to save"):
        strategy.save_checkpoint(tmp_path)


def test_corrupted_compressed_payloads_are_rejected_without_touching_s() -> None:
    strategy = started(uplink=Uplink(StochasticQuantizer(bits=8)))
    quantizer = StochasticQuantizer(bits=8)
    good_payload = quantizer.encode(list(delta(0).values()), np.random.default_rng(0))
    tensors = [np.frombuffer(t, dtype=np.uint8) for t in good_payload.tensors]
    p = protocol(0)

    def payload_reply(node: int, arrays: dict[str, np.ndarray]) -> Any:
        return raw_reply(node, {"admm-payload": named(arrays), "m": MetricRecord(p)})

    bad = [
        payload_reply(31, {"w": tensors[0][:-3], "b": tensors[1]}),  # truncated
        payload_reply(32, {"v": tensors[0], "b": tensors[1]}),  # other names
        payload_reply(33, {"w": tensors[0].astype(np.float64), "b": tensors[1]}),  # not bytes
    ]
    z, metrics = strategy.aggregate_train(
        1, [*bad, payload_reply(21, {"w": tensors[0], "b": tensors[1]})]
    )
    assert z is not None and metrics is not None
    assert metrics["num_rejected"] == 3 and metrics["num_replies"] == 1
    assert metrics["uplink_bytes"] > 0
    decoded = quantizer.decode(good_payload, [(2, 3), ()])
    assert strategy.state.contribution_sum is not None
    for ours, theirs in zip(strategy.state.contribution_sum, decoded, strict=True):
        np.testing.assert_array_equal(ours, theirs)
