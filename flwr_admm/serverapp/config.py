"""Keyword and config checks of the Message-API strategies."""

from __future__ import annotations

from typing import Any

from flwr.app import ConfigRecord
from flwr.serverapp.strategy import FedAvg

from flwr_admm.protocol import MESSAGE_RESERVED_CONFIG_KEYS, RESERVED_CONFIG_PREFIXES
from flwr_admm.rounds.sampling import check_sampling_seed, check_sizes

__all__ = ["check_fields", "copy_config"]


def check_fields(strategy: FedAvg, sampling_seed: int | None) -> None:
    """Validate the FedAvg keywords Flower leaves unchecked (and `sampling_seed`).

    Refused: a fraction outside [0, 1], a count that is not an integer >= 0, a
    `sampling_seed` that is not None or an integer >= 0, empty record keys.
    """
    check_sizes(
        strategy,
        ("fraction_train", "fraction_evaluate"),
        ("min_train_nodes", "min_evaluate_nodes", "min_available_nodes"),
    )
    for name in ("weighted_by_key", "arrayrecord_key", "configrecord_key"):
        value = getattr(strategy, name)
        if not isinstance(value, str) or not value:
            raise ValueError(f"{name}: must be a non-empty str, got {value!r}")
    check_sampling_seed(sampling_seed)


def copy_config(config: ConfigRecord, *, check: bool = False) -> dict[str, Any]:
    """Return a copy of `config` (lists copied too); never touch the given record.

    With `check`, refuse a key the strategy sets itself: ``rho``, ``proximal-mu``,
    ``server-round``, the legacy ``proximal_mu``, ``server_round``, ``admm-duals``,
    and keys starting with ``admm-``, ``uplink`` or ``dp-`` (ValueError naming it).
    """
    copied = {k: list(v) if isinstance(v, list) else v for k, v in config.items()}
    if check:
        for key in sorted(copied):
            if key in MESSAGE_RESERVED_CONFIG_KEYS or key.startswith(RESERVED_CONFIG_PREFIXES):
                raise ValueError(
                    f"train_config: key {key!r} is set by FedADMM itself (reserved: "
                    f"{list(MESSAGE_RESERVED_CONFIG_KEYS)} and keys starting with "
                    f"{list(RESERVED_CONFIG_PREFIXES)}); rename it"
                )
    return copied
