"""Translate between Flower's Message-API records and the numpy core's values.

A model travels as an `ArrayRecord` of named tensors (a PyTorch ``state_dict`` arrives
as named `Array`s). `Layout` remembers the names, dtypes and shapes of the first z
a strategy receives, so that every center and every new z goes back out under the
same names, in the same order, with the same dtypes and shapes (0-d tensors stay
0-d). `read_reply` turns one reply `Message` into a core `Reply`, or says why it is
unusable; it never raises. `merge_metrics` builds the round's MetricRecord (plain
ints and floats): the user's aggregation overlaid with ours (the counts and
`flwr_admm.rounds.report.report_metrics`).
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from logging import WARNING
from typing import Any

import numpy as np
from flwr.app import Array, ArrayRecord, Message, MetricRecord, RecordDict
from flwr.common.logger import log
from numpy.typing import NDArray

from flwr_admm.core.types import Arrays
from flwr_admm.core.validation import check_reply
from flwr_admm.protocol import (
    LOSS,
)
from flwr_admm.rounds.identity import client_key_of
from flwr_admm.rounds.report import without_reply_keys
from flwr_admm.uplink.wire import NUMPY_TENSOR_TYPE, tensor_problem

__all__ = [
    "Layout",
    "MetricsAggrFn",
    "ReadReply",
    "array_problem",
    "has_weight",
    "merge_metrics",
    "plain_metrics",
    "read_reply",
]


# Flower's Message-API metrics aggregation: (reply contents, weighted_by_key) -> record
MetricsAggrFn = Callable[[list[RecordDict], str], MetricRecord]


@dataclass(frozen=True)
class Layout:
    """Names, dtypes and shapes of the model's tensors, in record order."""

    names: tuple[str, ...]
    dtypes: tuple[np.dtype[Any], ...]
    shapes: tuple[tuple[int, ...], ...]

    @classmethod
    def of(cls, record: ArrayRecord) -> Layout:
        """Return the layout of `record` (its tensors are not deserialized)."""
        names = tuple(record.keys())
        dtypes = tuple(np.dtype(record[name].dtype) for name in names)
        shapes = tuple(tuple(int(s) for s in record[name].shape) for name in names)
        return cls(names, dtypes, shapes)

    def read(self, record: ArrayRecord, field_name: str = "arrays") -> Arrays:
        """Return the tensors of `record` as float64 arrays in layout order.

        Raises
        ------
        ValueError
            Naming `field_name` when the record's names or shapes differ from the layout.

        """
        if tuple(record.keys()) != self.names:
            raise ValueError(
                f"{field_name}: expected tensors {list(self.names)}, got {list(record.keys())}"
            )
        arrays = [np.asarray(record[name].numpy(), dtype=np.float64) for name in self.names]
        shapes = tuple(a.shape for a in arrays)
        if shapes != self.shapes:
            raise ValueError(f"{field_name}: expected shapes {self.shapes}, got {shapes}")
        return arrays

    def record(self, arrays: Sequence[NDArray[Any]]) -> ArrayRecord:
        """Return `arrays` as an ArrayRecord under the layout's names, cast to its dtypes."""
        return ArrayRecord(
            {
                name: Array(np.asarray(a, dtype=dtype))
                for name, a, dtype in zip(self.names, arrays, self.dtypes, strict=True)
            }
        )


@dataclass(frozen=True)
class ReadReply:
    """One reply as the core wants it, or the reason it cannot be used."""

    key: str
    node_id: int
    arrays: Arrays
    num_examples: int
    loss: float | None
    sq_norm: float | None
    problem: str | None = None
    content: RecordDict | None = None  # the reply's records (for a metrics aggregation)
    share: Arrays | None = None  # client-held duals: the full share sigma_i', if sent

    @property
    def metrics(self) -> MetricRecord:
        """Return the reply's one MetricRecord (empty for an unusable reply)."""
        if self.content is None:
            return MetricRecord()
        return next(iter(self.content.metric_records.values()), MetricRecord())


