"""The Message-API translator: Flower's `FedAvg` around a round layer (`RoundLayer`).

`RoundStrategy` keeps Flower's Message-API FedAvg surface (its keywords, positional
in its order; ``start``; evaluation) and hands every train round to the strategy's
`flwr_admm.rounds.layer.RoundLayer`: ``configure_train`` reads z^k from the given
ArrayRecord, lets the layer sample and instruct the nodes, and turns each
`Instruction` into a TRAIN message (the model block under ``arrays``, further blocks
under their own names, the config with Flower's hyphenated names); ``aggregate_train``
reads each reply into an `Incoming` (`flwr_admm.serverapp.records.incoming`), lets the
layer admit and fold them, and returns z' with the round metrics. Nothing of the
round's math is here.

Before any ``configure_train`` (as Flower's own strategy tests call it, on hand-built
replies) ``aggregate_train`` raises a ValueError naming ``configure_train`` and changes
nothing: a reply means something only against what configure_train sent its node.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from logging import INFO, WARNING
from typing import Any

from flwr.app import ArrayRecord, ConfigRecord, Message, MessageType, MetricRecord, RecordDict
from flwr.common.logger import log
from flwr.serverapp import Grid
from flwr.serverapp.strategy import FedAvg

from flwr_admm.core.health import ADMM_ADVICE, DEFAULT_HEALTH, HealthCheck
from flwr_admm.core.types import Arrays
from flwr_admm.options import Checkpointing, ClientPolicy
from flwr_admm.protocol import (
    MESSAGE_PROXIMAL_MU,
    MESSAGE_SERVER_ROUND,
    PROXIMAL_MU,
    SERVER_ROUND,
)
from flwr_admm.rounds.checks import check_sizes, unconfigured
from flwr_admm.rounds.exchange import AS_RECEIVED, Algorithm, Instruction
from flwr_admm.rounds.layer import RoundLayer
from flwr_admm.rounds.views import RoundViews
from flwr_admm.serverapp.identity import ask_keys
from flwr_admm.serverapp.records import (
    check_overwritten,
    copy_config,
    has_weight,
    incoming,
    layout_of,
    merge_metrics,
    plain_metrics,
    read_model,
    to_record,
)

__all__ = ["RoundStrategy", "wait_for_nodes"]

WAIT_INTERVAL = 1.0  # seconds between looks at the connected nodes (Flower's value)
MESSAGE_NAMES = {PROXIMAL_MU: MESSAGE_PROXIMAL_MU, SERVER_ROUND: MESSAGE_SERVER_ROUND}


def wait_for_nodes(grid: Grid, minimum: int, interval: float | None = None) -> list[int]:
    """Return the connected node ids once there are at least `minimum` of them.

    Looks every `interval` seconds (default `WAIT_INTERVAL`, read at call time).
    """
    while len(node_ids := [int(n) for n in grid.get_node_ids()]) < minimum:
        log(INFO, "Waiting for nodes: %d connected (minimum: %d)", len(node_ids), minimum)
        time.sleep(WAIT_INTERVAL if interval is None else interval)
    return node_ids


class RoundStrategy(RoundViews, FedAvg):
    """Flower's Message-API `FedAvg` whose train rounds are a `RoundLayer`'s.

    Sampling waits for ``min_available_nodes`` first and sizes the sample from the
    nodes connected then (Flower's FedAvg sizes it before waiting, so it samples too
    few while nodes are still connecting); the draw is the layer's
    (`flwr_admm.rounds.identity.sample_ids`); with ``ClientPolicy(identify=True)`` a
    seeded round that samples a strict subset first asks the nodes without a key which
    client they speak for (`flwr_admm.serverapp.identity`).
    """

    def __init__(
        self,
        algorithm: Algorithm,
        fedavg: dict[str, Any],
        *,
        sampling_seed: int | None = 0,
        clients: ClientPolicy | None = None,
        checkpoint: Checkpointing | None = None,
        health: HealthCheck | None = DEFAULT_HEALTH,
        stop_on_convergence: bool = False,
        advice: str = ADMM_ADVICE,
    ) -> None:
        super().__init__(**fedavg)
        check_sizes(
            self,
            ("fraction_train", "fraction_evaluate"),
            ("min_train_nodes", "min_evaluate_nodes", "min_available_nodes"),
        )
        for name in ("weighted_by_key", "arrayrecord_key", "configrecord_key"):
            value = getattr(self, name)
            if not isinstance(value, str) or not value:
                raise ValueError(f"{name}: must be a non-empty str, got {value!r}")
        self.round = RoundLayer(
            algorithm,
            sampling_seed=sampling_seed,
            clients=clients,
            checkpoint=checkpoint,
            health=health,
            stop_on_convergence=stop_on_convergence,
            settings={
                "api": "message",
                "fraction_train": float(self.fraction_train),
                "min_train_nodes": int(self.min_train_nodes),
            },
            advice=advice,
        )
        self._model_sent: ArrayRecord | None = None  # this round's z^k, as received
        self._returned: ArrayRecord | None = None  # the last z' we returned
        self._announced: dict[str, str] = {}  # node id -> the key its identity reply named
        self._asked: set[str] = set()  # node ids asked once (`flwr_admm.serverapp.identity`)
        self.round.resume()

    # ------------------------------------------------------------------ train
    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> list[Message]:
        """Adopt z^k, evict stale keys, wait for the nodes, sample them, instruct each."""
        user = copy_config(config, check=True)  # Strategy.start reuses `config` every round
        layer = self.round
        if layer.restored:
            arrays = self._resumed(arrays)
        layout = layer.layout if layer.layout is not None else layout_of(arrays)
        kept = arrays is self._returned and getattr(layer.algorithm, "keeps_model", False)
        z = None if kept else read_model(arrays, layout)  # kept: z' as the algorithm holds it
        server_round = layer.configure(server_round, z, layout)
        self._model_sent = arrays
        if layer.stopped() or self.fraction_train == 0.0:
            return []
        sampled = self._sample(grid, server_round, self.fraction_train, self.min_train_nodes, True)
        instructions = layer.instructions(sampled, server_round, user)
        check_overwritten(user, [ins.config for ins in instructions])
        cache: dict[int, ArrayRecord] = {}
        return [
            self._train_message(node, ins, arrays, server_round, cache)
            for node, ins in zip(sampled, instructions, strict=True)
        ]

    def _train_message(
        self,
        node: int,
        instruction: Instruction,
        received: ArrayRecord,
        server_round: int,
        cache: dict[int, ArrayRecord],
    ) -> Message:
        """Return the TRAIN message of `instruction` (a block given twice is built once)."""

        def record(block: Arrays) -> ArrayRecord:
            if block is AS_RECEIVED:
                return received
            if id(block) not in cache:
                assert self.round.layout is not None
                cache[id(block)] = to_record(block, self.round.layout)
            return cache[id(block)]

        config = {MESSAGE_NAMES.get(k, k): v for k, v in instruction.config.items()}
        content = RecordDict(
            {
                self.arrayrecord_key: record(instruction.arrays),
                self.configrecord_key: ConfigRecord(config),  # type: ignore[arg-type]
                **{name: record(block) for name, block in instruction.blocks.items()},
            }
        )
        return Message(  # group_id: SuperNodes log "[RUN r, ROUND k]" as in legacy
            content, dst_node_id=node, message_type=MessageType.TRAIN, group_id=str(server_round)
        )

    def aggregate_train(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """Fold the usable replies in client-key order; return z' and the round metrics.

        Raises ValueError before any ``configure_train`` (module docstring).
        """
        layer = self.round
        if not layer.configured or layer.layout is None:
            raise unconfigured(layer.label, "aggregate_train", "configure_train")
        sent, self._model_sent = self._model_sent, None  # this round only
        channel = getattr(layer.algorithm, "channel", None)
        tensor_type = (
            None
            if channel is None or channel.compressor is None
            else channel.compressor.tensor_type
        )
        failures, read = 0, []
        for message in replies:
            if message.has_error():
                failures += 1
                log(INFO, "%s: error reply from node %s", layer.label, message.metadata.src_node_id)
                continue
            blocks = layer.algorithm.reply_blocks
            read.append(incoming(message, layer.layout, self.weighted_by_key, blocks, tensor_type))
        accepted, ours, tally = layer.aggregate(server_round, read, failures)
        if ours is None:
            return None, plain_metrics(tally.counts)
        contents = [reply.raw for reply in accepted]
        metrics = merge_metrics(self.train_metrics_aggr_fn, contents, self.weighted_by_key, ours)
        z_new = self._model_record()
        before = None if sent is None else (a.numpy() for a in sent.values())
        after = (a.numpy() for a in z_new.values())  # z^k sent, z' returned: a tensor at a time
        layer.close(server_round, metrics, before, after, ours)
        return z_new, metrics

    def _model_record(self) -> ArrayRecord:
        model, layout = self.round.algorithm.model(), self.round.layout
        assert model is not None and layout is not None
        self._returned = to_record(model, layout)
        return self._returned

    def _resumed(self, arrays: ArrayRecord) -> ArrayRecord:
        """Return the checkpoint's z, after checking `arrays` has its names and shapes."""
        saved, given = self.round.layout, layout_of(arrays)
        assert saved is not None
        if (given.names, given.shapes) != (saved.names, saved.shapes):
            raise ValueError(
                f"initial_arrays: tensors {list(given.names)} of shapes {list(given.shapes)} "
                f"differ from the checkpoint's {list(saved.names)} of shapes {list(saved.shapes)}"
            )
        return self.resumed_arrays()

    def resumed_arrays(self) -> ArrayRecord:
        """Return the resumed z as the record the next round broadcasts.

        Pass it to ``start`` as `initial_arrays` after a resume, so that round 0's
        evaluation sees the checkpoint's z rather than a fresh model's.
        """
        return self._model_record()

    # --------------------------------------------------------------- evaluate
    def configure_evaluate(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> list[Message]:
        """Send z and a copy of `config` (with ``server-round``) to sampled nodes."""
        if self.fraction_evaluate == 0.0:
            return []
        server_round += self.round.offset
        size = (self.fraction_evaluate, self.min_evaluate_nodes)
        sampled = self._sample(grid, server_round, *size)
        node_config = ConfigRecord({**copy_config(config), MESSAGE_SERVER_ROUND: server_round})
        content = RecordDict({self.arrayrecord_key: arrays, self.configrecord_key: node_config})
        return [
            Message(
                content,
                dst_node_id=n,
                message_type=MessageType.EVALUATE,
                group_id=str(server_round),
            )
            for n in sampled
        ]

    def aggregate_evaluate(
        self, server_round: int, replies: Iterable[Message]
    ) -> MetricRecord | None:
        """Aggregate the replies with one MetricRecord and a positive weight; never raise."""
        key = self.weighted_by_key
        usable = [m.content for m in replies if not m.has_error() and has_weight(m, key)]
        if not usable:
            return None
        try:
            return self.evaluate_metrics_aggr_fn(usable, self.weighted_by_key)
        except Exception as error:  # a user function must not end the run
            log(WARNING, "%s: evaluate_metrics_aggr_fn failed (%r)", self.round.label, error)
            return None

    def _sample(
        self, grid: Grid, server_round: int, fraction: float, minimum: int, train: bool = False
    ) -> list[int]:
        """Wait for the nodes, THEN size the sample from those connected; draw it."""
        node_ids = wait_for_nodes(grid, max(self.min_available_nodes, minimum))
        size = max(int(len(node_ids) * fraction), minimum)
        if train:
            self.round.connect(node_ids)
        layer = self.round
        if layer.clients.identify and size < len(node_ids) and layer.sampling_seed is not None:
            known = layer.binding.key_of.keys() | self._asked
            unknown = [n for n in node_ids if str(n) not in known]
            self._announced.update(ask_keys(grid, unknown))  # serverapp.identity
            self._asked.update(str(n) for n in unknown)
        return layer.sample(node_ids, size, server_round, self._announced)
