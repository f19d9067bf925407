"""`make_client_app`: a ready Message-API ClientApp around a legacy ``client_fn``.

The handlers translate records to the legacy call and back: the received tensors in
record order as float64 with the round's second block appended (`flwr_admm.node.blocks`),
the config with its legacy spellings added; the reply under the received names (record
names: `flwr_admm.protocol`). `ADMMClient.fit` is the local loop, so both APIs compute
the same numbers for the same inputs.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
from flwr.app import ConfigRecord, Context, Message
from flwr.client import NumPyClient
from flwr.clientapp import ClientApp

from flwr_admm.clientapp.identity import identity_reply
from flwr_admm.clientapp.peers import build_scaffold_reply
from flwr_admm.clientapp.records import (
    build_reply,
    node_records,
    received_arrays,
    received_block,
    reply_message,
)
from flwr_admm.node.blocks import companion
from flwr_admm.node.config import client_held, legacy_config
from flwr_admm.node.reply import Reply
from flwr_admm.protocol import CLIENT_KEY, LOSS, NUM_EXAMPLES, PEER, PEER_SCAFFOLD
from flwr_admm.uplink.wire import NUMPY_TENSOR_TYPE

__all__ = ["make_client_app"]

ClientFn = Callable[[Context], NumPyClient]


def make_client_app(
    client_fn: ClientFn, *, arrayrecord_key: str = "arrays", configrecord_key: str = "config"
) -> ClientApp:
    """Return a ClientApp whose handlers run ``client_fn(context)`` (e.g. an `ADMMClient`).

    Its query handler answers the strategies' identity query
    (`flwr_admm.clientapp.identity`).

    Parameters
    ----------
    client_fn : callable
        ``client_fn(context) -> NumPyClient``, rebuilt for every message as Flower does;
        build it with ``context=context`` so that warm starts persist in its state.
    arrayrecord_key, configrecord_key : str
        Record names, as given to the server strategy.

    """
    app = ClientApp()

    @app.train()
    def train(message: Message, context: Context) -> Message:
        received = received_arrays(message, arrayrecord_key)
        names, count = list(received), len(received)
        params = [np.asarray(a, dtype=np.float64) for a in received.values()]
        config = legacy_config(_config(message, configrecord_key))
        second = companion(config)
        if second is not None:  # y_i, c or z_k: after the model, as on the legacy wire
            block = received_block(message, second, received)
            params += [np.asarray(a, dtype=np.float64) for a in block.values()]
        client = client_fn(context)
        arrays, num_examples, metrics = client.fit(params, config)
        reported = _numeric(metrics)
        if config.get(PEER) == PEER_SCAFFOLD:  # y_i, then c_i+ - c_i
            y, change = list(arrays[:count]), list(arrays[count:])
            key = arrayrecord_key
            return build_scaffold_reply(
                message, y, change, num_examples, reported, arrayrecord_key=key
            )
        payload = getattr(client, "uplink_payload", None)
        compressed = payload is not None and payload.tensor_type != NUMPY_TENSOR_TYPE
        if client_held(config) or compressed:  # Delta_i (or w_i's payload), sigma_i' if asked
            share = list(arrays[count:]) if len(arrays) == 2 * count else None
            sent = Reply(list(arrays[:count]), {}, second=share, payload=payload)
            records = node_records(names, sent, arrayrecord_key)
            return reply_message(message, records, {**reported, NUM_EXAMPLES: int(num_examples)})
        return build_reply(
            message,
            arrays,
            num_examples,
            reported,
            arrayrecord_key=arrayrecord_key,
            configrecord_key=configrecord_key,
        )

    @app.query()
    def query(message: Message, context: Context) -> Message:
        return identity_reply(message, context)  # the seeded sample's identity query

    @app.evaluate()
    def evaluate(message: Message, context: Context) -> Message:
        received = received_arrays(message, arrayrecord_key)
        params = [np.asarray(a, dtype=np.float64) for a in received.values()]
        config = legacy_config(_config(message, configrecord_key))
        loss, num_examples, metrics = client_fn(context).evaluate(params, config)
        reported = {**_numeric(metrics), LOSS: float(loss), NUM_EXAMPLES: int(num_examples)}
        return reply_message(message, {}, reported)

    return app


def _config(message: Message, configrecord_key: str) -> dict[str, Any]:
    record = message.content.config_records.get(configrecord_key, ConfigRecord())
    return dict(record.items())


def _numeric(metrics: Mapping[str, Any]) -> dict[str, Any]:
    """Return legacy metrics as MetricRecord values; a text ``client-key`` is refused.

    (A MetricRecord holds numbers only: ``client-key`` must be an integer here.)
    """
    out: dict[str, Any] = {}
    for name, value in metrics.items():
        if name == CLIENT_KEY and isinstance(value, str):
            if not value.isdecimal():
                raise ValueError(
                    f"{CLIENT_KEY}: must be an integer under the Message API (MetricRecord "
                    f"holds numbers only), got {value!r}"
                )
            value = int(value)
        out[name] = int(value) if isinstance(value, bool) else value
    return out
