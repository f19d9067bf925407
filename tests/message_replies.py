"""Reply `Message`s for unit tests, built outside a Flower runtime (explicit Metadata)."""

from __future__ import annotations

from typing import Any

import numpy as np
from flwr.app import (
    Array,
    ArrayRecord,
    ConfigRecord,
    Error,
    Message,
    MessageType,
    Metadata,
    MetricRecord,
    RecordDict,
)
from flwr.common.constant import ErrorCode

from flwr_admm.serverapp import FedADMM
from flwr_admm.serverapp.testing import flower_task_identity


def metadata(src_node_id: int, message_type: str = MessageType.TRAIN) -> Metadata:
    return Metadata(
        run_id=1,
        message_id="",
        src_node_id=src_node_id,
        dst_node_id=1,
        reply_to_message_id="",
        group_id="",
        created_at=0.0,
        ttl=3600.0,
        message_type=message_type,
    )


def named(arrays: dict[str, np.ndarray]) -> ArrayRecord:
    return ArrayRecord({name: Array(np.asarray(a)) for name, a in arrays.items()})


def reply(node_id: int, arrays: dict[str, np.ndarray] | None, **metrics: Any) -> Message:
    """A content reply with one ArrayRecord (if `arrays`) and one MetricRecord."""
    records: dict[str, Any] = {"metrics": MetricRecord(metrics)}
    if arrays is not None:
        records["arrays"] = named(arrays)
    return Message(content=RecordDict(records), metadata=metadata(node_id))


def raw_reply(node_id: int, records: dict[str, Any]) -> Message:
    return Message(content=RecordDict(records), metadata=metadata(node_id))


def error_reply(node_id: int) -> Message:
    error = Error(ErrorCode.CLIENT_APP_RAISED_EXCEPTION, "boom")
    return Message(error=error, metadata=metadata(node_id))


class FakeGrid:
    """A grid stand-in: `get_node_ids` walks through `connected` (one list per call)."""

    def __init__(self, *connected: list[int]) -> None:
        self.connected = list(connected)
        self.calls = 0

    def get_node_ids(self) -> list[int]:
        ids = self.connected[min(self.calls, len(self.connected) - 1)]
        self.calls += 1
        return list(ids)


def configure(
    strategy: FedADMM, rnd: int, arrays: ArrayRecord, grid: Any, **config: Any
) -> list[Message]:
    """Run configure_train of round `rnd` with `config` (as a user's train_config)."""
    with flower_task_identity():
        return strategy.configure_train(rnd, arrays, ConfigRecord(config), grid)
