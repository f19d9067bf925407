"""Ask the connected nodes which client they speak for, so that a seeded sample repeats.

Flower gives nodes random ids in every run (engine and deployment), and
`flwr_admm.rounds.identity.sample_ids` orders the connected nodes by client key, then
node id: a node the server has no key for yet (before its first reply) takes a place
that changes from run to run, and with it the sample of a seeded run under partial
participation. So, with ``ClientPolicy(identify=True)``, when a seeded round samples a
strict subset, the strategy first asks every node it has no key for, once, with a
``query`` message carrying the config record `IDENTITY_QUERY`;
`flwr_admm.clientapp.identity.identity_reply` (registered by
`flwr_admm.clientapp.make_client_app`; a user's ClientApp adds it as its
``@app.query()``) answers with the node's ``partition-id`` / ``client-key``, what its
train replies report. The announced key only orders the sample; a key is bound to a
node by its train replies (`flwr_admm.rounds.identity.KeyBinding`). A node that does
not answer (no query handler, an error, the timeout) keeps its node-id place.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from logging import INFO, WARNING
from typing import Any

from flwr.app import ConfigRecord, Message, MessageType, RecordDict
from flwr.common.logger import log
from flwr.serverapp import Grid

from flwr_admm.protocol import IDENTITY_QUERY
from flwr_admm.rounds.identity import client_key_of

__all__ = ["QUERY_TIMEOUT", "ask_keys"]

QUERY_TIMEOUT = 120.0  # seconds the identity query waits for its replies


def ask_keys(grid: Grid, node_ids: Sequence[int], timeout: float = QUERY_TIMEOUT) -> dict[str, str]:
    """Return ``{str(node id): client key}`` of the nodes in `node_ids` that answered.

    Never raises on a reply: an error, a reply from a node not asked, or one without a
    valid key is left out (and logged).
    """
    if not node_ids:
        return {}
    content = RecordDict({IDENTITY_QUERY: ConfigRecord()})
    messages = [Message(content, dst_node_id=n, message_type=MessageType.QUERY) for n in node_ids]
    asked = {str(n) for n in node_ids}
    keys: dict[str, str] = {}
    for reply in grid.send_and_receive(messages, timeout=timeout):
        node = str(reply.metadata.src_node_id)
        if node not in asked or reply.has_error():
            continue
        record: Mapping[str, Any] = reply.content.metric_records.get(IDENTITY_QUERY) or {}
        try:
            key = client_key_of(node, record)
        except ValueError as error:
            log(WARNING, "node %s: identity reply refused (%s)", node, error)
            continue
        if not key.startswith("cid:"):  # a node without a key keeps its node-id place
            keys[node] = key
    log(INFO, "identity query: %s of %s nodes named their client key", len(keys), len(asked))
    return keys
