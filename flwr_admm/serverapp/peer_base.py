"""The Message-API round the peer baselines `SCAFFOLD` and `FedDyn` share.

A subclass of `flwr.serverapp.strategy.FedAvg` (same keywords, same node sample)
around the round object (`flwr_admm.rounds.peers.PeerRound`, which the legacy
`flwr_admm.server.peer_base.PeerStrategy` holds too), which keeps x in float64, the
server state (SCAFFOLD's c, FedDyn's h) and the arithmetic: this module only
translates records. Per round:

- ``configure_train``: x under ``arrays`` (the model's names and dtypes), the
  round's further blocks under their own ArrayRecords (SCAFFOLD: c under
  ``scaffold-control``), and ``peer-algorithm`` (plus FedDyn's ``feddyn-alpha``)
  added to a copy of the given config (Flower adds ``server-round``), with each
  node's own acknowledgement ``admm-ack-round`` (`PeerRound.instruction`).
- ``aggregate_train``: every content reply is read into a `Reply` (client key,
  blocks, n_i, node, ``admm-previous-round``) as the legacy translator reads a FitRes
  (key: ``client-key``, else ``partition-id``, else the node id; n_i:
  ``num-examples``), settled by the round's `admit` and folded in sorted key order by
  its `fold`, so identical replies give the legacy x' and state bit for bit.

A reply Flower's FedAvg would abort the run on, or that the legacy translator rejects
(missing or extra ArrayRecords, other tensor names or shapes, NaN/inf, a
non-positive ``num-examples``, a claim the key binding refuses, a state out of sync
with its acknowledgement) is logged and counted in ``num_rejected`` (and in
``num_key_conflicts`` / ``num_state_mismatch``); error replies in ``num_failures``. Never raises
on a reply; the round's divergence watchdog (``health``, `PeerRound.watch`) sees
every round and raises `RunDivergedError` when the run diverged or stalled.
"""

from __future__ import annotations

from collections.abc import Iterable
from functools import partial
from logging import WARNING
from typing import Any

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Message, MessageType, MetricRecord, RecordDict
from flwr.common import NDArrays
from flwr.common.logger import log
from flwr.serverapp import Grid
from flwr.serverapp.strategy import FedAvg

from flwr_admm.core.health import DEFAULT_HEALTH, HealthCheck
from flwr_admm.core.validation import reply_problem
from flwr_admm.protocol import (
    ACK_ROUND,
    MESSAGE_RESERVED_CONFIG_KEYS,
    MESSAGE_SERVER_ROUND,
    NUM_FAILURES,
    NUM_KEY_CONFLICTS,
    NUM_REJECTED,
    RESERVED_CONFIG_PREFIXES,
    ROUND,
    SERVER_ROUND,
)
from flwr_admm.rounds.peers import PeerRound, Reply, previous_round
from flwr_admm.rounds.sampling import unconfigured
from flwr_admm.serverapp.config import check_fields, copy_config
from flwr_admm.serverapp.records_old import Layout, merge_metrics, read_reply

__all__ = ["PeerFedAvg"]


