"""Flower records <-> a node's tensors and replies: what a train handler reads and sends.

Down: `received_arrays` (the model under ``arrays``), `received_block` (the round's
second block, `flwr_admm.node.blocks`: ``admm-start``, ``admm-dual``,
``scaffold-control``). Up: `build_reply` (w_i under the received names and dtypes;
keeps it in ``context.state`` as the next warm start, last) and
`node_records` (client-held duals: Delta_i in float64, or its compressed payload, and
sigma_i' under ``admm-share``).
"""

from __future__ import annotations

import numbers
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict
from numpy.typing import NDArray

from flwr_admm.core.types import Arrays
from flwr_admm.node.records import keep_message
from flwr_admm.node.reply import Reply
from flwr_admm.protocol import (
    CLIENT_KEY,
    MESSAGE_SERVER_ROUND,
    NUM_EXAMPLES,
    PARTITION_ID,
    PAYLOAD_RECORD,
    SHARE_RECORD,
)

__all__ = [
    "Named",
    "build_reply",
    "key_metrics",
    "node_records",
    "ordered",
    "plain",
    "received_arrays",
    "received_block",
    "reply_message",
]

Named = dict[str, NDArray[Any]]


def received_arrays(message: Message, arrayrecord_key: str = "arrays") -> Named:
    """Return the received tensors by name, as sent (dtypes and shapes kept).

    The ArrayRecord under `arrayrecord_key`, else the message's only one.
    """
    records = message.content.array_records
    if arrayrecord_key in records:
        record = records[arrayrecord_key]
    elif len(records) == 1:
        record = next(iter(records.values()))
    else:
        raise ValueError(f"{arrayrecord_key}: no such ArrayRecord in the message")
    return {name: array.numpy() for name, array in record.items()}


def received_block(message: Message, name: str, like: Mapping[str, NDArray[Any]]) -> Named:
    """Return the ArrayRecord `name` in the order of `like`'s tensors, as sent.

    Raises ValueError naming the record when it is missing, or when its tensor names
    or shapes are not `like`'s (the received model's).
    """
    record = message.content.array_records.get(name)
    if record is None:
        raise ValueError(f"{name}: the round sends this ArrayRecord next to the model; none came")
    if set(record.keys()) != set(like):
        raise ValueError(f"{name}: expected tensors {list(like)}, got {list(record.keys())}")
    block = {n: record[n].numpy() for n in like}
    for n, value in block.items():
        if value.shape != np.shape(like[n]):
            raise ValueError(
                f"{name}[{n!r}]: expected shape {np.shape(like[n])}, got {value.shape}"
            )
    return block


def ordered(
    arrays: Mapping[str, NDArray[Any]] | Sequence[NDArray[Any]],
    names: Sequence[str],
    field: str = "arrays",
) -> list[NDArray[Any]]:
    """Return `arrays` (by name, or a list in record order) as a list in `names`' order."""
    values = [arrays[n] for n in names] if isinstance(arrays, Mapping) else list(arrays)
    if len(values) != len(names):
        raise ValueError(f"{field}: expected {len(names)} tensors {list(names)}, got {len(values)}")
    return values


def named(
    names: Sequence[str], arrays: Arrays, like: Mapping[str, Any] | None = None
) -> ArrayRecord:
    """Return an ArrayRecord of `arrays` under `names`, in `like`'s dtypes (else float64)."""
    return ArrayRecord(
        {
            n: Array(np.asarray(a, dtype=np.float64 if like is None else like[n].dtype))
            for n, a in zip(names, arrays, strict=True)
        }
    )


def node_records(
    names: Sequence[str], reply: Reply, arrayrecord_key: str
) -> dict[str, ArrayRecord]:
    """Return a client-held-dual reply's arrays: Delta_i (float64), or its payload, and sigma_i'.

    A compressed Delta_i goes under ``admm-payload`` instead: one uint8 tensor of bytes
    per name.
    """
    if reply.payload is None:
        records = {arrayrecord_key: named(names, reply.arrays)}
    else:
        tensors = reply.payload.tensors[: len(names)]
        records = {
            PAYLOAD_RECORD: ArrayRecord(
                {
                    n: Array(np.frombuffer(bytes(t), dtype=np.uint8))
                    for n, t in zip(names, tensors, strict=True)
                }
            )
        }
    if reply.second is not None:
        records[SHARE_RECORD] = named(names, reply.second)
    return records


def reply_message(
    message: Message, arrays: Mapping[str, ArrayRecord], metrics: Mapping[str, Any]
) -> Message:
    """Return the reply to `message` with these ArrayRecords and one MetricRecord."""
    content: dict[str, ArrayRecord | MetricRecord | ConfigRecord] = {
        **arrays,
        "metrics": MetricRecord(dict(metrics)),
    }
    return Message(RecordDict(content), reply_to=message)


def build_reply(
    message: Message,
    arrays: Mapping[str, NDArray[Any]] | Sequence[NDArray[Any]],
    num_examples: int,
    metrics: Mapping[str, Any] | None = None,
    context: Context | None = None,
    *,
    arrayrecord_key: str = "arrays",
    configrecord_key: str = "config",
    weighted_by_key: str = NUM_EXAMPLES,
) -> Message:
    """Return the reply to `message`: w_i under the received names and dtypes, and metrics.

    The MetricRecord holds `metrics` (plain ints and floats), `weighted_by_key` =
    `num_examples` and, unless `metrics` has them, the node's ``partition-id`` and
    ``client-key`` (integers from ``context.node_config``). With a `context`, w_i (in
    float64) is then saved in ``context.state`` as the next warm start: last, so a
    handler that fails before never leaves a half-written state.
    """
    received = received_arrays(message, arrayrecord_key)
    names = list(received)
    values = ordered(arrays, names)
    if isinstance(num_examples, bool) or not isinstance(num_examples, numbers.Integral):
        raise ValueError(f"num_examples: must be an integer > 0, got {num_examples!r}")
    if num_examples <= 0:
        raise ValueError(f"num_examples: must be an integer > 0, got {num_examples!r}")
    w = {n: np.asarray(v, dtype=np.float64) for n, v in zip(names, values, strict=True)}
    reported = key_metrics(context) if context is not None else {}
    reported.update({name: plain(value, name) for name, value in (metrics or {}).items()})
    reported[weighted_by_key] = int(num_examples)
    record = named(names, list(w.values()), like=received)
    reply = reply_message(message, {arrayrecord_key: record}, reported)
    if context is not None:
        config = message.content.config_records.get(configrecord_key, ConfigRecord())
        keep_message(context.state, w, config.get(MESSAGE_SERVER_ROUND))
    return reply


def key_metrics(context: Context) -> dict[str, Any]:
    """Return ``partition-id`` / ``client-key`` of the node config (integers only)."""
    found = {}
    for name in (PARTITION_ID, CLIENT_KEY):
        value = context.node_config.get(name)
        if isinstance(value, int) and not isinstance(value, bool):
            found[name] = value
    return found


def plain(value: Any, name: str) -> Any:
    """Return `value` as a MetricRecord accepts it (int, float or a list of them)."""
    if isinstance(value, list):
        return [plain(v, name) for v in value]
    if isinstance(value, bool | np.bool_):
        return int(value)
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, numbers.Real):
        return float(value)
    raise ValueError(f"metrics[{name!r}]: must be a number (MetricRecord), got {value!r}")
