"""Flower's Message-API records to and from the round layer's values.

A model travels as an `ArrayRecord` of named tensors (a PyTorch ``state_dict``
arrives as named `Array`s); the first one a strategy receives fixes the `Layout`.
`incoming` reads one reply `Message` into the round layer's `Incoming` (its blocks as
Flower's bytes, screened before anything is deserialized); it never raises.
`merge_metrics` builds the round's MetricRecord: the user's aggregation overlaid with
the round's own metrics.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable, Mapping, Sequence
from logging import WARNING
from typing import Any

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict
from flwr.common import Parameters
from flwr.common.logger import log
from numpy.typing import NDArray

from flwr_admm.core.types import Arrays
from flwr_admm.protocol import (
    MESSAGE_RESERVED_CONFIG_KEYS,
    PAYLOAD_RECORD,
    RESERVED_CONFIG_PREFIXES,
)
from flwr_admm.rounds.exchange import Incoming, Layout, without_reply_keys
from flwr_admm.uplink.wire import NUMPY_TENSOR_TYPE, max_payload_bytes, tensor_problem

__all__ = [
    "MetricsAggrFn",
    "array_problem",
    "check_overwritten",
    "copy_config",
    "has_weight",
    "incoming",
    "layout_of",
    "merge_metrics",
    "plain_metrics",
    "read_model",
    "to_record",
]

# Flower's Message-API metrics aggregation: (reply contents, weighted_by_key) -> record
MetricsAggrFn = Callable[[list[RecordDict], str], MetricRecord]


def layout_of(record: ArrayRecord) -> Layout:
    """Return the layout of `record` (its tensors are not deserialized)."""
    names = tuple(record.keys())
    dtypes = tuple(np.dtype(record[name].dtype) for name in names)
    shapes = tuple(tuple(int(s) for s in record[name].shape) for name in names)
    return Layout(names, dtypes, shapes)


def read_model(record: ArrayRecord, layout: Layout, field_name: str = "arrays") -> Arrays:
    """Return the tensors of `record` as float64 arrays in layout order.

    Raises
    ------
    ValueError
        Naming `field_name` when the record's names or shapes differ from the layout.

    """
    if tuple(record.keys()) != layout.names:
        raise ValueError(
            f"{field_name}: expected tensors {list(layout.names)}, got {list(record.keys())}"
        )
    arrays = [np.asarray(record[name].numpy(), dtype=np.float64) for name in layout.names]
    shapes = tuple(a.shape for a in arrays)
    if shapes != layout.shapes:
        raise ValueError(f"{field_name}: expected shapes {layout.shapes}, got {shapes}")
    return arrays


def to_record(arrays: Sequence[NDArray[Any]], layout: Layout) -> ArrayRecord:
    """Return `arrays` as an ArrayRecord under the layout's names, cast to its dtypes."""
    return ArrayRecord(
        {
            name: Array(np.asarray(a, dtype=dtype))
            for name, a, dtype in zip(layout.names, arrays, layout.dtypes, strict=True)
        }
    )


def incoming(
    message: Message,
    layout: Layout,
    weighted_by_key: str,
    blocks: Sequence[str],
    tensor_type: str | None,
) -> Incoming:
    """Read a content reply: its one MetricRecord, n_i, the model block and `blocks`.

    The model block is the one ArrayRecord left besides `blocks` (any name), or the
    compressed payload under ``admm-payload`` when `tensor_type` (the compressor's)
    is given. Unusable, with `problem` set: not exactly one MetricRecord or model
    block, a `weighted_by_key` value that is not an integer > 0, tensor names other
    than the layout's (in any order), a declared shape or byte length that is not the
    layout's, a serialization other than numpy's.
    """
    node = str(message.metadata.src_node_id)
    try:
        content = message.content
        if len(content.metric_records) != 1:
            return Incoming(node, {}, 0, problem="expected exactly one MetricRecord")
        metrics = next(iter(content.metric_records.values()))
        n = metrics.get(weighted_by_key)
        records = dict(content.array_records)
        payload = records.pop(PAYLOAD_RECORD, None) if tensor_type is not None else None
        extra = {name: records.pop(name) for name in blocks if name in records}
        problem = None
        if isinstance(n, bool) or not isinstance(n, int) or n <= 0:
            problem = f"{weighted_by_key!r} must be an integer > 0, got {n!r}"
        elif payload is not None:
            model, problem = _payload(payload, layout, str(tensor_type))
        elif len(records) != 1:
            problem = "expected exactly one ArrayRecord"
        else:
            model, problem = _screened(next(iter(records.values())), layout)
        read = {}
        for name, record in extra.items():
            if problem is None:
                read[name], problem = _screened(record, layout)
                problem = None if problem is None else f"{name}: {problem}"
    except Exception as error:  # a malformed reply must not stop the server
        return Incoming(node, {}, 0, problem=f"unreadable reply ({error!r})")
    if problem is not None:
        return Incoming(node, metrics, n, problem=problem)
    return Incoming(node, metrics, n, model, read, content)


def _screened(record: ArrayRecord, layout: Layout) -> tuple[Parameters, str | None]:
    """Return a record's ``.npy`` buffers in layout order, or why they cannot be the model's."""
    if set(record.keys()) != set(layout.names) or len(record) != len(layout.names):
        return _NONE, f"tensors {list(record.keys())}, expected {list(layout.names)}"
    for name, shape in zip(layout.names, layout.shapes, strict=True):
        problem = array_problem(record[name], shape)
        if problem is not None:
            return _NONE, f"{name}: {problem}"
    return Parameters([record[name].data for name in layout.names], NUMPY_TENSOR_TYPE), None