def read_reply(
    message: Message,
    layout: Layout,
    weighted_by_key: str,
    *,
    share_key: str | None = None,
    finite: bool = False,
) -> ReadReply:
    """Read a content reply: client key, w_i (float64, layout order), n_i, f_i(w_i).

    The key is the ``client-key`` metric, else ``partition-id``, else the sending node
    (`flwr_admm.rounds.identity.client_key_of`). Unusable, with `problem` set: not
    exactly one ArrayRecord and one MetricRecord, tensor names other than the layout's
    (in any order), a shape that differs, a non-numeric dtype, a `weighted_by_key`
    value that is not a positive integer, an unreadable key. NaN/inf entries are left
    to `ConsensusADMM.absorb`, which finds them while folding the reply in, unless
    `finite` (then they make the reply unusable). With `share_key`, an ArrayRecord of
    that name is read as a second block (`ReadReply.share`, checked the same way and
    always for NaN/inf) next to the one ArrayRecord of the reply's tensors.
    """
    node_id = int(message.metadata.src_node_id)
    key = f"cid:{node_id}"
    try:
        content = message.content
        if len(content.metric_records) != 1:
            return _unusable(key, node_id, "expected exactly one MetricRecord")
        metrics = next(iter(content.metric_records.values()))
        key = client_key_of(str(node_id), metrics)  # type: ignore[arg-type]
        records = dict(content.array_records)
        share_record = records.pop(share_key, None) if share_key is not None else None
        if len(records) != 1:
            return _unusable(key, node_id, "expected exactly one ArrayRecord")
        arrays, problem = _tensors(next(iter(records.values())), layout)
        n = metrics.get(weighted_by_key)
        if problem is None and (isinstance(n, bool) or not isinstance(n, int) or n <= 0):
            problem = f"{weighted_by_key!r} must be an integer > 0, got {n!r}"
        if problem is not None:
            return _unusable(key, node_id, problem)
        assert isinstance(n, int)
        problem, sq_norm = check_reply(arrays, n, layout.shapes, finite=finite)
        share = None
        if problem is None and share_record is not None:
            share, problem = _tensors(share_record, layout)
            problem = problem or check_reply(share, n, layout.shapes)[0]
            problem = None if problem is None else f"{share_key}: {problem}"
    except Exception as error:  # a malformed reply must not stop the server
        return _unusable(key, node_id, f"unreadable reply ({error!r})")
    if problem is not None:
        return _unusable(key, node_id, problem)
    w = [np.asarray(a, dtype=np.float64) for a in arrays]
    share64 = None if share is None else [np.asarray(a, dtype=np.float64) for a in share]
    return ReadReply(key, node_id, w, n, _finite_loss(metrics), sq_norm, None, content, share64)


def _tensors(record: ArrayRecord, layout: Layout) -> tuple[list[NDArray[Any]], str | None]:
    """Return the tensors of `record` in layout order, or why they cannot be the model's.

    Every `Array` is screened (`array_problem`) before any is deserialized.
    """
    if set(record.keys()) != set(layout.names) or len(record) != len(layout.names):
        return [], f"tensors {list(record.keys())}, expected {list(layout.names)}"
    for name, shape in zip(layout.names, layout.shapes, strict=True):
        problem = array_problem(record[name], shape)
        if problem is not None:
            return [], f"{name}: {problem}"
    return [record[name].numpy() for name in layout.names], None


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


def _unusable(key: str, node_id: int, problem: str) -> ReadReply:
    return ReadReply(key, node_id, [], 0, None, None, problem)


def _finite_loss(metrics: MetricRecord) -> float | None:
    loss = metrics.get(LOSS)
    if isinstance(loss, bool) or not isinstance(loss, int | float) or not math.isfinite(loss):
        return None
    return float(loss)


def plain_metrics(values: Mapping[str, Any]) -> MetricRecord:
    """Return `values` as a MetricRecord of plain ints and floats (bools become 0/1)."""
    plain: dict[str, int | float] = {}
    for name, value in values.items():
        if isinstance(value, bool | np.bool_):
            plain[name] = int(value)
        elif isinstance(value, numbers.Integral):
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
    (`without_reply_keys`: ``partition-id``, ``client-key``, ``num-examples``,
    ``admm-*``) are dropped. A failing `aggregate` (a user's function) is logged and
    left out, never raised.
    """
    merged = MetricRecord()
    try:
        merged = MetricRecord(without_reply_keys(aggregate(contents, weighted_by_key)))
    except Exception as error:  # a user function must not end the run
        log(WARNING, "FedADMM: train_metrics_aggr_fn failed (%r); its metrics left out", error)
    clashes = sorted(set(merged) & set(ours))
    if clashes:
        log(WARNING, "FedADMM: train_metrics_aggr_fn returned %s; ours are kept", clashes)
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
