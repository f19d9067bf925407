"""Compressed uplink payloads on the Message API (``uplink=`` of both strategies).

A node that compresses (`flwr_admm.uplink`) sends the payload under ``admm-payload``:
one 1-d uint8 tensor of the compressor's bytes per model tensor, under the model's
names, in place of ``arrays``. `decoded` turns such a reply back into the plain form
under ``arrays`` (float64): Delta_i = decode(payload) for client-held duals, w_i =
v_i + decode(payload) for server-held ones; so the usual reply checks apply to it.
It also counts the uplink bytes.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
from flwr.app import Array, ArrayRecord, Message, RecordDict
from flwr.common import Parameters

from flwr_admm.core.types import Arrays
from flwr_admm.protocol import PAYLOAD_RECORD
from flwr_admm.serverapp.records_old import Layout, ReadReply, array_problem
from flwr_admm.uplink.channel import UplinkChannel
from flwr_admm.uplink.wire import NUMPY_TENSOR_TYPE, max_payload_bytes

__all__ = ["decoded", "decoded_or_problem"]


def decoded(
    message: Message,
    layout: Layout,
    channel: UplinkChannel,
    like: Callable[[], Arrays],
    arrayrecord_key: str,
    *,
    add_center: bool = False,
) -> Message:
    """Return `message` with ``admm-payload`` decoded into Delta_i under `arrayrecord_key`.

    A reply without a payload is returned as it is (its bytes counted when the
    channel compresses). `like()` gives the model's shapes. Raises ValueError (or what
    the compressor raises) for a payload with other names, a tensor that is not 1-d
    uint8, or bytes the compressor cannot read.
    """
    content = message.content
    payload = content.array_records.get(PAYLOAD_RECORD)
    compressor = channel.compressor
    if payload is None or compressor is None:
        plain = content.array_records.get(arrayrecord_key)
        if compressor is not None and plain is not None:  # counted in uplink_bytes
            channel.decode(Parameters([a.data for a in plain.values()], NUMPY_TENSOR_TYPE), like)
        return message
    if list(payload.keys()) != list(layout.names):
        raise ValueError(f"tensors {list(payload.keys())}, expected {list(layout.names)}")
    for name, shape in zip(layout.names, layout.shapes, strict=True):  # before any copy
        array, limit = payload[name], max_payload_bytes(math.prod(shape))
        if len(array.shape) != 1 or array.shape[0] > limit:
            raise ValueError(f"{name}: payload of shape {array.shape} (1-d, at most {limit})")
        problem = array_problem(array, array.shape)
        if problem is not None:
            raise ValueError(f"{name}: {problem}")
    tensors = [payload[name].numpy() for name in layout.names]
    if any(t.dtype != np.uint8 or t.ndim != 1 for t in tensors):
        raise ValueError("payload tensors must be 1-d uint8")
    packed = Parameters([t.tobytes() for t in tensors], compressor.tensor_type)
    change = channel.decode(packed, like, add_center=add_center)
    records = {name: record for name, record in content.items() if name != PAYLOAD_RECORD}
    records[arrayrecord_key] = ArrayRecord(
        {
            name: Array(np.asarray(t, dtype=np.float64))
            for name, t in zip(layout.names, change, strict=True)
        }
    )
    return Message(content=RecordDict(records), metadata=message.metadata)  # type: ignore[call-overload,no-any-return]


def decoded_or_problem(
    message: Message,
    layout: Layout,
    channel: UplinkChannel,
    like: Callable[[], Arrays],
    arrayrecord_key: str,
    *,
    add_center: bool = False,
) -> Message | ReadReply:
    """Return `decoded` `message`, or the rejected `ReadReply` of an unreadable payload.

    A malformed payload must not stop the server: its error becomes the reply's problem.
    Under local DP a reply without the client's attestation is refused here too
    (`UplinkChannel.attestation_problem`).
    """
    node_id = int(message.metadata.src_node_id)
    try:
        records = message.content.metric_records
        metrics = next(iter(records.values())) if len(records) == 1 else {}
        problem = channel.attestation_problem(metrics)
        if problem is None:
            return decoded(message, layout, channel, like, arrayrecord_key, add_center=add_center)
    except Exception as error:
        problem = f"unreadable {PAYLOAD_RECORD} ({error!r})"
    return ReadReply(f"cid:{node_id}", node_id, [], 0, None, None, problem)