def _payload(
    record: ArrayRecord, layout: Layout, tensor_type: str
) -> tuple[Parameters, str | None]:
    """Return a compressed payload (one 1-d uint8 tensor per model tensor) as Flower's bytes."""
    if list(record.keys()) != list(layout.names):
        return _NONE, f"tensors {list(record.keys())}, expected {list(layout.names)}"
    for name, shape in zip(layout.names, layout.shapes, strict=True):  # before any copy
        array, limit = record[name], max_payload_bytes(math.prod(shape))
        if len(array.shape) != 1 or array.shape[0] > limit:
            return _NONE, f"{name}: payload of shape {array.shape} (1-d, at most {limit})"
        problem = array_problem(array, array.shape)
        if problem is not None:
            return _NONE, f"{name}: {problem}"
    tensors = [record[name].numpy() for name in layout.names]
    if any(t.dtype != np.uint8 or t.ndim != 1 for t in tensors):
        return _NONE, "payload tensors must be 1-d uint8"
    return Parameters([t.tobytes() for t in tensors], tensor_type), None


_NONE = Parameters([], NUMPY_TENSOR_TYPE)


def array_problem(array: Array, shape: Sequence[int]) -> str | None:
    """Why `array` cannot be a tensor of `shape`, from its declared fields and byte length.

    Its serialization type must be numpy's, its declared shape `shape`, and its
    ``.npy`` bytes exactly what that shape needs (`tensor_problem`): nothing is
    deserialized, so an oversized reply is refused at no cost.
    """
    if array.stype != NUMPY_TENSOR_TYPE:
        return f"serialization type {array.stype!r}, expected {NUMPY_TENSOR_TYPE!r}"
    if tuple(array.shape) != tuple(shape):
        return f"declared shape {tuple(array.shape)}, expected {tuple(shape)}"
    return tensor_problem(array.data, shape)


def copy_config(config: ConfigRecord, *, check: bool = False) -> dict[str, Any]:
    """Return a copy of `config` (lists copied too); never touch the given record.

    With `check`, refuse a key the strategy sets itself (`MESSAGE_RESERVED_CONFIG_KEYS`,
    `RESERVED_CONFIG_PREFIXES`; ValueError naming it).
    """
    copied = {k: list(v) if isinstance(v, list) else v for k, v in config.items()}
    if check:
        for key in sorted(copied):
            if key in MESSAGE_RESERVED_CONFIG_KEYS or key.startswith(RESERVED_CONFIG_PREFIXES):
                raise ValueError(
                    f"train_config: key {key!r} is set by the strategy itself (reserved: "
                    f"{list(MESSAGE_RESERVED_CONFIG_KEYS)} and keys starting with "
                    f"{list(RESERVED_CONFIG_PREFIXES)}); rename it"
                )
    return copied


def check_overwritten(user: Mapping[str, Any], sent: Sequence[Mapping[str, Any]]) -> None:
    """Refuse a given config key whose value the strategy replaced in a node's config.

    `copy_config` refuses the reserved keys; this catches a strategy's own (e.g.
    ``peer-algorithm``), as the legacy `check_user_config` does (ValueError naming it).
    """
    for key in sorted(user):
        if any(key not in config or config[key] != user[key] for config in sent):
            raise ValueError(f"train_config: key {key!r} is set by the strategy itself; rename it")


def plain_metrics(values: Mapping[str, Any]) -> MetricRecord:
    """Return `values` as a MetricRecord of plain ints and floats (bools become 0/1)."""
    plain: dict[str, int | float] = {}
    for name, value in values.items():
        if isinstance(value, bool | np.bool_ | numbers.Integral):
            plain[name] = int(value)
        else:
            plain[name] = float(value)
    return MetricRecord(plain)  # type: ignore[arg-type]


def merge_metrics(
    aggregate: MetricsAggrFn,
    contents: list[RecordDict],
    weighted_by_key: str,
    ours: Mapping[str, Any],
) -> MetricRecord:
    """Return ``aggregate(contents, weighted_by_key)`` overlaid with `ours` (ours wins).

    `aggregate` sees the replies as they came; its identity and protocol keys
    (`without_reply_keys`) are dropped. A failing `aggregate` (a user's function) is
    logged and left out, never raised.
    """
    merged = MetricRecord()
    try:
        merged = MetricRecord(without_reply_keys(aggregate(contents, weighted_by_key)))
    except Exception as error:  # a user function must not end the run
        log(WARNING, "train_metrics_aggr_fn failed (%r); its metrics left out", error)
    clashes = sorted(set(merged) & set(ours))
    if clashes:
        log(WARNING, "train_metrics_aggr_fn returned %s; ours are kept", clashes)
    for name, value in plain_metrics(ours).items():
        merged[name] = value
    return merged


def has_weight(message: Message, weighted_by_key: str) -> bool:
    """Return whether `message` holds one MetricRecord with a positive `weighted_by_key`."""
    records = message.content.metric_records
    if len(records) != 1:
        return False
    weight = next(iter(records.values())).get(weighted_by_key)
    return isinstance(weight, int | float) and not isinstance(weight, bool) and weight > 0
