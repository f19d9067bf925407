"""Checkpoints of `FedADMM`: save and restore the full server state between runs.

A checkpoint holds z, every cached w_i and dual, the running sums, rho and the
schedule state, the round, the client keys and the privacy ledger, plus a SHA-256
fingerprint of the configuration (rho, rho_schedule, regularizer, client_rho, eps_abs,
eps_rel, relaxation if not 1). Resuming under another configuration, or from a
damaged checkpoint, raises `CheckpointError`; it never starts fresh silently.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from flwr.common import NDArrays

from flwr_admm.core.consensus import ClientRho, ConsensusADMM
from flwr_admm.core.regularizers import Regularizer
from flwr_admm.core.schedules import RhoSchedule
from flwr_admm.server.checkpoint import (
    CheckpointError,
    config_fingerprint,
    load_checkpoint,
    save_checkpoint,
)
from flwr_admm.uplink.channel import UplinkChannel


class StrategyCheckpoint:
    """`fingerprint`, `save_checkpoint` and `load_checkpoint` of `FedADMM` (mixed in)."""

    rho: float
    rho_schedule: RhoSchedule
    regularizer: Regularizer | None
    client_rho: ClientRho
    eps_abs: float
    eps_rel: float
    relaxation: float
    admm: ConsensusADMM | None
    channel: UplinkChannel
    converged: bool
    last_round: int
    _round_offset: int
    _dtypes: list[np.dtype[Any]]
    _key_of_cid: dict[str, str]
    _sent_key: dict[str, str | None]

    if TYPE_CHECKING:

        def _new_admm(self, z: NDArrays) -> ConsensusADMM: ...

    def fingerprint(self) -> str:
        """SHA-256 of the configuration a checkpoint must agree with."""
        config = {
            "rho": self.rho,
            "rho_schedule": self.rho_schedule.describe(),
            "regularizer": None if self.regularizer is None else self.regularizer.describe(),
            "client_rho": self.client_rho,
            "eps_abs": self.eps_abs,
            "eps_rel": self.eps_rel,
        }
        if self.relaxation != 1.0:  # absent at 1: older checkpoints keep resuming
            config["relaxation"] = self.relaxation
        return config_fingerprint(config)

    def save_checkpoint(self, path: str | os.PathLike[str]) -> Path:
        """Write the full server state to directory `path` (atomic, no pickle)."""
        if self.admm is None:
            raise CheckpointError("checkpoint: nothing to save before the first round")
        arrays, meta = self.admm.state_dict()
        manifest = {
            "fingerprint": self.fingerprint(),
            "admm": meta,
            "dtypes": [str(d) for d in self._dtypes],
            "key_of_cid": self._key_of_cid,
            "sent_key": self._sent_key,
            "converged": self.converged,
            "privacy": self.channel.ledger.state_dict() if self.channel.ledger else {},
        }
        return save_checkpoint(path, arrays, manifest, self.last_round)

    def load_checkpoint(self, path: str | os.PathLike[str]) -> int:
        """Restore the server state from directory `path`; return its round."""
        arrays, manifest = load_checkpoint(path)
        if manifest.get("fingerprint") != self.fingerprint():
            raise CheckpointError(
                f"checkpoint: {path} was written with another configuration (rho, "
                "rho_schedule, regularizer, client_rho, eps_abs, eps_rel); refusing to resume"
            )
        try:
            meta = manifest["admm"]
            z0 = [np.zeros(tuple(shape)) for shape in meta["shapes"]]
            admm = self._new_admm(z0)
            admm.load_state_dict(arrays, meta)
            dtypes = [np.dtype(d) for d in manifest["dtypes"]]
        except (KeyError, TypeError, ValueError) as error:
            raise CheckpointError(f"checkpoint: {path} is incomplete ({error!r})") from error
        self.admm, self._dtypes = admm, dtypes
        self._key_of_cid = dict(manifest.get("key_of_cid", {}))
        self._sent_key = dict(manifest.get("sent_key", {}))
        self.converged = bool(manifest.get("converged", False))
        if self.channel.ledger is not None:
            self.channel.ledger.load_state_dict(manifest.get("privacy", {}))
        self.last_round = self._round_offset = int(manifest["round"])
        return self.last_round
