"""The round skeleton shared by `FedADMM` and `FedADMMClientDuals`.

`ConsensusStrategy` runs what both consensus-ADMM strategies do around their math:
keyword checks, seeded sampling, the fit config, client identity and eviction, keyed
and ordered reply folding, round records, checkpoints and the divergence watchdog
(``health``, `flwr_admm.core.health`). A strategy fills in the
hooks (`_adopt`, `_fit_instructions`, `_fold_reply`, `_finish_round`, `_evict`, ...),
the way Flower's FedProx overrides one method of FedAvg.
"""

from __future__ import annotations

import os
from abc import abstractmethod
from logging import INFO, WARNING
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
from flwr.common import (
    FitIns,
    FitRes,
    Parameters,
    Scalar,
    bytes_to_ndarray,
    parameters_to_ndarrays,
)
from flwr.common.logger import log
from flwr.server.client_manager import ClientManager
from flwr.server.client_proxy import ClientProxy
from flwr.server.strategy import FedAvg
from numpy.typing import NDArray

from flwr_admm.core.health import DEFAULT_HEALTH, HealthCheck, RunHealth
from flwr_admm.core.kernels import single_thread_blas
from flwr_admm.core.types import Arrays
from flwr_admm.protocol import (
    NUM_EVICTED,
    NUM_FAILURES,
    NUM_KEY_CONFLICTS,
    NUM_REJECTED,
    SERVER_ROUND,
)
from flwr_admm.rounds.checkpoint import (
    CheckpointError,
    checkpoint_every_value,
    config_fingerprint,
    has_checkpoint,
    load_matching_checkpoint,
    save_checkpoint,
    shared_settings,
    strategy_manifest,
)
from flwr_admm.rounds.identity import KeyBinding, client_key_of, optional_count
from flwr_admm.rounds.report import watch_round
from flwr_admm.rounds.sampling import unconfigured
from flwr_admm.server.sampling import (
    KeyedReply,
    check_flower_fields,
    check_user_config,
    keyed_replies,
    record_round,
    reject_reply,
)
from flwr_admm.uplink.channel import UplinkChannel

Results = list[tuple[ClientProxy, FitRes]]
Failures = list[tuple[ClientProxy, FitRes] | BaseException]


