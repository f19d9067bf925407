"""Which nodes train, and which replies may speak for a client key (Message API).

Sampling waits for the nodes first and sizes the sample afterwards (Flower 1.42's
Message-API FedAvg sizes it from the nodes connected *before* waiting, so round 1 of
a simulation can sample 2 of 10 nodes); the draw itself is the legacy strategies'
`flwr_admm.rounds.sampling.sample_ids` (nodes ordered by their known client key,
then node id; with a seed, a generator seeded by (sampling_seed, k)), so both APIs
pick the same clients. `admit` applies the legacy strategies' duplicate-key
and key-binding policy (`flwr_admm.rounds.identity.KeyBinding.admit`) to Message replies.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from logging import INFO

from flwr.common.logger import log
from flwr.serverapp import Grid

from flwr_admm.rounds.identity import KeyBinding
from flwr_admm.serverapp.records_old import ReadReply

__all__ = ["admit", "wait_for_nodes"]

WAIT_INTERVAL = 1.0  # seconds between looks at the connected nodes (Flower's value)


def wait_for_nodes(grid: Grid, minimum: int, interval: float | None = None) -> list[int]:
    """Return the connected node ids once there are at least `minimum` of them.

    Looks every `interval` seconds (default `WAIT_INTERVAL`, read at call time).
    """
    while len(node_ids := [int(n) for n in grid.get_node_ids()]) < minimum:
        log(INFO, "Waiting for nodes: %d connected (minimum: %d)", len(node_ids), minimum)
        time.sleep(WAIT_INTERVAL if interval is None else interval)
    return node_ids


@dataclass(frozen=True)
class _Sender:
    """A node id as `KeyBinding.admit` reads it (`flwr_admm.rounds.identity.Sender`)."""

    cid: str


def admit(
    replies: list[ReadReply], binding: KeyBinding, reject: Callable[[str, str, bool], None]
) -> tuple[list[ReadReply], list[str]]:
    """Return the usable replies that may speak for their keys, and the keys to free first.

    The legacy strategies' policy, `KeyBinding.admit`, applied to Message replies
    (a node id stands in for the cid): replies of one round that share a key are all
    refused, except that a single reply of the key's own node is kept (the others are
    conflicts); a claim the binding forbids is a conflict; a key whose node left the
    federation is freed (evict its state, then fold the reply in as a new client's).
    Refusals go to ``reject(key, problem, is_conflict)``.
    """
    keyed = [(r.key, _Sender(str(r.node_id)), r) for r in replies]
    admitted, freed = binding.admit(keyed, reject)
    return [reply for _, _, reply in admitted], freed
