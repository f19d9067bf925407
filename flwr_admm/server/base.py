"""The round skeleton shared by `FedADMM` and `FedADMMClientDuals`.

`ConsensusStrategy` runs what both consensus-ADMM strategies do around their math:
keyword checks, seeded sampling, the fit config, keyed and ordered reply folding,
round records and checkpoints. A strategy fills in the hooks (`_adopt`,
`_fit_instructions`, `_fold_reply`, `_finish_round`, ...), the way Flower's FedProx
overrides one method of FedAvg.
"""

from __future__ import annotations

import os
from abc import abstractmethod
from collections import Counter
from logging import INFO, WARNING
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
from flwr.common import FitIns, FitRes, Parameters, Scalar, parameters_to_ndarrays
from flwr.common.logger import log
from flwr.server.client_manager import ClientManager
from flwr.server.client_proxy import ClientProxy
from flwr.server.strategy import FedAvg
from numpy.typing import NDArray

from flwr_admm.core.kernels import single_thread_blas
from flwr_admm.core.types import Arrays, natural_key
from flwr_admm.protocol import NUM_FAILURES, NUM_REJECTED, SERVER_ROUND
from flwr_admm.server.checkpoint import (
    CheckpointError,
    checkpoint_every_value,
    config_differences,
    config_fingerprint,
    has_checkpoint,
    load_checkpoint,
    save_checkpoint,
)
from flwr_admm.server.sampling import (
    check_flower_fields,
    client_key,
    keyed_replies,
    record_round,
    reject_reply,
    sample_clients,
)
from flwr_admm.uplink.channel import UplinkChannel

Results = list[tuple[ClientProxy, FitRes]]
Failures = list[tuple[ClientProxy, FitRes] | BaseException]