class ConsensusStrategy(FedAvg):
    """Run the rounds of a consensus-ADMM strategy; subclasses supply the algorithm.

    A round: ``configure_fit`` evicts stale client keys, adopts the broadcast z,
    samples clients (seeded by (sampling_seed, round), clients ordered by key) and lets
    `_fit_instructions` build their FitIns; ``aggregate_fit`` keys every reply by the
    client's ``client-key``, else ``partition-id``, else cid (`client_key_of`; a key of
    the wrong type or size rejects that reply only), settles who may speak for each key
    (`KeyBinding`), and folds the replies in one at a time, in natural key order
    (deterministic sums), through `_fold_reply`; `_finish_round` then updates z.
    Round numbers continue after a resume. Before any ``configure_fit``,
    ``aggregate_fit`` raises ValueError naming ``configure_fit`` and changes nothing
    (why not FedAvg's mean: `flwr_admm.serverapp.base.ConsensusStrategy`).

    Identity (``key_binding``, `flwr_admm.rounds.identity`). ``"node"`` (default): a
    key is accepted only from the node (cid) it was first accepted from, and a node
    speaks for one key; any other claim is rejected (``num_key_conflicts``), the
    owner untouched, unless the owner has left the federation (it was not among
    ``client_manager.all()`` for more than ``ABSENT_GRACE`` samplings in a row): then
    the key's state is evicted and the key starts fresh under its new node. So an
    insecure SuperNode that restarts (new node id) rejoins as a new client after the
    grace, an authenticated one (same node id) keeps its state, and nobody receives a
    connected or briefly absent node's center or writes its state. ``"authenticated"``:
    as ``"node"`` but a key is never rebound (for SuperNode authentication, where a
    node id is fixed by its registered key and survives restarts): no node takes over
    an absent node's key; the key is freed only by eviction. ``"reported"``: reported
    keys are trusted (a returning key keeps its state under any node id): trusted only.

    Duplicate keys: replies of one round that share a key are all rejected, except
    that under ``"node"``/``"authenticated"`` a single reply from the key's own node
    is kept (the others are conflicts); no two replies ever touch one client's state
    in a round.

    Eviction: at ``configure_fit``, keys whose node has left (policies ``"node"``,
    ``"reported"``; `flwr_admm.rounds.identity`) or whose last accepted reply is more
    than ``max_client_age`` rounds old are evicted, then the least recently heard beyond
    ``max_clients`` keys (ties in key order); at ``aggregate_fit`` again beyond
    ``max_clients``, counting the round's replies as heard (they are never evicted in
    their own round, so a round with more replies than ``max_clients`` holds them all
    until the next). An evicted key's contribution leaves the sums (`_evict`), and its
    node, if it returns, starts fresh. ``num_evicted`` counts them.

    Fit config and metrics: ``on_fit_config_fn`` may not return a key the strategy
    sets itself (``rho``, ``proximal_mu``, ``server_round``, ``admm-*``, ``uplink*``,
    ``dp-*``): ValueError naming it. ``fit_metrics_aggregation_fn`` sees the accepted
    replies only; a name it returns that the strategy also reports is logged as a
    warning and the strategy's value is kept, and the identity and protocol keys it
    returns (``client-key``, ``partition-id``, ``num-examples``, ``admm-*``) are dropped.

    Health: every round goes to the watchdog (`health`, a `HealthCheck`; None: off).
    A run whose z' is NaN/inf or explodes, whose update norm keeps rising, or that
    accepts no reply (all rejected or failed) for several rounds raises
    `RunDivergedError` from ``aggregate_fit`` (before that round's checkpoint).
    Flower's legacy ``Server.fit`` has no try/except around ``aggregate_fit``: the
    error ends the run (``start_grid`` / the ServerApp) with the message. It only
    reads: iterates and metrics are the same with it off.

    Checkpoints: `settings` (the shared settings plus the strategy's `configuration`)
    is fingerprinted; a checkpoint written under other settings is refused with a
    `CheckpointError` naming the differing fields. Bindings and last-heard rounds are
    saved with the state.
    """

    label: ClassVar[str] = "ConsensusStrategy"  # in logs
    counters: ClassVar[tuple[str, ...]] = ()  # round counters beyond failures/rejected

    def __init__(
        self,
        *,
        channel: UplinkChannel,
        stop_on_convergence: bool,
        sampling_seed: int | None,
        checkpoint_dir: str | os.PathLike[str] | None,
        checkpoint_every: int,
        key_binding: str = "node",
        max_client_age: int | None = None,
        max_clients: int | None = None,
        health: HealthCheck | None = DEFAULT_HEALTH,
        **fedavg_kwargs: Any,
    ) -> None:
        super().__init__(**fedavg_kwargs)
        check_flower_fields(self, sampling_seed)
        self.binding = KeyBinding(key_binding)
        self.key_binding = self.binding.policy
        self.max_client_age = optional_count(max_client_age, "max_client_age")
        self.max_clients = optional_count(max_clients, "max_clients")
        self.channel = channel
        self.stop_on_convergence = stop_on_convergence
        self.sampling_seed = None if sampling_seed is None else int(sampling_seed)
        self.history: list[dict[str, Scalar]] = []
        self.converged = False
        self.last_round = 0
        self._round_offset = 0  # rounds done before a resume
        self._clock = 0  # rounds begun (configure_fit calls), continuing after a resume
        self._evicted = 0  # keys evicted since this round's configure_fit
        self._configured = False  # configure_fit ran: the replies' centers exist
        self._dtypes: list[np.dtype[Any]] = []  # of the broadcast z, kept on the wire
        self.checkpoint_every = checkpoint_every_value(checkpoint_every)
        self.checkpoint_dir = None if checkpoint_dir is None else Path(checkpoint_dir)
        self.health = health
        self.health_state = RunHealth.of(health, self.label)
        self._round_sent: tuple[Parameters | None, int] = (None, 0)  # z^k sent, to how many

    @property
    def _key_of_cid(self) -> dict[str, str]:
        """Return the key each node (cid) speaks for (the binding's, not a copy)."""
        return self.binding.key_of

    def _resume(self, resume: bool) -> None:
        """Load the checkpoint in `checkpoint_dir` if `resume` (last step of ``__init__``)."""
        if self.checkpoint_dir is not None and resume and has_checkpoint(self.checkpoint_dir):
            self.load_checkpoint(self.checkpoint_dir)

    def initialize_parameters(self, client_manager: ClientManager) -> Parameters | None:
        """Return the restored z after a resume, else Flower's `initial_parameters`."""
        initial = super().initialize_parameters(client_manager)
        z = self._consensus()
        if z is None:
            return initial
        if initial is not None:
            shapes = [np.shape(a) for a in parameters_to_ndarrays(initial)]
            if shapes != [t.shape for t in z]:
                raise ValueError(
                    f"initial_parameters: shapes {shapes} differ from the checkpoint's "
                    f"{[t.shape for t in z]}"
                )
        return self._serialized_consensus()

    # ------------------------------------------------------------------- fit
    def configure_fit(
        self, server_round: int, parameters: Parameters, client_manager: ClientManager
    ) -> list[tuple[ClientProxy, FitIns]]:
        """Evict stale keys, adopt the broadcast z^k, sample clients, send each its FitIns."""
        self._adopt(parameters)
        self._configured = True
        self._round_sent = (parameters, 0)
        server_round += self._round_offset
        self._clock += 1
        self._evicted = 0
        stale = self.binding.stale(self._clock, self.max_client_age, self.max_clients)
        if stale:
            self._evict_keys(stale, "stale: beyond max_client_age or max_clients")
        if self.stop_on_convergence and self.converged:
            log(INFO, "%s: converged (r <= eps_pri, s <= eps_dual); no clients sampled", self.label)
            return []
        user: dict[str, Scalar] = {}
        if self.on_fit_config_fn is not None:
            user = dict(self.on_fit_config_fn(server_round))
        check_user_config(user, [], server_round)
        clients = _sample_clients(
            self, client_manager, server_round, self.sampling_seed, self._key_of_cid
        )
        self.binding.connected(client_manager.all())
        self.channel.sampled(len(clients), client_manager.num_available())
        config = {**user, **self.channel.config(), SERVER_ROUND: server_round}
        instructions = self._fit_instructions(clients, parameters, config)
        check_user_config(user, instructions, server_round)
        self._round_sent = (parameters, len(instructions))
        return instructions

    def aggregate_fit(
        self, server_round: int, results: Results, failures: Failures
    ) -> tuple[Parameters | None, dict[str, Scalar]]:
        """Fold the usable replies in client-key order, then update z (`_finish_round`).

        Raises ValueError before any ``configure_fit`` (class docstring).
        """
        if not self._configured:
            raise unconfigured(self.label, "aggregate_fit", "configure_fit")
        server_round += self._round_offset
        counts: dict[str, Scalar] = {
            NUM_FAILURES: len(failures),
            NUM_REJECTED: 0,
            NUM_KEY_CONFLICTS: 0,
            NUM_EVICTED: self._evicted,
        }
        counts.update({name: 0 for name in self.counters})
        (sent, num_sent), self._round_sent = self._round_sent, (None, 0)  # this round only
        # Flower's DefaultWorkflow drops replies that never came (Server.fit counted them)
        failed = len(failures) + max(0, num_sent - len(results) - len(failures))
        if not self.accept_failures and failures:
            watch_round(self.health_state, server_round, (0, 0, failed))
            return None, counts
        with single_thread_blas():
            accepted = self._fold_replies(results, server_round, counts)
        counts[NUM_EVICTED] = self._evicted  # with the keys freed by their nodes leaving
        tally = (len(accepted), int(counts[NUM_REJECTED]), failed)
        if not accepted:
            log(WARNING, "%s round %s: no usable reply; state unchanged", self.label, server_round)
            idle = self._discard_round()
            watch_round(self.health_state, server_round, tally)
            return None, {**counts, **self.channel.round_metrics(aggregated=False), **idle}
        own = self._finish_round(server_round)
        metrics = {**own, **counts, **self.channel.round_metrics(aggregated=True)}
        metrics = record_round(self, server_round, accepted, metrics)
        z_new = self._serialized_consensus()
        if self.health_state is not None:  # z^k sent, z' returned: read a tensor at a time
            before = None if sent is None else map(bytes_to_ndarray, sent.tensors)
            after = map(bytes_to_ndarray, z_new.tensors)
            watch_round(self.health_state, server_round, tally, before, after, own)
        if self.checkpoint_dir is not None and server_round % self.checkpoint_every == 0:
            self.save_checkpoint(self.checkpoint_dir)
        return z_new, metrics

    def _fold_replies(
        self, results: Results, server_round: int, counts: dict[str, Scalar]
    ) -> Results:
        """Key the replies, settle their claims, fold each in; return the accepted ones."""
        keyed = keyed_replies(
            results, client_key_of, lambda key, why: self._reject(key, why, counts)
        )
        admitted, freed = self.binding.admit(
            keyed, lambda key, why, conflict: self._reject(key, why, counts, conflict)
        )
        if freed:
            self._evict_keys(freed, "their nodes left the federation; new nodes start fresh")
        incoming = [reply.key for reply in admitted]
        crowded = self.binding.stale(self._clock, None, self.max_clients, incoming)
        if crowded:
            self._evict_keys(crowded, "least recently heard beyond max_clients")
        self._open_round(incoming)
        accepted: Results = []
        folded = self._fold_all(admitted, server_round, counts)
        for reply, ok in zip(admitted, folded, strict=True):
            if ok:
                self.binding.bind(reply.key, reply.proxy.cid, self._clock)
                accepted.append((reply.proxy, reply.res))
        return accepted

    def _fold_all(
        self, replies: list[KeyedReply], server_round: int, counts: dict[str, Scalar]
    ) -> list[bool]:
        """Fold the admitted replies in order, `_fold_reply` each; which were folded."""
        return [self._fold_reply(reply, server_round, counts) for reply in replies]

    def _evict_keys(self, keys: list[str], reason: str) -> None:
        """Drop the state and the bindings of `keys` (`_evict`); count them."""
        shown = keys if len(keys) <= 10 else f"{len(keys)} keys"
        log(INFO, "%s: evicted %s (%s)", self.label, shown, reason)
        self._evict(keys)
        self.binding.forget(keys)
        self._evicted += len(keys)

    def _reject(
        self, key: str, problem: str, counts: dict[str, Scalar], conflict: bool = False
    ) -> None:
        """Log and count a rejected reply (and a key conflict if `conflict`)."""
        reject_reply(self.label, key, problem, counts)
        if conflict:
            counts[NUM_KEY_CONFLICTS] = int(counts[NUM_KEY_CONFLICTS]) + 1

    # ------------------------------------------------------------- checkpoints
    def settings(self) -> dict[str, Any]:
        """Return every setting that changes the iterates: what a checkpoint must match.

        The strategy's own `configuration`, then the shared ones (`shared_settings`).
        """
        return {**self.configuration(), **shared_settings(self)}

    def fingerprint(self) -> str:
        """Return the SHA-256 of `settings`, the value a checkpoint must match."""
        return config_fingerprint(self.settings())

    def save_checkpoint(self, path: str | os.PathLike[str]) -> Path:
        """Write the full server state to directory `path` (atomic, checksummed, no pickle)."""
        if self._consensus() is None:
            raise CheckpointError("checkpoint: nothing to save before the first round")
        arrays, own = self._state_dict()
        manifest = strategy_manifest(
            self.settings(),
            self._dtypes,
            self.binding.state_dict(),
            self._clock,
            self.converged,
            own,
        )
        return save_checkpoint(path, arrays, manifest, self.last_round)

    def load_checkpoint(self, path: str | os.PathLike[str]) -> int:
        """Restore the server state from directory `path`; return its round."""
        arrays, manifest = load_matching_checkpoint(path, self.settings())
        binding = KeyBinding(self.key_binding)
        try:
            dtypes = [np.dtype(d) for d in manifest["dtypes"]]
            binding.load_state_dict(manifest["binding"])
            clock, last_round = int(manifest["clock"]), int(manifest["round"])
            self._load_state_dict(arrays, manifest, dtypes)
        except (KeyError, TypeError, ValueError, AttributeError) as error:
            raise CheckpointError(f"checkpoint: {path} is incomplete ({error!r})") from error
        self._dtypes, self.binding, self._clock = dtypes, binding, clock
        self.converged = bool(manifest.get("converged", False))
        self.last_round = self._round_offset = last_round
        return last_round

    # ------------------------------------------------------------------ hooks
    @abstractmethod
    def _consensus(self) -> Arrays | None:
        """Return z (float64), or None before the first round and without a resume."""

    @abstractmethod
    def _serialized_consensus(self) -> Parameters:
        """Serialize z in the dtypes it was broadcast in (what the next round sends)."""

    @abstractmethod
    def _adopt(self, parameters: Parameters) -> None:
        """Take the broadcast parameters as z^k (the first call also sets `_dtypes`)."""

    @abstractmethod
    def _fit_instructions(
        self, clients: list[ClientProxy], parameters: Parameters, config: dict[str, Scalar]
    ) -> list[tuple[ClientProxy, FitIns]]:
        """Build the FitIns of every sampled client from the round's common `config`."""

    @abstractmethod
    def _open_round(self, keys: list[str]) -> None:
        """Prepare to fold in the replies of `keys` (in this order)."""

    @abstractmethod
    def _fold_reply(self, keyed: KeyedReply, server_round: int, counts: dict[str, Scalar]) -> bool:
        """Check one keyed reply and fold it into the round; False if rejected or skipped."""

    @abstractmethod
    def _discard_round(self) -> dict[str, Scalar]:
        """Close a round without usable reply; return rho and the key count, unchanged."""

    @abstractmethod
    def _finish_round(self, server_round: int) -> dict[str, Scalar]:
        """Update z from the folded replies; set `converged`; return the round metrics."""

    @abstractmethod
    def _evict(self, keys: list[str]) -> None:
        """Forget clients `keys` between rounds: their contributions leave the sums."""

    @abstractmethod
    def configuration(self) -> dict[str, Any]:
        """Return the strategy's own settings a checkpoint must agree with (JSON).

        `settings` adds the shared ones (sampling, identity, uplink).
        """

    @abstractmethod
    def _state_dict(self) -> tuple[dict[str, NDArray[Any]], dict[str, Any]]:
        """Return the strategy's own checkpoint arrays and manifest entries."""

    @abstractmethod
    def _load_state_dict(
        self, arrays: dict[str, NDArray[Any]], manifest: dict[str, Any], dtypes: list[np.dtype[Any]]
    ) -> None:
        """Restore the strategy's own state; raise KeyError/TypeError/ValueError first."""


def _sample_clients(strategy: Any, client_manager: ClientManager, server_round: int, sampling_seed: int | None, key_of_cid: dict[str, str]) -> list[ClientProxy]:
    from flwr_admm.rounds.sampling import sample_ids
    _, min_num = strategy.num_fit_clients(client_manager.num_available())
    client_manager.wait_for(min_num, timeout=86400)
    size, _ = strategy.num_fit_clients(client_manager.num_available())
    if sampling_seed is None:
        return client_manager.sample(num_clients=size, min_num_clients=min_num)
    available = client_manager.all()
    if size > len(available):
        return []
    order = sample_ids(available, size, server_round, sampling_seed, key_of_cid)
    return [available[cid] for cid in order]
