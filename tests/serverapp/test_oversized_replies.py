"""Message API: a reply far larger than the model is refused before it is deserialized.

Issue 25, item 7: a 1e8-element reply for a 10-parameter model was deserialized
(+763 MiB) before it was rejected. Every Message-API strategy now screens each
`Array`'s declared shape and its ``.npy`` header and byte length
(`flwr_admm.serverapp.records.array_problem`) before ``.numpy()``; the reply itself was
allocated by the transport, so the test bounds what the strategy allocates on top of
it (tracemalloc), for an honestly declared huge tensor and for one that declares the
model's shape but carries far more bytes.
"""

from __future__ import annotations

import tracemalloc
from typing import Any

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, ConfigRecord, MetricRecord
from message_replies import FakeGrid, named, raw_reply

from flwr_admm import Uplink
from flwr_admm.serverapp import SCAFFOLD, FedADMM, FedADMMClientDuals, FedDyn, FedNova
from flwr_admm.serverapp.testing import flower_task_identity
from flwr_admm.uplink import StochasticQuantizer

D = 10
BIG = 4_000_000  # float64 entries of the hostile tensor: 32 MB (the was 1e8)
DUALS = {"admm-previous-round": 0, "admm-examples-change": 10}
DUALS_NORMS = {"admm-w-sq-norm": 1.0, "admm-u-sq-norm": 0.0}

STRATEGIES = {
    "FedADMM": lambda: FedADMM(rho=0.1),
    "FedADMM-8bit": lambda: FedADMM(rho=0.1, uplink=Uplink(StochasticQuantizer(bits=8))),
    "FedADMMClientDuals": lambda: FedADMMClientDuals(rho=0.1),
    "SCAFFOLD": lambda: SCAFFOLD(),
    "FedDyn": lambda: FedDyn(alpha=0.1),
    "FedNova": lambda: FedNova(),
}


def hostile_array(form: str, dtype: type = np.float64) -> Array:
    """BIG * 8 bytes of tensor, declared as such or under a small declared shape."""
    count = BIG * 8 // np.dtype(dtype).itemsize
    if form == "declared":
        return Array(np.zeros(count, dtype=dtype))
    small = Array(np.zeros(D, dtype=dtype))  # a small declared shape, dtype, stype ...
    header = small.data[: -small.numpy().nbytes]
    return Array(small.dtype, tuple(small.shape), small.stype, header + bytes(8 * BIG))


def metrics_of(name: str, partition: int) -> dict[str, Any]:
    metrics: dict[str, Any] = {"num-examples": 10, "partition-id": partition, "local_steps": 5}
    if name == "FedADMMClientDuals":
        metrics.update({**DUALS, **DUALS_NORMS})
    return metrics


def reply_of(name: str, node: int, record: ArrayRecord, payload: bool = False) -> Any:
    records: dict[str, Any] = {"metrics": MetricRecord(metrics_of(name, node - 1))}
    records["admm-payload" if payload else "arrays"] = record
    if name == "SCAFFOLD":
        records["scaffold-control"] = named({"w": np.zeros(D)})
    return raw_reply(node, records)


@pytest.mark.parametrize("form", ["declared", "lying"])
@pytest.mark.parametrize("name", list(STRATEGIES))
def test_an_oversized_reply_is_rejected_without_deserializing_it(name: str, form: str) -> None:
    strategy = STRATEGIES[name]()
    with flower_task_identity():
        sent = strategy.configure_train(
            1, named({"w": np.zeros(D)}), ConfigRecord(), FakeGrid([1, 2])
        )
    assert len(list(sent)) == 2
    payload = name == "FedADMM-8bit"  # a compressed payload: 1-d uint8 tensors
    array = hostile_array(form, np.uint8 if payload else np.float64)
    honest = named({"w": np.full(D, 0.5)})
    hostile = reply_of(name, 1, ArrayRecord({"w": array}), payload)
    replies = [hostile, reply_of(name, 2, honest)]
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        _, metrics = strategy.aggregate_train(1, replies)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    size = len(array.data)
    assert metrics is not None and metrics["num_rejected"] == 1
    assert peak < size / 20, f"{name} allocated {peak} bytes for a {size}-byte reply"