class ConsensusStrategy(FedAvg):
    """Run the rounds of a consensus-ADMM strategy; subclasses supply the algorithm.

    A round: ``configure_fit`` adopts the broadcast z, samples clients (seeded by
    (sampling_seed, round), clients ordered by key) and lets `_fit_instructions` build
    their FitIns; ``aggregate_fit`` keys every reply by the client's ``client-key``,
    else ``partition-id``, else cid, and folds the replies in one at a time, in natural
    key order (deterministic sums), through `_fold_reply`; `_finish_round` then
    updates z. Round numbers continue after a resume.

    Duplicate keys: every reply that shares its client key with another reply of the
    same round is rejected (``num_rejected``), whatever its content, so no two replies
    ever touch one client's state in a round.

    Checkpoints: `configuration` is fingerprinted; a checkpoint written under another
    configuration is refused with a `CheckpointError` naming the differing fields.
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
        **fedavg_kwargs: Any,
    ) -> None:
        super().__init__(**fedavg_kwargs)
        check_flower_fields(self, sampling_seed)
        self.channel = channel
        self.stop_on_convergence = stop_on_convergence
        self.sampling_seed = sampling_seed
        self.history: list[dict[str, Scalar]] = []
        self.converged = False
        self.last_round = 0
        self._round_offset = 0  # rounds done before a resume
        self._dtypes: list[np.dtype[Any]] = []  # of the broadcast z, kept on the wire
        self._key_of_cid: dict[str, str] = {}
        self.checkpoint_every = checkpoint_every_value(checkpoint_every)
        self.checkpoint_dir = None if checkpoint_dir is None else Path(checkpoint_dir)

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
        """Adopt the broadcast z^k, sample clients, and send each its FitIns."""
        self._adopt(parameters)
        server_round += self._round_offset
        if self.stop_on_convergence and self.converged:
            log(INFO, "%s: converged (r <= eps_pri, s <= eps_dual); no clients sampled", self.label)
            return []
        config: dict[str, Scalar] = {}
        if self.on_fit_config_fn is not None:
            config = dict(self.on_fit_config_fn(server_round))
        clients = sample_clients(
            self, client_manager, server_round, self.sampling_seed, self._key_of_cid
        )
        self.channel.sampled(len(clients), client_manager.num_available())
        config = {**config, **self.channel.config(), SERVER_ROUND: server_round}
        return self._fit_instructions(clients, parameters, config)

    def aggregate_fit(
        self, server_round: int, results: Results, failures: Failures
    ) -> tuple[Parameters | None, dict[str, Scalar]]:
        """Fold the usable replies in client-key order, then update z (`_finish_round`)."""
        server_round += self._round_offset
        counts: dict[str, Scalar] = {NUM_FAILURES: len(failures), NUM_REJECTED: 0}
        counts.update({name: 0 for name in self.counters})
        if self._consensus() is None or (not self.accept_failures and failures):
            return None, counts
        with single_thread_blas():
            folded = self._fold_replies(server_round, results, counts)
        if not folded:
            log(WARNING, "%s round %s: no usable reply; state unchanged", self.label, server_round)
            idle = self._discard_round()
            return None, {**counts, **self.channel.round_metrics(aggregated=False), **idle}
        metrics = {
            **self._finish_round(server_round),
            **counts,
            **self.channel.round_metrics(aggregated=True),
        }
        metrics = record_round(self, server_round, results, metrics)
        if self.checkpoint_dir is not None and server_round % self.checkpoint_every == 0:
            self.save_checkpoint(self.checkpoint_dir)
        return self._serialized_consensus(), metrics

    def _fold_replies(self, server_round: int, results: Results, counts: dict[str, Scalar]) -> int:
        """Reject shared keys, then fold each reply in natural key order; count the folded."""
        keyed = keyed_replies(results, client_key, lambda key, why: self._reject(key, why, counts))
        shared = {key for key, count in Counter(key for key, _, _ in keyed).items() if count > 1}
        ordered = []
        for key, proxy, res in sorted(keyed, key=lambda item: natural_key(item[0])):
            if key in shared:
                self._reject(key, "several replies share this client key", counts)
            else:
                ordered.append((key, proxy, res))
        self._open_round([key for key, _, _ in ordered])
        return sum(
            self._fold_reply(key, proxy, res, server_round, counts) for key, proxy, res in ordered
        )

    def _reject(self, key: str, problem: str, counts: dict[str, Scalar]) -> None:
        reject_reply(self.label, key, problem, counts)

    # ------------------------------------------------------------- checkpoints
    def fingerprint(self) -> str:
        """Return the SHA-256 of `configuration`, the value a checkpoint must match."""
        return config_fingerprint(self.configuration())

    def save_checkpoint(self, path: str | os.PathLike[str]) -> Path:
        """Write the full server state to directory `path` (atomic, no pickle)."""
        if self._consensus() is None:
            raise CheckpointError("checkpoint: nothing to save before the first round")
        arrays, manifest = self._state_dict()
        manifest = {
            "fingerprint": self.fingerprint(),
            "configuration": self.configuration(),
            "dtypes": [str(d) for d in self._dtypes],
            "key_of_cid": self._key_of_cid,
            "converged": self.converged,
            **manifest,
        }
        return save_checkpoint(path, arrays, manifest, self.last_round)

    def load_checkpoint(self, path: str | os.PathLike[str]) -> int:
        """Restore the server state from directory `path`; return its round."""
        arrays, manifest = load_checkpoint(path)
        if manifest.get("fingerprint") != self.fingerprint():
            current = self.configuration()
            differences = config_differences(manifest.get("configuration"), current)
            detail = "; ".join(differences) or f"its own is not recorded; now {current}"
            raise CheckpointError(
                f"checkpoint: {path} was written with another configuration ({detail}); "
                "refusing to resume"
            )
        try:
            dtypes = [np.dtype(d) for d in manifest["dtypes"]]
            key_of_cid = {str(c): str(k) for c, k in manifest.get("key_of_cid", {}).items()}
            last_round = int(manifest["round"])
            self._load_state_dict(arrays, manifest, dtypes)
        except (KeyError, TypeError, ValueError) as error:
            raise CheckpointError(f"checkpoint: {path} is incomplete ({error!r})") from error
        self._dtypes, self._key_of_cid = dtypes, key_of_cid
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
    def _fold_reply(
        self,
        key: str,
        proxy: ClientProxy,
        res: FitRes,
        server_round: int,
        counts: dict[str, Scalar],
    ) -> bool:
        """Check one reply and fold it into the round; False if rejected or skipped."""

    @abstractmethod
    def _discard_round(self) -> dict[str, Scalar]:
        """Close a round without usable reply; return rho and the key count, unchanged."""

    @abstractmethod
    def _finish_round(self, server_round: int) -> dict[str, Scalar]:
        """Update z from the folded replies; set `converged`; return the round metrics."""

    @abstractmethod
    def configuration(self) -> dict[str, Any]:
        """Return the configuration a checkpoint must agree with (JSON)."""

    @abstractmethod
    def _state_dict(self) -> tuple[dict[str, NDArray[Any]], dict[str, Any]]:
        """Return the strategy's own checkpoint arrays and manifest entries."""

    @abstractmethod
    def _load_state_dict(
        self, arrays: dict[str, NDArray[Any]], manifest: dict[str, Any], dtypes: list[np.dtype[Any]]
    ) -> None:
        """Restore the strategy's own state; raise KeyError/TypeError/ValueError first."""
