"""The options every strategy's round takes, as small checked values.

`Checkpointing` (where, how often, whether to resume) and `ClientPolicy` (who may
speak for a client key, and how long an unheard key is kept) are validated once, in
``__init__``, and raise a ValueError naming the field and its allowed values.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from flwr_admm.rounds.checkpoint import checkpoint_every_value
from flwr_admm.rounds.identity import KEY_BINDINGS, optional_count

__all__ = ["Checkpointing", "ClientPolicy", "checkpointing"]


@dataclass(frozen=True)
class Checkpointing:
    """Write the server state to `directory` every `every` aggregations; `resume` from it.

    The files are atomic and checksummed (`flwr_admm.rounds.checkpoint`); a checkpoint
    written under other settings is refused with a `CheckpointError` naming the fields
    that differ, never silently replaced by a fresh start.
    """

    directory: str | os.PathLike[str]
    every: int = 1
    resume: bool = True

    def __post_init__(self) -> None:
        object.__setattr__(self, "directory", Path(self.directory))
        object.__setattr__(self, "every", checkpoint_every_value(self.every))
        if not isinstance(self.resume, bool):
            raise ValueError(f"resume: must be True or False, got {self.resume!r}")

    @property
    def path(self) -> Path:
        """Return `directory` as a `Path`."""
        return Path(self.directory)


def checkpointing(
    directory: str | os.PathLike[str] | None, every: int = 1, resume: bool = True
) -> Checkpointing | None:
    """Return the `Checkpointing` of a strategy's flat keywords (None: no directory).

    `every` is checked even without a directory (ValueError naming checkpoint_every).
    """
    if directory is None:
        checkpoint_every_value(every)
        return None
    return Checkpointing(directory, every, resume)


@dataclass(frozen=True)
class ClientPolicy:
    """Client identity and eviction (`flwr_admm.rounds.identity.KeyBinding`).

    Parameters
    ----------
    key_binding : {"node", "authenticated", "reported"}
        ``"node"`` (default): a key is accepted only from the node it was first
        accepted from, until that node leaves the federation; ``"authenticated"``:
        never rebound (SuperNode authentication); ``"reported"``: reported keys are
        trusted (trusted deployments only).
    max_age : int, optional
        Evict a key not heard for more than this many rounds (its state leaves the sums).
    max_count : int, optional
        Keep at most this many keys, evicting the least recently heard.

    """

    key_binding: str = "node"
    max_age: int | None = None
    max_count: int | None = None

    def __post_init__(self) -> None:
        if self.key_binding not in KEY_BINDINGS:
            raise ValueError(
                f"key_binding: must be one of {list(KEY_BINDINGS)}, got {self.key_binding!r}"
            )
        object.__setattr__(self, "max_age", optional_count(self.max_age, "max_client_age"))
        object.__setattr__(self, "max_count", optional_count(self.max_count, "max_clients"))

    def describe(self) -> dict[str, Any]:
        """Return the policy under its fingerprinted names (JSON)."""
        return {
            "key_binding": self.key_binding,
            "max_client_age": self.max_age,
            "max_clients": self.max_count,
        }
