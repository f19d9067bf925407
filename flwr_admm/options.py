"""The strategies' options, as small checked values.

`Checkpointing` (where, how often, whether to resume), `ClientPolicy` (who may speak for
a client key, and how long an unheard key is kept), `Convergence` (Boyd's stopping
tolerances, and whether to stop sampling once they are met) and `Uplink` (compression
and local DP of the clients' updates). Each checks itself when built and raises a
ValueError naming the field and its allowed values; a strategy given something else
in their place raises a ValueError naming its keyword (`option`).
"""

from __future__ import annotations

import numbers
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from flwr_admm.core.types import check_tolerances
from flwr_admm.uplink.compression import Compressor
from flwr_admm.uplink.privacy import LocalDP

__all__ = ["KEY_BINDINGS", "Checkpointing", "ClientPolicy", "Convergence", "Uplink", "option"]

KEY_BINDINGS = ("node", "authenticated", "reported")  # `flwr_admm.rounds.identity.KeyBinding`
OptionT = TypeVar("OptionT")


def option(name: str, value: Any, kind: type[OptionT]) -> OptionT:
    """Return `value` if it is a `kind`; else ValueError naming the keyword `name`."""
    if not isinstance(value, kind):
        raise ValueError(f"{name}: must be {kind.__name__}(...), got {value!r}")
    return value


def _flag(name: str, value: Any) -> None:
    if not isinstance(value, bool):
        raise ValueError(f"{name}: must be True or False, got {value!r}")


def _count(name: str, value: Any, optional: bool = True) -> int | None:
    """Return `value` as an integer >= 1 (or None if `optional`); else ValueError."""
    if value is None and optional:
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
        allowed = "None or an integer >= 1" if optional else "an integer >= 1"
        raise ValueError(f"{name}: must be {allowed}, got {value!r}")
    return int(value)


@dataclass(frozen=True)
class Checkpointing:
    """Write the server state to `directory` every `every` aggregations; `resume` from it.

    The files are atomic and checksummed; a checkpoint written under other settings is
    refused with a `CheckpointError` naming the fields that differ, never silently
    replaced by a fresh start (docs/checkpoints.md).
    """

    directory: str | os.PathLike[str]
    every: int = 1
    resume: bool = True

    def __post_init__(self) -> None:
        if not isinstance(self.directory, str | os.PathLike):
            raise ValueError(f"directory: must be a str or a path, got {self.directory!r}")
        object.__setattr__(self, "directory", Path(self.directory))
        object.__setattr__(self, "every", _count("every", self.every, optional=False))
        _flag("resume", self.resume)

    @property
    def path(self) -> Path:
        """Return `directory` as a `Path`."""
        return Path(self.directory)


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
    identify : bool
        Message API: before a seeded round samples a strict subset, ask each node
        without a key which client it speaks for (once), so that the sample does not
        depend on the random node ids Flower assigns and engine runs repeat. The
        ClientApps must answer (`flwr_admm.clientapp.identity.identity_reply`;
        `make_client_app` does); a node that does not keeps its node-id place and,
        in Flower's engine, logs the error of its missing query handler. Default False.

    """

    key_binding: str = "node"
    max_age: int | None = None
    max_count: int | None = None
    identify: bool = False

    def __post_init__(self) -> None:
        if self.key_binding not in KEY_BINDINGS:
            raise ValueError(
                f"key_binding: must be one of {list(KEY_BINDINGS)}, got {self.key_binding!r}"
            )
        if not isinstance(self.identify, bool):
            raise ValueError(f"identify: must be True or False, got {self.identify!r}")
        object.__setattr__(self, "max_age", _count("max_age", self.max_age))
        object.__setattr__(self, "max_count", _count("max_count", self.max_count))

    def describe(self) -> dict[str, Any]:
        """Return the policy as JSON under the names checkpoints are fingerprinted with."""
        return {
            "key_binding": self.key_binding,
            "max_client_age": self.max_age,
            "max_clients": self.max_count,
        }


@dataclass(frozen=True)
class Convergence:
    """Boyd's stopping thresholds, and whether to sample no node once they are met.

    eps_pri = sqrt(n) eps_abs + eps_rel max(sqrt(sum p_i ||w_i||^2), ||z'||) and
    eps_dual = sqrt(n) eps_abs + eps_rel sqrt(sum p_i ||y_i||^2) (Boyd et al. 2011,
    3.3.1); a round with r <= eps_pri and s <= eps_dual reports ``converged = 1``.
    """

    eps_abs: float = 1e-6
    eps_rel: float = 1e-4
    stop: bool = False

    def __post_init__(self) -> None:
        for name in ("eps_abs", "eps_rel"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise ValueError(f"{name}: must be a finite number >= 0, got {value!r}")
        check_tolerances(self.eps_abs, self.eps_rel)
        _flag("stop", self.stop)


@dataclass(frozen=True)
class Uplink:
    """What clients do to their updates before sending them.

    Parameters
    ----------
    compressor : Compressor, optional
        `StochasticQuantizer` or `TopK` of the update, with error feedback.
    local_dp : LocalDP, optional
        Clip and noise each update on the client; epsilon is reported every round.

    """

    compressor: Compressor | None = None
    local_dp: LocalDP | None = None

    def __post_init__(self) -> None:
        if self.compressor is not None and not isinstance(self.compressor, Compressor):
            raise ValueError(f"compressor: must be a Compressor or None, got {self.compressor!r}")
        if self.local_dp is not None and not isinstance(self.local_dp, LocalDP):
            raise ValueError(f"local_dp: must be a LocalDP or None, got {self.local_dp!r}")
