"""Reading a node's fit config: rho, the round, 0/1 flags, the API's spelling.

The legacy API spells Flower's keys with underscores (``server_round``,
``proximal_mu``), the Message API with hyphens (``server-round``, ``proximal-mu``);
a node reads either, the legacy spelling first.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from flwr_admm.protocol import (
    MESSAGE_PROXIMAL_MU,
    MESSAGE_SERVER_ROUND,
    MODE_CLIENT,
    MODE_KEY,
    PROXIMAL_MU,
    RHO,
    SERVER_ROUND,
)

__all__ = ["client_held", "flag", "legacy_config", "read_rho", "server_round_of"]


def read_rho(config: Mapping[str, Any]) -> float:
    """Return rho_i: ``rho``, else FedProx's mu (``proximal_mu`` / ``proximal-mu``), else 0."""
    value = config.get(RHO, config.get(PROXIMAL_MU, config.get(MESSAGE_PROXIMAL_MU, 0.0)))
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"rho: must be a number >= 0, got {value!r}")
    if not (math.isfinite(value) and value >= 0):
        raise ValueError(f"rho: must be a finite number >= 0, got {value!r}")
    return float(value)


def server_round_of(config: Mapping[str, Any]) -> int | None:
    """Return ``server_round`` / ``server-round`` if it is an integer, else None."""
    value = config.get(SERVER_ROUND, config.get(MESSAGE_SERVER_ROUND))
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def flag(config: Mapping[str, Any], field: str) -> bool:
    """Return a 0/1 config flag (absent: 0); ValueError naming the field otherwise."""
    value = config.get(field, 0)
    if isinstance(value, bool) or value not in (0, 1):
        raise ValueError(f"{field}: must be 0 or 1, got {value!r}")
    return bool(value == 1)


def client_held(config: Mapping[str, Any]) -> bool:
    """Return whether the config asks for client-held duals (``admm-duals = "client"``)."""
    return config.get(MODE_KEY) == MODE_CLIENT


def legacy_config(config: Mapping[str, Any]) -> dict[str, Any]:
    """Return `config` with the legacy spellings a NumPyClient reads added.

    ``server-round`` -> ``server_round``, ``proximal-mu`` -> ``proximal_mu`` (a key
    already present in legacy spelling wins).
    """
    out = dict(config)
    for message_key, legacy_key in (
        (MESSAGE_SERVER_ROUND, SERVER_ROUND),
        (MESSAGE_PROXIMAL_MU, PROXIMAL_MU),
    ):
        if message_key in out and legacy_key not in out:
            out[legacy_key] = out[message_key]
    return out
