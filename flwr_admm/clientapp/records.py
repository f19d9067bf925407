"""The records a train handler reads and sends: the received tensors, the reply.

`received_arrays` reads the received model (and `received_dual` the linearized form's
y_i, ``admm-dual``); `build_reply` (FedADMM, FedProx and FedAvg replies;
`ADMMTrainStep.reply` calls it) keeps w_i in ``context.state`` as the next warm start,
last, after all that can fail.
"""

from __future__ import annotations

import numbers
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict
from numpy.typing import NDArray

from flwr_admm.protocol import (
    CLIENT_KEY,
    DUAL_RECORD,
    MESSAGE_SERVER_ROUND,
    MESSAGE_STATE_META,
    MESSAGE_STATE_W,
    META_ROUND,
    NUM_EXAMPLES,
    PARTITION_ID,
)

__all__ = ["Named", "build_reply", "key_metrics", "plain", "received_arrays", "received_dual"]

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


def received_dual(message: Message, names: Sequence[str]) -> Named:
    """Return y_i (``admm-dual``, FedADMM's linearized form) by name, as float64.

    Raises ValueError naming the record when it is missing or its tensor names are
    not `names` (the received model's).
    """
    record = message.content.array_records.get(DUAL_RECORD)
    if record is None:
        raise ValueError(
            f"{DUAL_RECORD}: FedADMM's linearized form sends y_i under this ArrayRecord; "
            "the message has none"
        )
    if list(record.keys()) != list(names):
        raise ValueError(
            f"{DUAL_RECORD}: expected tensors {list(names)}, got {list(record.keys())}"
        )
    return {name: np.asarray(record[name].numpy(), dtype=np.float64) for name in names}


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
    values = [arrays[n] for n in names] if isinstance(arrays, Mapping) else list(arrays)
    if len(values) != len(names):
        raise ValueError(f"arrays: expected {len(names)} tensors {names}, got {len(values)}")
    if isinstance(num_examples, bool) or not isinstance(num_examples, numbers.Integral):
        raise ValueError(f"num_examples: must be an integer > 0, got {num_examples!r}")
    if num_examples <= 0:
        raise ValueError(f"num_examples: must be an integer > 0, got {num_examples!r}")
    w = {n: np.asarray(v, dtype=np.float64) for n, v in zip(names, values, strict=True)}
    record = ArrayRecord({n: Array(np.asarray(w[n], dtype=received[n].dtype)) for n in names})
    reported = key_metrics(context) if context is not None else {}
    reported.update({name: plain(value, name) for name, value in (metrics or {}).items()})
    reported[weighted_by_key] = int(num_examples)
    reply = Message(
        RecordDict({arrayrecord_key: record, "metrics": MetricRecord(reported)}), reply_to=message
    )
    if context is not None:
        config = message.content.config_records.get(configrecord_key, ConfigRecord())
        _keep_warm_start(context, w, config.get(MESSAGE_SERVER_ROUND))
    return reply


def _keep_warm_start(context: Context, w: Named, server_round: Any) -> None:
    """Save w_i (float64, named) and its round in ``context.state``, if w_i is finite."""
    if not all(np.all(np.isfinite(t)) for t in w.values()):
        return  # a NaN warm start would poison every later round
    context.state.array_records[MESSAGE_STATE_W] = ArrayRecord({n: Array(t) for n, t in w.items()})
    if isinstance(server_round, int) and not isinstance(server_round, bool):
        context.state.config_records[MESSAGE_STATE_META] = ConfigRecord({META_ROUND: server_round})


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
