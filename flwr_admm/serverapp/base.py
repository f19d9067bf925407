"""The round skeleton shared by the Message-API `FedADMM` and `FedADMMClientDuals`.

`ConsensusStrategy` (Message API) runs what both consensus-ADMM strategies do around
their math, as the legacy `flwr_admm.server.base.ConsensusStrategy` does for the legacy
API: keyword checks, waiting for nodes and seeded sampling, client identity
(``key_binding``) and eviction (``max_client_age``, ``max_clients``), keyed and ordered
reply folding that rejects and counts bad replies instead of ending the run, round
records, evaluation, checkpoints (``checkpoint_dir``, ``checkpoint_every``,
``resume``; the legacy file format, `flwr_admm.rounds.checkpoint`) and the divergence
watchdog (``health``, `flwr_admm.core.health`). A strategy fills in
the hooks (`_adopt`, `_train_messages`, `_read`, `_open_round`, `_fold_reply`,
`_finish_round`, `_discard_round`, `_evict`, `_state_dict`, ...).
"""

from __future__ import annotations

import os
from abc import abstractmethod
from collections.abc import Iterable
from functools import partial
from logging import INFO, WARNING
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Message, MessageType, MetricRecord, RecordDict
from flwr.common.logger import log
from flwr.serverapp import Grid
from flwr.serverapp.strategy import FedAvg
from numpy.typing import NDArray

from flwr_admm.core.health import DEFAULT_HEALTH, HealthCheck, RunHealth
from flwr_admm.protocol import (
    MESSAGE_SERVER_ROUND,
    NUM_EVICTED,
    NUM_FAILURES,
    NUM_KEY_CONFLICTS,
    NUM_REJECTED,
    ROUND,
)
from flwr_admm.rounds.checkpoint import (
    CheckpointError,
    checkpoint_every_value,
    config_fingerprint,
    has_checkpoint,
    load_matching_checkpoint,
    save_checkpoint,
    strategy_manifest,
)
from flwr_admm.rounds.identity import KeyBinding, optional_count
from flwr_admm.rounds.report import watch_round
from flwr_admm.rounds.sampling import sample_ids, unconfigured
from flwr_admm.serverapp.config import check_fields, copy_config
from flwr_admm.serverapp.nodes import admit, wait_for_nodes
from flwr_admm.serverapp.records_old import (
    Layout,
    ReadReply,
    has_weight,
    merge_metrics,
    plain_metrics,
)

__all__ = ["ConsensusStrategy"]


