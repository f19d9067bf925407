"""A ready Message-API ClientApp for the project's numpy models (`ADMMClient` inside).

`make_client_app(client_fn)` takes the same ``client_fn(context) -> ADMMClient`` a
legacy ``ClientApp(client_fn=...)`` takes and serves it through ``@app.train()`` and
``@app.evaluate()`` handlers: the received named tensors go in (as float64, in record
order), the config keys are read with their Message-API spelling (``server-round``,
``proximal-mu``), and the reply carries the trained tensors under the received names
and dtypes with ``num-examples`` and the client's metrics. Under
`flwr_admm.serverapp.FedADMMClientDuals` (``admm-duals = "client"`` in the config) the
`ADMMClient` runs the client-held-dual protocol, keeping its committed and pending
states in ``context.state``, and the reply carries Delta_i (float64) under the
received names, sigma_i' under ``admm-share`` when asked (`flwr_admm.clientapp.duals`).
Under `flwr_admm.serverapp.SCAFFOLD` / `FedDyn` (``peer-algorithm`` in the config) the
`ADMMClient` runs `flwr_admm.client.peers` (c_i / grad_i in ``context.state``); for
SCAFFOLD the received c (``scaffold-control``) is appended to x and the reply carries
y_i under the received names and c_i+ - c_i under ``scaffold-control``. Under FedADMM's
linearized form (``admm-form``) y_i (``admm-dual``) is appended to z, as on the legacy
wire, and the reply carries w_i and ``admm-step-budget``.
The local loop is `ADMMClient.fit` itself (`penalized_local_solve`; ``local_steps``,
``local_epochs``, ``learning_rate``, ``batch_size`` from the config, same defaults, warm start in
``context.state``), so both APIs compute the same numbers for the same inputs; with
rho = 0 the loop starts at the received arrays (FedAvg).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
from flwr.app import ConfigRecord, Context, Message, MetricRecord, RecordDict
from flwr.client import NumPyClient
from flwr.clientapp import ClientApp

from flwr_admm.clientapp.duals import accel_z, client_held, duals_reply
from flwr_admm.clientapp.peers import build_scaffold_reply, received_control
from flwr_admm.clientapp.records import build_reply, received_arrays, received_dual
from flwr_admm.protocol import (
    CLIENT_KEY,
    FORM,
    FORM_LINEARIZED,
    LOSS,
    MESSAGE_PROXIMAL_MU,
    MESSAGE_SERVER_ROUND,
    NUM_EXAMPLES,
    PEER,
    PEER_SCAFFOLD,
    PROXIMAL_MU,
    SERVER_ROUND,
)
from flwr_admm.uplink.wire import NUMPY_TENSOR_TYPE

__all__ = ["legacy_config", "make_client_app"]

ClientFn = Callable[[Context], NumPyClient]


def legacy_config(config: Mapping[str, Any]) -> dict[str, Any]:
    """Return `config` with the legacy spellings a NumPyClient reads added.

    ``server-round`` -> ``server_round``, ``proximal-mu`` -> ``proximal_mu`` (a key
    already present in legacy spelling wins).
    """
    out = dict(config)
    for message_key, legacy_key in (
        (MESSAGE_SERVER_ROUND, SERVER_ROUND),
        (MESSAGE_PROXIMAL_MU, PROXIMAL_MU),
    ):
        if message_key in out and legacy_key not in out:
            out[legacy_key] = out[message_key]
    return out


def make_client_app(
    client_fn: ClientFn, *, arrayrecord_key: str = "arrays", configrecord_key: str = "config"
) -> ClientApp:
    """Return a ClientApp whose handlers run ``client_fn(context)`` (e.g. an `ADMMClient`).

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
        params = [np.asarray(a, dtype=np.float64) for a in received.values()]
        config = legacy_config(_config(message, configrecord_key))
        scaffold = config.get(PEER) == PEER_SCAFFOLD
        if scaffold:  # [x, c]: the legacy parameters
            control = received_control(message, arrayrecord_key)
            params += [np.asarray(a, dtype=np.float64) for a in control.values()]
        if client_held(config):  # fast ADMM: z_k follows z^_{k+1}, as on the legacy wire
            params += accel_z(message, list(received))
        if config.get(FORM) == FORM_LINEARIZED and not client_held(config):  # [z, y_i]
            params += list(received_dual(message, list(received)).values())
        client = client_fn(context)
        arrays, num_examples, metrics = client.fit(params, config)
        if scaffold:  # y_i under the arrays, c_i+ - c_i under scaffold-control
            count = len(received)
            y, change = list(arrays[:count]), list(arrays[count:])
            return build_scaffold_reply(
                message,
                y,
                change,
                num_examples,
                _numeric(metrics),
                arrayrecord_key=arrayrecord_key,
            )
        if client_held(config):  # Delta_i (and sigma_i'); the client kept its states
            names, count = list(received), len(received)
            share = list(arrays[count:]) if len(arrays) == 2 * count else None
            reported = {**_numeric(metrics), NUM_EXAMPLES: int(num_examples)}
            return duals_reply(
                message,
                names,
                list(arrays[:count]),
                share,
                reported,
                arrayrecord_key=arrayrecord_key,
                payload=getattr(client, "uplink_payload", None),  # compressed Delta_i
            )
        payload = getattr(client, "uplink_payload", None)
        if payload is not None and payload.tensor_type != NUMPY_TENSOR_TYPE:  # compressed
            reported = {**_numeric(metrics), NUM_EXAMPLES: int(num_examples)}
            names = list(received)
            return duals_reply(message, names, [], None, reported, payload=payload)
        return build_reply(
            message,
            arrays,
            num_examples,
            _numeric(metrics),
            arrayrecord_key=arrayrecord_key,
            configrecord_key=configrecord_key,
        )

    @app.evaluate()
    def evaluate(message: Message, context: Context) -> Message:
        received = received_arrays(message, arrayrecord_key)
        params = [np.asarray(a, dtype=np.float64) for a in received.values()]
        config = legacy_config(_config(message, configrecord_key))
        loss, num_examples, metrics = client_fn(context).evaluate(params, config)
        reported = {**_numeric(metrics), LOSS: float(loss), NUM_EXAMPLES: int(num_examples)}
        return Message(RecordDict({"metrics": MetricRecord(reported)}), reply_to=message)

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
