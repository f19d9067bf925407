"""Helpers for a train handler under the Message-API `SCAFFOLD` (and what `FedDyn` needs).

`flwr_admm.serverapp.SCAFFOLD` sends x under ``arrays`` and c under
``scaffold-control`` (same tensor names); the node's round is `flwr_admm.node.peers`,
its reply y_i under ``arrays`` and c_i+ - c_i under ``scaffold-control``::

    @app.train()
    def train(msg: Message, context: Context) -> Message:
        x = received_arrays(msg)                # dict name -> array
        c = received_control(msg)
        ...                                     # K steps; c_i+ - c_i
        return build_scaffold_reply(msg, y, control_change, num_examples=n)

`flwr_admm.serverapp.FedDyn` needs nothing extra: the reply is `build_reply` of w_i.
A handler keeping c_i / grad_i itself should follow `flwr_admm.node.peers`'
acknowledgement rule (`make_client_app` does): a reply without ``admm-previous-round``
is folded as in sync, so a lost reply would leave the node's state ahead of the server's.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from flwr.app import Context, Message
from numpy.typing import NDArray

from flwr_admm.clientapp.records import (
    Named,
    build_reply,
    key_metrics,
    named,
    ordered,
    received_arrays,
    received_block,
)
from flwr_admm.protocol import SCAFFOLD_CONTROL_RECORD

__all__ = ["build_scaffold_reply", "received_control"]


def received_control(message: Message, arrayrecord_key: str = "arrays") -> Named:
    """Return the server control variate c by name, in the order of the model's tensors.

    Raises
    ------
    ValueError
        When ``scaffold-control`` is missing or its names or shapes differ from the model's.

    """
    return received_block(
        message, SCAFFOLD_CONTROL_RECORD, received_arrays(message, arrayrecord_key)
    )


def build_scaffold_reply(
    message: Message,
    y: Mapping[str, NDArray[Any]] | Sequence[NDArray[Any]],
    control_change: Mapping[str, NDArray[Any]] | Sequence[NDArray[Any]],
    num_examples: int,
    metrics: Mapping[str, Any] | None = None,
    context: Context | None = None,
    *,
    arrayrecord_key: str = "arrays",
) -> Message:
    """Return `build_reply` of y_i, plus c_i+ - c_i under ``scaffold-control``.

    Both go under the received names; c_i+ - c_i in the dtypes of the received c.
    `context` adds ``partition-id`` / ``client-key`` to the metrics (no warm start is
    kept: SCAFFOLD starts from x).
    """
    reported = {**(key_metrics(context) if context is not None else {}), **(metrics or {})}
    reply = build_reply(message, y, num_examples, reported, arrayrecord_key=arrayrecord_key)
    c = received_control(message, arrayrecord_key)
    values = ordered(control_change, list(c), "control_change")
    reply.content[SCAFFOLD_CONTROL_RECORD] = named(list(c), values, like=c)
    return reply
