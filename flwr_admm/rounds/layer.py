"""The round layer: what every strategy does around its math, for both Flower APIs.

One `RoundLayer` per strategy holds the strategy's `Algorithm` (its math and state:
server-held FedADMM, client-held duals, SCAFFOLD, FedDyn, FedNova) and runs, wire
neutral, what they share:

- configure: adopt the model z^k, evict stale keys, draw the seeded sample (nodes
  ordered by client key, `flwr_admm.rounds.identity`), each node's `Instruction`;
- aggregate: file every reply under its client key (`client_key_of`), let the
  algorithm read it, settle who may speak for each key (`KeyBinding.admit`: one
  duplicate-key policy), evict, fold the admitted replies in natural key order and
  take the server step; count failures, rejections, key conflicts and evictions;
- close: the round's history entry, the divergence watchdog (`flwr_admm.core.health`)
  and the checkpoint (`flwr_admm.rounds.checkpoint`).

A translator (`flwr_admm.serverapp.strategy`, `flwr_admm.server.strategy`) only moves
Flower's records in and out (`flwr_admm.rounds.exchange`).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace
from logging import INFO, WARNING
from pathlib import Path
from typing import Any

from flwr.common import Scalar
from flwr.common.logger import log
from numpy.typing import NDArray

from flwr_admm.core.health import ADMM_ADVICE, DEFAULT_HEALTH, HealthCheck, RunHealth
from flwr_admm.core.kernels import single_thread_blas
from flwr_admm.core.types import Arrays
from flwr_admm.options import Checkpointing, ClientPolicy, option
from flwr_admm.protocol import (
    NUM_EVICTED,
    NUM_FAILURES,
    NUM_REJECTED,
    OBJECTIVE,
    PREVIOUS_PRIMAL_RESIDUAL,
    PRIMAL_RESIDUAL,
    ROUND,
    SERVER_ROUND,
)
from flwr_admm.rounds.checkpoint import (
    CheckpointError,
    config_fingerprint,
    has_checkpoint,
    load_matching_checkpoint,
    save_checkpoint,
    strategy_manifest,
)
from flwr_admm.rounds.checks import check_sampling_seed
from flwr_admm.rounds.exchange import Algorithm, Incoming, Instruction, Layout, Tally
from flwr_admm.rounds.identity import KeyBinding, client_key_of, sample_ids

__all__ = ["RoundLayer", "watch_round"]


class RoundLayer:
    """Sampling, identity, admission, reports, the watchdog and checkpoints of a strategy.

    Parameters
    ----------
    sampling_seed, clients, checkpoint, health
        As in `flwr_admm.serverapp.FedADMM`; the watchdog only reads.
    stop_on_convergence : bool
        Sample no node once the algorithm reports convergence.
    settings : dict
        The translator's own settings that change the iterates (fingerprinted).
    advice : str
        What the watchdog's error suggests trying (`flwr_admm.core.health.RunHealth`).

    """

    def __init__(
        self,
        algorithm: Algorithm,
        *,
        sampling_seed: int | None = 0,
        clients: ClientPolicy | None = None,
        checkpoint: Checkpointing | None = None,
        health: HealthCheck | None = DEFAULT_HEALTH,
        stop_on_convergence: bool = False,
        settings: Mapping[str, Any] | None = None,
        advice: str = ADMM_ADVICE,
    ) -> None:
        check_sampling_seed(sampling_seed)
        self.algorithm = algorithm
        self.label = algorithm.label
        self.sampling_seed = None if sampling_seed is None else int(sampling_seed)
        self.clients = (
            ClientPolicy() if clients is None else option("clients", clients, ClientPolicy)
        )
        self.checkpoint = (
            None if checkpoint is None else option("checkpoint", checkpoint, Checkpointing)
        )
        self.stop_on_convergence = bool(stop_on_convergence)
        self.settings_of_api = dict(settings or {})
        self.binding = KeyBinding(self.clients.key_binding)
        self.health_state = RunHealth.of(health, self.label, advice)
        self.layout: Layout | None = None
        self.history: list[dict[str, Any]] = []
        self.converged = False
        self.last_round = 0
        self.offset = 0  # rounds done before a resume
        self.clock = 0  # rounds begun, continuing after a resume
        self.evicted = 0  # keys evicted since this round's configure step
        self.restored = False  # a checkpoint was loaded and its model not yet sent
        self.configured = False  # configure ran: the replies' instructions exist
        self.population = 0  # nodes connected at the last train sampling
        self.num_sent = 0  # instructions of the open round (replies may never come)
        self._tally = (0, 0, 0)  # the last aggregation's replies accepted, rejected, failed

    def resume(self) -> None:
        """Load the checkpoint, if `checkpoint` says to resume and one is there."""
        spec = self.checkpoint
        if spec is not None and spec.resume and has_checkpoint(spec.path):
            self.load(spec.path)

    # -------------------------------------------------------------- configure
    def configure(self, server_round: int, z: Arrays | None, layout: Layout | None) -> int:
        """Open round `server_round`: adopt z^k (None: the resumed model), evict stale keys.

        Returns the round number continued after a resume.
        """
        if z is not None:
            if self.layout is None:
                assert layout is not None
                self.layout = layout
            self.algorithm.adopt(z, self.layout)
        self.restored = False
        self.configured = True
        self.clock += 1
        self.evicted = 0
        self.num_sent = 0
        policy = self.clients
        stale = self.binding.stale(self.clock, policy.max_age, policy.max_count)
        if stale:
            self.evict(stale, "stale: beyond max_age or max_count (ClientPolicy)")
        return server_round + self.offset

    def stopped(self) -> bool:
        """Return whether no node is sampled any more (converged, ``stop_on_convergence``)."""
        if self.stop_on_convergence and self.converged:
            log(INFO, "%s: converged (r <= eps_pri, s <= eps_dual); no nodes sampled", self.label)
            return True
        return False

    def connect(self, nodes: Sequence[Any]) -> None:
        """Tell the key binding who is connected at this train sampling.

        A key whose node is gone may then be taken over by a new node
        (`KeyBinding.connected`); the count is the population a privacy ledger needs.
        """
        self.binding.connected(str(n) for n in nodes)
        self.population = len(nodes)

    def sample(
        self,
        nodes: Sequence[Any],
        size: int,
        server_round: int,
        announced: Mapping[str, str] | None = None,
    ) -> list[Any]:
        """Draw `size` of the connected `nodes` (all if fewer), ordered by client key.

        `announced`: keys nodes named before their first reply (order only; bound keys win).
        """
        key_of = {**announced, **self.binding.key_of} if announced else self.binding.key_of
        sampled = sample_ids(nodes, size, server_round, self.sampling_seed, key_of)
        log(INFO, "%s: sampled %s nodes (out of %s)", self.label, len(sampled), len(nodes))
        return sampled

    def instructions(
        self, nodes: Sequence[Any], server_round: int, user: Mapping[str, Scalar]
    ) -> list[Instruction]:
        """Return each sampled node's instruction; its config: the user's, then ours."""
        common = {**user, **self.algorithm.round_config(len(nodes), self.population)}
        out = []
        for node in nodes:
            own = self.algorithm.instruction(str(node), self.binding.key_of.get(str(node)))
            config = {**common, **own.config, SERVER_ROUND: server_round}
            out.append(replace(own, config=config))
        self.num_sent = len(out)
        return out

    # -------------------------------------------------------------- aggregate
    def aggregate(
        self, server_round: int, replies: Iterable[Incoming], failures: int
    ) -> tuple[list[Incoming], dict[str, Scalar] | None, Tally]:
        """Read, admit and fold the replies; take the server step.

        Returns the accepted replies, the round metrics (None when no reply was
        accepted: the state is unchanged) and the round's `Tally` (with the idle
        metrics in its counts then). `failures` counts the error replies.
        """
        server_round += self.offset
        algorithm = self.algorithm
        tally = Tally(self.label, algorithm.counters)
        tally.add(NUM_FAILURES, failures)
        received, readable = failures, []
        for reply in replies:
            received += 1
            key, value = self._read(reply, tally)
            if value is not None:
                readable.append((replace(reply, key=key), value))
        keyed = [(r.key, _Sender(r.node), (r, v)) for r, v in readable]
        admitted, freed = self.binding.admit(keyed, tally.reject)
        ordered = [item for _, _, item in admitted]
        admits = getattr(algorithm, "admits", None)
        dropped = admits is not None and not admits(ordered, freed, server_round, tally)
        if dropped:  # the round refused whole: nothing evicted, nothing folded
            ordered, admitted, freed = [], [], []
        if freed:
            self.evict(freed, "their nodes left the federation; new nodes start fresh")
        incoming = [key for key, _, _ in admitted]
        stale = self.binding.stale
        crowded = [] if dropped else stale(self.clock, None, self.clients.max_count, incoming)
        if crowded:
            self.evict(crowded, "stale: their nodes left, or least recently heard beyond max_count")
        with single_thread_blas():
            folded = algorithm.fold(ordered, server_round, tally)
        accepted = []
        for key, node in tally.rebound:
            self.binding.bind(key, node, self.clock)
        for (reply, _), ok in zip(ordered, folded, strict=True):
            if ok:
                self.binding.bind(reply.key, reply.node, self.clock)
                accepted.append(reply)
        tally.counts[NUM_EVICTED] = self.evicted
        lost = max(0, self.num_sent - received)  # late replies are simply absent
        self.num_sent = 0
        self._tally = (len(accepted), tally.counts[NUM_REJECTED], failures + lost)
        if not accepted:
            log(WARNING, "%s round %s: no usable reply; state unchanged", self.label, server_round)
            tally.counts.update(algorithm.discard())  # type: ignore[arg-type]
            watch_round(self.health_state, server_round, self._tally)
            return [], None, tally
        own, self.converged = algorithm.finish(server_round)
        return accepted, {**own, **tally.counts}, tally

    def _read(self, reply: Incoming, tally: Tally) -> tuple[str, Any]:
        """Return a reply's client key and the algorithm's reading (None: rejected)."""
        key, problem = f"cid:{reply.node}", None
        try:
            key = client_key_of(reply.node, reply.metrics)
        except ValueError as error:  # a key of the wrong type or size
            problem = f"unusable client key: {error}"
        except Exception as error:  # a malformed reply must not stop the server
            problem = f"unreadable reply ({error!r})"
        problem = reply.problem or problem
        if problem is None:
            try:
                value, problem = self.algorithm.read(replace(reply, key=key))
            except Exception as error:  # a malformed reply must not stop the server
                value, problem = None, f"unreadable reply ({error!r})"
        if problem is not None:
            tally.reject(key, problem)
            return key, None
        return key, value

    def idle(self, server_round: int, failed: int) -> None:
        """Hand the watchdog a round whose replies were all dropped (nothing aggregated)."""
        self.num_sent = 0
        watch_round(self.health_state, server_round + self.offset, (0, 0, failed))

    def close(
        self,
        server_round: int,
        metrics: Mapping[str, Any],
        before: Iterable[NDArray[Any]] | None,
        after: Iterable[NDArray[Any]] | None,
        own: Mapping[str, Any],
    ) -> None:
        """Record an aggregated round: history, the watchdog (z^k sent, z'), the checkpoint."""
        server_round += self.offset
        self.history.append({ROUND: server_round, **metrics})
        self.last_round = server_round
        watch_round(self.health_state, server_round, self._tally, before, after, own)
        spec = self.checkpoint
        if spec is not None and server_round % spec.every == 0:
            self.save(spec.path)

    def evict(self, keys: list[str], reason: str) -> None:
        """Drop the state and the bindings of `keys`; count them."""
        shown = keys if len(keys) <= 10 else f"{len(keys)} keys"
        log(INFO, "%s: evicted %s (%s)", self.label, shown, reason)
        self.evicted += self.algorithm.evict(keys)
        self.binding.forget(keys)

    # ------------------------------------------------------------- checkpoints
    def settings(self) -> dict[str, Any]:
        """Return every setting that changes the iterates: what a checkpoint must match."""
        return {
            **self.algorithm.configuration(),
            **self.settings_of_api,
            "sampling_seed": self.sampling_seed,
            "stop_on_convergence": self.stop_on_convergence,
            **self.clients.describe(),
        }

    def fingerprint(self) -> str:
        """Return the SHA-256 of `settings`, the value a checkpoint must match."""
        return config_fingerprint(self.settings())

    def save(self, path: str | os.PathLike[str]) -> Path:
        """Write the full server state to directory `path` (atomic, checksummed, no pickle)."""
        if self.layout is None or self.algorithm.model() is None:
            raise CheckpointError("checkpoint: nothing to save before the first round")
        arrays, own = self.algorithm.state_dict()
        layout = self.layout.describe()
        manifest = strategy_manifest(
            self.settings(),
            layout.pop("dtypes"),
            self.binding.state_dict(),
            self.clock,
            self.converged,
            {**layout, **own},
        )
        return save_checkpoint(path, arrays, manifest, self.last_round)

    def load(self, path: str | os.PathLike[str]) -> int:
        """Restore the server state from directory `path`; return its round."""
        arrays, manifest = load_matching_checkpoint(path, self.settings())
        binding = KeyBinding(self.clients.key_binding)
        try:
            layout = Layout.from_description(manifest)
            binding.load_state_dict(manifest["binding"])
            clock, last_round = int(manifest["clock"]), int(manifest["round"])
            self.algorithm.load_state_dict(arrays, manifest, layout)
        except (KeyError, TypeError, ValueError, AttributeError) as error:
            raise CheckpointError(f"checkpoint: {path} is incomplete ({error!r})") from error
        self.layout, self.binding, self.clock = layout, binding, clock
        self.converged = bool(manifest.get("converged", False))
        self.last_round = self.offset = last_round
        self.restored = True
        log(INFO, "%s: resumed from %s at round %s", self.label, path, last_round)
        return last_round


class _Sender:
    """A node id as `KeyBinding.admit` reads it (`flwr_admm.rounds.identity.Sender`)."""

    __slots__ = ("cid",)

    def __init__(self, cid: str) -> None:
        self.cid = cid


def watch_round(
    health: RunHealth | None,
    server_round: int,
    counts: tuple[int, int, int],
    before: Iterable[NDArray[Any]] | None = None,
    after: Iterable[NDArray[Any]] | None = None,
    metrics: Mapping[str, Any] | None = None,
) -> None:
    """Feed one round to the divergence watchdog (`flwr_admm.core.health`; None: off).

    `counts` are the replies accepted, rejected and failed (or lost); `before` and
    `after` the model sent and the one returned, tensor by tensor (read once; None:
    nothing aggregated); the primal residual (client-held duals: the delayed one) and
    the objective come from the round's `metrics`. Raises `RunDivergedError` when the
    run diverged or stalled.
    """
    if health is None:
        return
    metrics = metrics or {}
    residual = metrics.get(PRIMAL_RESIDUAL, metrics.get(PREVIOUS_PRIMAL_RESIDUAL))
    accepted, rejected, failed = counts
    health.observe(
        server_round,
        accepted=accepted,
        rejected=rejected,
        failed=failed,
        before=before,
        after=after,
        primal_residual=residual,
        objective=metrics.get(OBJECTIVE),
    )
