"""Seeded node sampling by partition-id for the app's Message-API strategies.

Node ids are random per run, so Flower's Message-API `FedAvg` / `FedProx`
(``random.sample`` of the node ids) do not draw reproducible clients under partial
participation, and not the clients the legacy path draws. `PartitionSampler` draws
exactly as the legacy path's `PartitionClientManager`: wait for the nodes, size the
sample from those connected (after waiting: Flower's FedAvg sizes it before), and,
for a strict subset, order the nodes by partition-id (then node id) and pick
``np.sort(default_rng([seed, k]).choice(len(nodes), size, replace=False))`` in
round k (`flwr_admm.rounds.identity.sample_ids`). A node's partition-id is asked
once with the library's identity query (`flwr_admm.serverapp.identity.ask_keys`, which
the ClientApp answers with `flwr_admm.clientapp.identity.identity_reply`), as the
legacy manager asks once with ``get_properties``; full participation asks nothing.

`SeededFedAvg` / `SeededFedProx` are Flower's strategies with only the node sample
replaced (same messages, same aggregation code); the package's strategies take it
through their `_sample` (`message_server.PartitionSampled`).
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from logging import INFO

from flwr.app import ArrayRecord, ConfigRecord, Message, MessageType, RecordDict
from flwr.common.logger import log
from flwr.serverapp import Grid
from flwr.serverapp.strategy import FedAvg, FedProx

from flwr_admm.protocol import MESSAGE_SERVER_ROUND, PARTITION_ID
from flwr_admm.rounds.identity import sample_ids
from flwr_admm.serverapp.identity import ask_keys

__all__ = [
    "PartitionSampler",
    "SeededFedAvg",
    "SeededFedProx",
]

WAIT_INTERVAL = 0.5
KEY_PREFIX = f"{PARTITION_ID}:"  # the identity query's key of a partition


class PartitionSampler:
    """Draws the legacy path's clients: by partition-id, seeded by (seed, round)."""

    def __init__(self, seed: int, wait_seconds: float = 120.0) -> None:
        self.seed = seed
        self.wait_seconds = wait_seconds
        self.partitions: dict[int, int | None] = {}  # node id -> partition-id (None: unknown)
        self.connected: list[int] = []
        self.queries = 0

    def sample(
        self, grid: Grid, server_round: int, fraction: float, minimum: int, available: int
    ) -> list[int]:
        """Return the node ids of round `server_round`: max(int(N * fraction), minimum) of N."""
        node_ids = self._wait(grid, max(available, minimum))
        size = max(int(len(node_ids) * fraction), minimum)
        if size >= len(node_ids):
            return sorted(node_ids)
        self._learn(grid, [n for n in node_ids if n not in self.partitions])
        key_of = {str(n): str(p) for n in node_ids if (p := self.partitions.get(n)) is not None}
        sampled = sample_ids(node_ids, size, server_round, self.seed, key_of)
        log(INFO, "sampled %s of %s nodes (round %s)", len(sampled), len(node_ids), server_round)
        return sampled

    def _wait(self, grid: Grid, minimum: int) -> list[int]:
        deadline = time.monotonic() + self.wait_seconds
        while len(node_ids := [int(n) for n in grid.get_node_ids()]) < minimum:
            if time.monotonic() > deadline:
                break  # go on with those present, as the legacy client manager does
            time.sleep(WAIT_INTERVAL)
        self.connected = node_ids
        return node_ids

    def _learn(self, grid: Grid, node_ids: list[int]) -> None:
        """Ask each of `node_ids` once for its partition-id (no reply: unknown)."""
        if not node_ids:
            return
        self.queries += 1
        keys = ask_keys(grid, node_ids)
        for n in node_ids:
            key = keys.get(str(n), "")
            self.partitions[n] = int(key[len(KEY_PREFIX) :]) if key.startswith(KEY_PREFIX) else None


class SeededFedAvg(FedAvg):
    """Flower's Message-API `FedAvg` whose node sample is `PartitionSampler`'s."""

    sampler: PartitionSampler

    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """Send `arrays` and `config` (with ``server-round``) to the seeded sample."""
        if self.fraction_train == 0.0:
            return []
        node_ids = self.sampler.sample(
            grid, server_round, self.fraction_train, self.min_train_nodes, self.min_available_nodes
        )
        config[MESSAGE_SERVER_ROUND] = server_round
        record = RecordDict({self.arrayrecord_key: arrays, self.configrecord_key: config})
        return list(self._construct_messages(record, node_ids, MessageType.TRAIN))


class SeededFedProx(FedProx, SeededFedAvg):
    """Flower's Message-API `FedProx` (adds ``proximal-mu``) with the seeded sample."""
