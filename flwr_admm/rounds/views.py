"""What both translators show of their round layer: its history, binding and checkpoints.

`RoundViews` is mixed into each API's `RoundStrategy` (`flwr_admm.serverapp.strategy`,
`flwr_admm.server.strategy`), which holds the `RoundLayer` as ``round``.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from flwr_admm.rounds.exchange import Layout
from flwr_admm.rounds.identity import KeyBinding
from flwr_admm.rounds.layer import RoundLayer

__all__ = ["RoundViews"]


class RoundViews:
    """What both translators show of their round layer, and its checkpoints (mixed in)."""

    round: RoundLayer

    @property
    def history(self) -> list[dict[str, Any]]:
        """The round metrics of every aggregation, with ``round``."""
        return self.round.history

    @property
    def binding(self) -> KeyBinding:
        """Which node speaks for each client key (`flwr_admm.rounds.identity`)."""
        return self.round.binding

    @property
    def key_binding(self) -> str:
        """Who may speak for a client key (`ClientPolicy.key_binding`)."""
        return self.round.clients.key_binding

    @property
    def converged(self) -> bool:
        """Whether the last aggregation met the stopping thresholds."""
        return self.round.converged

    @property
    def last_round(self) -> int:
        """The round of the last aggregation (continued after a resume)."""
        return self.round.last_round

    @property
    def layout(self) -> Layout | None:
        """The model's tensor names, dtypes and shapes (from the first model received)."""
        return self.round.layout

    @property
    def sampling_seed(self) -> int | None:
        """The seed of the node sample."""
        return self.round.sampling_seed

    def settings(self) -> dict[str, Any]:
        """Return every setting that changes the iterates: what a checkpoint must match."""
        return self.round.settings()

    def fingerprint(self) -> str:
        """Return the SHA-256 of `settings`, the value a checkpoint must match."""
        return self.round.fingerprint()

    def save_checkpoint(self, path: str | os.PathLike[str]) -> Path:
        """Write the full server state to directory `path` (atomic, checksummed, no pickle)."""
        return self.round.save(path)

    def load_checkpoint(self, path: str | os.PathLike[str]) -> int:
        """Restore the server state from directory `path`; return its round."""
        return self.round.load(path)

    def configuration(self) -> dict[str, Any]:
        """Return the algorithm's own settings a checkpoint must agree with (JSON)."""
        return self.round.algorithm.configuration()