class ConsensusStrategy(FedAvg):
    """Run the rounds of a Message-API consensus-ADMM strategy; subclasses supply the math.

    A round: ``configure_train`` adopts z^k (after a resume: the checkpoint's z),
    evicts stale keys, waits for ``min_available_nodes``, samples (seeded by
    (sampling_seed, round), nodes ordered by key) and lets `_train_messages` build the
    messages; ``aggregate_train`` counts error replies (``num_failures``), reads each
    content reply (`_read`: unusable ones are rejected, ``num_rejected``), settles who
    may speak for each key (`KeyBinding`, ``num_key_conflicts``), evicts beyond
    ``max_clients``, folds the replies in natural key order (`_fold_reply`) and takes
    the z-step (`_finish_round`). Round numbers continue after a resume.

    Before any ``configure_train`` (as Flower's own strategy tests call it, on
    hand-built replies) ``aggregate_train`` raises a ValueError naming
    ``configure_train`` and changes nothing. Not FedAvg's mean instead: a reply's w_i
    means something only against the center configure_train sent its node (folded
    without one it corrupts the duals), and a mean returned beside an unchanged state
    is a model the state does not describe (the next round would adopt it as z).

    Health: every round goes to the watchdog (`health`, a `HealthCheck`; None: off):
    a run whose z' is NaN/inf or explodes, whose update norm keeps rising, or that
    accepts no reply (all rejected, failed or lost) for several rounds raises
    `RunDivergedError` from ``aggregate_train`` (before that round's checkpoint), which
    ends ``Strategy.start`` with the message. It only reads: iterates and metrics
    are the same with it off.

    Checkpoints: after every `checkpoint_every` aggregations the state goes to
    `checkpoint_dir` (`flwr_admm.rounds.checkpoint`: atomic, checksummed, settings
    fingerprinted, key bindings kept, plus the model's tensor names, dtypes and
    shapes). With `resume` and a checkpoint there, the strategy starts from it: the
    first ``configure_train`` sends the checkpoint's z (the given arrays must have its
    names and shapes) and ``server-round`` continues from the checkpoint's round.
    """

    label: ClassVar[str] = "ConsensusStrategy"  # in logs and checkpoints
    counters: ClassVar[tuple[str, ...]] = ()  # round counters beyond the shared ones

    def __init__(
        self,
        *,
        fedavg: dict[str, Any],
        stop_on_convergence: bool,
        sampling_seed: int | None,
        checkpoint_dir: str | os.PathLike[str] | None,
        checkpoint_every: int,
        key_binding: str,
        max_client_age: int | None,
        max_clients: int | None,
        health: HealthCheck | None = DEFAULT_HEALTH,
    ) -> None:
        super().__init__(**fedavg)
        check_fields(self, sampling_seed)
        self.binding = KeyBinding(key_binding)
        self.key_binding = self.binding.policy
        self.max_client_age = optional_count(max_client_age, "max_client_age")
        self.max_clients = optional_count(max_clients, "max_clients")
        self.stop_on_convergence = bool(stop_on_convergence)
        self.sampling_seed = None if sampling_seed is None else int(sampling_seed)
        self.checkpoint_every = checkpoint_every_value(checkpoint_every)
        self.checkpoint_dir = None if checkpoint_dir is None else Path(checkpoint_dir)
        self.layout: Layout | None = None
        self.history: list[dict[str, Any]] = []
        self.converged = False
        self.last_round = 0
        self._round_offset = 0  # rounds done before a resume
        self._clock = 0  # rounds begun, continuing after a resume
        self._evicted = 0  # keys evicted since this round's configure_train
        self._restored = False  # a checkpoint was loaded and its z not yet sent
        self._configured = False  # configure_train ran: the replies' centers exist
        self.population = 0  # nodes connected at the last train sampling
        self.health = health
        self.health_state = RunHealth.of(health, self.label)
        self._round_sent: tuple[ArrayRecord | None, int] = (None, 0)  # this round's z^k, messages

    def _resume(self, resume: bool) -> None:
        """Load the checkpoint in `checkpoint_dir` if `resume` (last step of ``__init__``)."""
        if self.checkpoint_dir is not None and resume and has_checkpoint(self.checkpoint_dir):
            self.load_checkpoint(self.checkpoint_dir)

    # ------------------------------------------------------------------ train
    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> list[Message]:
        """Adopt z, evict stale keys, wait for the nodes, sample them, build their messages."""
        user = copy_config(config, check=True)  # Strategy.start reuses `config` every round
        arrays = self._received(arrays)
        self._adopt(arrays)
        self._configured = True
        server_round += self._round_offset
        self._clock += 1
        self._evicted = 0
        self._round_sent = (arrays, 0)
        stale = self.binding.stale(self._clock, self.max_client_age, self.max_clients)
        if stale:
            self._evict_keys(stale, "stale: beyond max_client_age or max_clients")
        if self.stop_on_convergence and self.converged:
            log(INFO, "%s: converged (r <= eps_pri, s <= eps_dual); no nodes sampled", self.label)
            return []
        if self.fraction_train == 0.0:
            return []
        sampled = self._sample(grid, server_round, self.fraction_train, self.min_train_nodes, True)
        messages = self._train_messages(sampled, arrays, user, server_round)
        self._round_sent = (arrays, len(messages))
        return messages

    def _received(self, arrays: ArrayRecord) -> ArrayRecord:
        """Return `arrays`, or right after a resume the checkpoint's z (same names, shapes)."""
        if not self._restored:
            return arrays
        self._restored = False
        assert self.layout is not None
        given = Layout.of(arrays)
        if (given.names, given.shapes) != (self.layout.names, self.layout.shapes):
            raise ValueError(
                f"initial_arrays: tensors {list(given.names)} of shapes {list(given.shapes)} "
                f"differ from the checkpoint's {list(self.layout.names)} of shapes "
                f"{list(self.layout.shapes)}"
            )
        return self.resumed_arrays()

    def aggregate_train(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """Fold the usable replies in client-key order; return z' and the round metrics.

        Raises ValueError before any ``configure_train`` (class docstring).
        """
        if not self._configured:
            raise unconfigured(self.label, "aggregate_train", "configure_train")
        server_round += self._round_offset
        counts = {NUM_FAILURES: 0, NUM_REJECTED: 0, NUM_KEY_CONFLICTS: 0, NUM_EVICTED: 0}
        counts.update(dict.fromkeys(self.counters, 0))
        (sent, num_sent), self._round_sent = self._round_sent, (None, 0)  # this round only
        usable: list[ReadReply] = []
        received = 0
        for message in replies:
            received += 1
            if message.has_error():
                counts[NUM_FAILURES] += 1
                log(INFO, "%s: error reply from node %s", self.label, message.metadata.src_node_id)
                continue
            reply = self._read(message)
            if reply.problem is None:
                usable.append(reply)
            else:
                self._reject(reply.key, reply.problem, counts)
        admitted, freed = admit(usable, self.binding, partial(self._refuse, counts))
        if freed:
            self._evict_keys(freed, "their nodes left the federation; new nodes start fresh")
        incoming = [r.key for r in admitted]
        crowded = self.binding.stale(self._clock, None, self.max_clients, incoming)
        if crowded:
            self._evict_keys(crowded, "least recently heard beyond max_clients")
        self._open_round(incoming)
        accepted = []
        for r, folded in zip(admitted, self._fold_all(admitted, server_round, counts), strict=True):
            if folded:
                self.binding.bind(r.key, str(r.node_id), self._clock)
                accepted.append(r)
        counts[NUM_EVICTED] = self._evicted
        lost = max(0, num_sent - received)  # late replies are simply absent
        tally = (len(accepted), counts[NUM_REJECTED], counts[NUM_FAILURES] + lost)
        if not accepted:
            log(WARNING, "%s round %s: no usable reply; state unchanged", self.label, server_round)
            idle = plain_metrics({**counts, **self._discard_round()})
            watch_round(self.health_state, server_round, tally)
            return None, idle
        contents = [r.content for r in accepted if r.content is not None]
        ours = {**self._finish_round(server_round), **counts}
        metrics = merge_metrics(self.train_metrics_aggr_fn, contents, self.weighted_by_key, ours)
        self.history.append({ROUND: server_round, **metrics})
        self.last_round = server_round
        z_new = self._broadcast()
        if self.health_state is not None:  # z^k sent, z' returned: read a tensor at a time
            before = None if sent is None else (a.numpy() for a in sent.values())
            after = (a.numpy() for a in z_new.values())
            watch_round(self.health_state, server_round, tally, before, after, ours)
        if self.checkpoint_dir is not None and server_round % self.checkpoint_every == 0:
            self.save_checkpoint(self.checkpoint_dir)
        return z_new, metrics

    def _fold_all(
        self, replies: list[ReadReply], server_round: int, counts: dict[str, int]
    ) -> list[bool]:
        """Fold the admitted replies in order, `_fold_reply` each; which were folded."""
        return [self._fold_reply(r, server_round, counts) for r in replies]

    def _evict_keys(self, keys: list[str], reason: str) -> None:
        """Drop the state and the bindings of `keys` (`_evict`); count them."""
        shown = keys if len(keys) <= 10 else f"{len(keys)} keys"
        log(INFO, "%s: evicted %s (%s)", self.label, shown, reason)
        self._evicted += self._evict(keys)
        self.binding.forget(keys)

    def _reject(self, key: str, problem: str, counts: dict[str, int]) -> None:
        log(WARNING, "%s: rejected reply of %s: %s", self.label, key, problem)
        counts[NUM_REJECTED] += 1

    def _refuse(self, counts: dict[str, int], key: str, problem: str, conflict: bool) -> None:
        """Reject a reply `KeyBinding.admit` refused; count key conflicts too."""
        self._reject(key, problem, counts)
        counts[NUM_KEY_CONFLICTS] += int(conflict)

    # --------------------------------------------------------------- evaluate
    def configure_evaluate(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> list[Message]:
        """Send z and a copy of `config` (with ``server-round``) to sampled nodes."""
        if self.fraction_evaluate == 0.0:
            return []
        server_round += self._round_offset
        sampled = self._sample(grid, server_round, self.fraction_evaluate, self.min_evaluate_nodes)
        node_config = ConfigRecord({**copy_config(config), MESSAGE_SERVER_ROUND: server_round})
        content = RecordDict({self.arrayrecord_key: arrays, self.configrecord_key: node_config})
        return [
            Message(  # group_id: SuperNodes log "[RUN r, ROUND k]" as in legacy
                content=content,
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
            log(WARNING, "%s: evaluate_metrics_aggr_fn failed (%r)", self.label, error)
            return None

    def _sample(
        self, grid: Grid, server_round: int, fraction: float, minimum: int, train: bool = False
    ) -> list[int]:
        """Wait for the nodes, THEN size the sample from those connected; draw it.

        A train round also tells the key binding who is connected (a key whose node
        is gone may then be taken over by a new node).
        """
        node_ids = wait_for_nodes(grid, max(self.min_available_nodes, minimum))
        size = max(int(len(node_ids) * fraction), minimum)
        if train:
            self.binding.connected(str(n) for n in node_ids)
            self.population = len(node_ids)  # for a privacy ledger's sampling rate
        key_of = self.binding.key_of
        sampled = sample_ids(node_ids, size, server_round, self.sampling_seed, key_of)
        log(INFO, "%s: sampled %s nodes (out of %s)", self.label, len(sampled), len(node_ids))
        return sampled

    # ------------------------------------------------------------- checkpoints
    def settings(self) -> dict[str, Any]:
        """Return every setting that changes the iterates: what a checkpoint must match."""
        return {
            **self.configuration(),
            "api": "message",
            "sampling_seed": self.sampling_seed,
            "fraction_train": float(self.fraction_train),
            "min_train_nodes": int(self.min_train_nodes),
            "stop_on_convergence": self.stop_on_convergence,
            "key_binding": self.key_binding,
            "max_client_age": self.max_client_age,
            "max_clients": self.max_clients,
        }

    def fingerprint(self) -> str:
        """Return the SHA-256 of `settings`, the value a checkpoint must match."""
        return config_fingerprint(self.settings())

    def save_checkpoint(self, path: str | os.PathLike[str]) -> Path:
        """Write the full server state to directory `path` (atomic, checksummed, no pickle)."""
        if self.layout is None:
            raise CheckpointError("checkpoint: nothing to save before the first round")
        arrays, own = self._state_dict()
        layout = {"names": list(self.layout.names), "shapes": [list(s) for s in self.layout.shapes]}
        manifest = strategy_manifest(
            self.settings(),
            self.layout.dtypes,
            self.binding.state_dict(),
            self._clock,
            self.converged,
            {**layout, **own},
        )
        return save_checkpoint(path, arrays, manifest, self.last_round)

    def load_checkpoint(self, path: str | os.PathLike[str]) -> int:
        """Restore the server state from directory `path`; return its round."""
        arrays, manifest = load_matching_checkpoint(path, self.settings())
        binding = KeyBinding(self.key_binding)
        try:
            names = tuple(str(n) for n in manifest["names"])
            dtypes = tuple(np.dtype(d) for d in manifest["dtypes"])
            shapes = tuple(tuple(int(s) for s in shape) for shape in manifest["shapes"])
            if not len(names) == len(dtypes) == len(shapes):
                raise ValueError("names, dtypes and shapes disagree")
            binding.load_state_dict(manifest["binding"])
            clock, last_round = int(manifest["clock"]), int(manifest["round"])
            self.layout = Layout(names, dtypes, shapes)
            self._load_state_dict(arrays, manifest)
        except (KeyError, TypeError, ValueError, AttributeError) as error:
            self.layout = None
            raise CheckpointError(f"checkpoint: {path} is incomplete ({error!r})") from error
        self.binding, self._clock = binding, clock
        self.converged = bool(manifest.get("converged", False))
        self.last_round = self._round_offset = last_round
        self._restored = True
        log(INFO, "%s: resumed from %s at round %s", self.label, path, last_round)
        return last_round

    # ------------------------------------------------------------------ hooks
    @abstractmethod
    def _adopt(self, arrays: ArrayRecord) -> None:
        """Take the broadcast `arrays` as z^k (the first call fixes `layout`)."""

    def resumed_arrays(self) -> ArrayRecord:
        """Return the resumed z as the record the next round broadcasts.

        Pass it to ``start`` as `initial_arrays` after a resume, so that round 0's
        evaluation sees the checkpoint's z rather than a fresh model's.
        """
        return self._broadcast()

    @abstractmethod
    def _train_messages(
        self, sampled: list[int], arrays: ArrayRecord, user: dict[str, Any], server_round: int
    ) -> list[Message]:
        """Build the train message of every sampled node (a list, never a generator)."""

    @abstractmethod
    def _read(self, message: Message) -> ReadReply:
        """Read one content reply, or say why it is unusable (never raise)."""

    @abstractmethod
    def _open_round(self, keys: list[str]) -> None:
        """Prepare to fold in the replies of `keys` (in this order)."""

    @abstractmethod
    def _fold_reply(self, reply: ReadReply, server_round: int, counts: dict[str, int]) -> bool:
        """Fold one admitted reply into the round; False if rejected."""

    @abstractmethod
    def _discard_round(self) -> dict[str, Any]:
        """Close a round without usable reply; return its idle metrics."""

    @abstractmethod
    def _finish_round(self, server_round: int) -> dict[str, Any]:
        """Update z from the folded replies; set `converged`; return the round metrics."""

    @abstractmethod
    def _broadcast(self) -> ArrayRecord:
        """Return z' as the ArrayRecord the next round sends (the layout's names, dtypes)."""

    @abstractmethod
    def _evict(self, keys: list[str]) -> int:
        """Forget `keys` between rounds (their state leaves the sums); return how many."""

    @abstractmethod
    def configuration(self) -> dict[str, Any]:
        """Return the strategy's own settings a checkpoint must agree with (JSON)."""

    @abstractmethod
    def _state_dict(self) -> tuple[dict[str, NDArray[Any]], dict[str, Any]]:
        """Return the strategy's own checkpoint arrays and manifest entries."""

    @abstractmethod
    def _load_state_dict(self, arrays: dict[str, NDArray[Any]], manifest: dict[str, Any]) -> None:
        """Restore the strategy's own state (`layout` is set); raise KeyError/ValueError."""
