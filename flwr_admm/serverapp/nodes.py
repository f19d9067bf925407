"""Which nodes train, and which replies may speak for a client key (Message API).

Sampling waits for the nodes first and sizes the sample afterwards (Flower 1.42's
Message-API FedAvg sizes it from the nodes connected *before* waiting, so round 1 of
a simulation can sample 2 of 10 nodes). With a seed, round k draws from the nodes
ordered by their known client key, then node id, with a generator seeded by
(sampling_seed, k): the legacy `flwr_admm.server.sampling.sample_clients` rule, so
both APIs pick the same clients. `admit` applies the legacy strategies' duplicate-key
and key-binding policy (`flwr_admm.server.base.ConsensusStrategy`) to Message replies.
"""

from __future__ import annotations

import random
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from logging import INFO

import numpy as np
from flwr.common.logger import log
from flwr.serverapp import Grid

from flwr_admm.core.types import natural_key
from flwr_admm.server.identity import KeyBinding
from flwr_admm.serverapp.records import ReadReply

__all__ = ["Admission", "admit", "sample_nodes", "wait_for_nodes"]

WAIT_INTERVAL = 1.0  # seconds between looks at the connected nodes (Flower's value)


def wait_for_nodes(grid: Grid, minimum: int, interval: float | None = None) -> list[int]:
    """Return the connected node ids once there are at least `minimum` of them.

    Looks every `interval` seconds (default `WAIT_INTERVAL`, read at call time).
    """
    while len(node_ids := [int(n) for n in grid.get_node_ids()]) < minimum:
        log(INFO, "Waiting for nodes: %d connected (minimum: %d)", len(node_ids), minimum)
        time.sleep(WAIT_INTERVAL if interval is None else interval)
    return node_ids


def sample_nodes(
    node_ids: list[int],
    size: int,
    server_round: int,
    sampling_seed: int | None,
    key_of: Mapping[str, str],
) -> list[int]:
    """Return `size` of `node_ids`, ordered by (client key, node id).

    `key_of` maps a node id (as str) to the key it speaks for; unknown nodes sort
    last. With a `sampling_seed` the draw is reproducible; None draws with `random`,
    as Flower does.
    """
    order = sorted(
        node_ids, key=lambda n: (natural_key(key_of.get(str(n), "~")), natural_key(str(n)))
    )
    if size >= len(order):
        return order
    if sampling_seed is None:
        picked = sorted(random.sample(range(len(order)), size))
    else:
        rng = np.random.default_rng([sampling_seed, server_round])
        picked = [int(i) for i in np.sort(rng.choice(len(order), size=size, replace=False))]
    return [order[i] for i in picked]


@dataclass
class Admission:
    """Outcome of `admit`: replies to fold in, keys to free first, replies refused."""

    admitted: list[ReadReply] = field(default_factory=list)
    freed: list[str] = field(default_factory=list)
    rejected: list[tuple[ReadReply, str]] = field(default_factory=list)
    conflicts: int = 0


def admit(replies: list[ReadReply], binding: KeyBinding) -> Admission:
    """Settle which usable replies may speak for their keys (natural key order).

    Replies of one round that share a key are all refused, except that a single
    reply of the key's own node is kept (the others are conflicts); a claim the
    binding forbids is a conflict; a key whose node left the federation is freed
    (its state must be evicted before the reply is folded in as a new client's).
    """
    out = Admission()
    by_key: dict[str, list[ReadReply]] = {}
    for reply in replies:
        by_key.setdefault(reply.key, []).append(reply)
    for key in sorted(by_key, key=natural_key):
        group = by_key[key]
        if len(group) > 1:
            own = [r for r in group if str(r.node_id) == binding.owner(key)]
            if len(own) != 1:
                out.rejected += [(r, "several replies share this client key") for r in group]
                continue
            for other in (r for r in group if r is not own[0]):
                _conflict(out, other, binding)
            group = own
        reply = group[0]
        claim = binding.claim(key, str(reply.node_id))
        if claim == "conflict":
            _conflict(out, reply, binding)
            continue
        if claim == "rebind":
            out.freed.append(key)
        out.admitted.append(reply)
    return out


def _conflict(out: Admission, reply: ReadReply, binding: KeyBinding) -> None:
    node = str(reply.node_id)
    out.rejected.append(
        (
            reply,
            f"node {node} may not speak for it (key bound to node "
            f"{binding.node_of.get(reply.key)}, node {node} to {binding.key_of.get(node)})",
        )
    )
    out.conflicts += 1