class PeerFedAvg(FedAvg):
    """Flower's Message-API FedAvg sampling around a peer baseline's round (`PeerRound`).

    Parameters
    ----------
    algorithm : PeerRound
        The round (`ScaffoldRound`, `FedDynRound`) whose state and update this runs.
    extra_records : tuple of str
        Names of the ArrayRecords carrying the blocks after x, down and up.
    health : HealthCheck or None
        Divergence watchdog (`flwr_admm.core.health`), kept by `algorithm`; None: off.
    **fedavg_kwargs
        Every keyword of `flwr.serverapp.strategy.FedAvg`.

    """

    def __init__(
        self,
        algorithm: PeerRound,
        extra_records: tuple[str, ...] = (),
        *,
        health: HealthCheck | None = DEFAULT_HEALTH,
        **fedavg_kwargs: Any,
    ) -> None:
        super().__init__(**fedavg_kwargs)
        check_fields(self, None)
        self.algorithm = algorithm
        self.health = health
        algorithm.watch_with(health, type(self).__name__)
        self.extra_records = extra_records
        self.layout: Layout | None = None
        self.history: list[dict[str, Any]] = []  # round metrics, as returned
        self._extra: dict[str, ArrayRecord] = {}  # this round's blocks after x

    @property
    def current(self) -> NDArrays | None:
        """Return x in float64 (None before the first round)."""
        return self.algorithm.current

    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """Sample as FedAvg; send x (and the further blocks) with ``peer-algorithm``."""
        if self.layout is None:
            self.layout = Layout.of(arrays)
            self.algorithm.begin([arrays[name].numpy() for name in self.layout.names])
        own = {
            k: v for k, v in self.algorithm.own_config(server_round).items() if k != SERVER_ROUND
        }
        given = copy_config(config)
        reserved = {*own, ACK_ROUND, *MESSAGE_RESERVED_CONFIG_KEYS} - {MESSAGE_SERVER_ROUND}
        clash = sorted(k for k in given if k in reserved or k.startswith(RESERVED_CONFIG_PREFIXES))
        if clash:
            raise ValueError(
                f"train_config: key {clash[0]!r} is set by {type(self).__name__} "
                f"(reserved: {sorted(reserved)} and keys starting with "
                f"{list(RESERVED_CONFIG_PREFIXES)}); rename it"
            )
        self.algorithm.connected(str(node) for node in grid.get_node_ids())
        sent = self.algorithm.sent()
        count = len(self.layout.names)
        blocks = [sent[i : i + count] for i in range(0, len(sent), count)]
        self._extra = {
            name: self.layout.record(block)
            for name, block in zip(self.extra_records, blocks[1:], strict=True)
        }
        x = self.layout.record(blocks[0])
        messages = list(
            super().configure_train(server_round, x, ConfigRecord({**given, **own}), grid)
        )
        self.algorithm.num_sent = len(messages)  # replies missing from aggregate_train: lost
        return messages

    def _construct_messages(
        self, record: RecordDict, node_ids: list[int], message_type: str
    ) -> Iterable[Message]:
        """FedAvg's messages; a train message also carries the further blocks and its ack."""
        if message_type != MessageType.TRAIN:
            return super()._construct_messages(record, node_ids, message_type)
        shared = {**dict(record.items()), **self._extra}
        config = record.config_records[self.configrecord_key]
        messages: list[Message] = []
        for node in node_ids:
            own = ConfigRecord({**dict(config.items()), **self.algorithm.instruction(str(node))})
            content = RecordDict({**shared, self.configrecord_key: own})
            messages += super()._construct_messages(content, [node], message_type)
        return messages

    def aggregate_train(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """Fold the usable replies in key order into x (and the state); count the rest.

        Raises ValueError before any ``configure_train`` (no x was sent: `unconfigured`).
        """
        name = type(self).__name__
        if self.layout is None or self.algorithm.current is None:
            raise unconfigured(name, "aggregate_train", "configure_train")
        replies, sent, self.algorithm.num_sent = list(replies), self.algorithm.num_sent, 0
        counts = {
            NUM_FAILURES: sum(m.has_error() for m in replies),
            NUM_REJECTED: 0,
            NUM_KEY_CONFLICTS: 0,
        }
        valid: list[Reply] = []
        read: list[RecordDict] = []
        for message in replies:
            if message.has_error():
                continue
            problem, reply = self._read(message)
            if problem is not None or reply is None:
                node = int(message.metadata.src_node_id)
                self._reject(counts, f"node {node}", str(problem), False)
                continue
            valid.append(reply)
            read.append(message.content)
        kept, settled = self.algorithm.admit(valid, partial(self._reject, counts))
        counts.update(settled)
        accepted, contents = [valid[i] for i in kept], [read[i] for i in kept]
        lost = max(0, sent - len(replies))  # late replies are simply absent
        tally = (len(accepted), counts[NUM_REJECTED], counts[NUM_FAILURES] + lost)
        if not accepted:
            log(WARNING, "%s round %s: no usable reply; model unchanged", name, server_round)
            self.algorithm.watch(server_round, tally)
            return None, MetricRecord(counts)  # type: ignore[arg-type]
        before = self.algorithm.current  # fold replaces x, never writes into it
        own = self.algorithm.fold(accepted, server_round)
        ours = {**own, **counts}
        metrics = merge_metrics(self.train_metrics_aggr_fn, contents, self.weighted_by_key, ours)
        self.history.append({ROUND: server_round, **metrics})
        self.algorithm.watch(server_round, tally, before, own)
        return self.layout.record(self.algorithm.model()), metrics

    def _reject(self, counts: dict[str, int], who: str, problem: str, conflict: bool) -> None:
        """Log and count a rejected reply (and a key conflict if `conflict`)."""
        log(WARNING, "%s: rejected reply of %s: %s", type(self).__name__, who, problem)
        counts[NUM_REJECTED] += 1
        counts[NUM_KEY_CONFLICTS] += int(conflict)

    def _read(self, message: Message) -> tuple[str | None, Reply | None]:
        """Return (problem, None) or (None, the `Reply`) for one reply."""
        assert self.layout is not None
        extra = self.extra_records[0] if self.extra_records else None
        reply = read_reply(message, self.layout, self.weighted_by_key, share_key=extra, finite=True)
        if reply.problem is not None:
            return reply.problem, None
        if extra is not None and reply.share is None:
            return f"missing the {extra!r} ArrayRecord", None
        blocks = [*reply.arrays, *(reply.share or [])]
        problem = reply_problem(blocks, reply.num_examples, self.algorithm.reply_shapes())
        if problem is not None:
            return problem, None
        try:
            previous = previous_round(reply.metrics)
        except ValueError as error:
            return str(error), None
        floats = [np.asarray(a, dtype=np.float64) for a in blocks]
        return None, Reply(reply.key, floats, reply.num_examples, str(reply.node_id), previous)
