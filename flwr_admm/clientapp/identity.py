"""The node's answer to the strategy's identity query (`flwr_admm.serverapp.identity`).

A seeded strategy with ``ClientPolicy(identify=True)`` that samples a strict subset of
the nodes asks each node it has no key for which client it speaks for; register the
answer as the ClientApp's query handler (`make_client_app` does)::

    @app.query()
    def query(message: Message, context: Context) -> Message:
        return identity_reply(message, context)

Without it, runs in Flower's engine under partial participation draw other clients
each time (node ids are random per run).
"""

from __future__ import annotations

from flwr.app import Context, Message, MetricRecord, RecordDict

from flwr_admm.clientapp.records import key_metrics
from flwr_admm.protocol import IDENTITY_QUERY

__all__ = ["identity_reply"]


def identity_reply(message: Message, context: Context) -> Message:
    """Return the reply to an identity query: the node config's ``partition-id`` / ``client-key``.

    Raises
    ------
    ValueError
        Naming ``message`` when it is not the identity query (another query needs the
        user's own handler).

    """
    if IDENTITY_QUERY not in message.content.config_records:
        raise ValueError(
            f"message: a query without the {IDENTITY_QUERY!r} config record is not "
            "the identity query; answer it in your own @app.query() handler"
        )
    return Message(
        RecordDict({IDENTITY_QUERY: MetricRecord(key_metrics(context))}), reply_to=message
    )
