"""Legacy-API plumbing of the round translator: keyword checks, the client sample, the fit config.

The seeded draw is the round layer's (`flwr_admm.rounds.identity.sample_ids`), the same
the Message-API strategies make.
"""

from __future__ import annotations

from collections.abc import Mapping
from logging import INFO

import numpy as np
from flwr.common import FitIns, Scalar
from flwr.common.logger import log
from flwr.server.client_manager import ClientManager
from flwr.server.client_proxy import ClientProxy
from flwr.server.strategy import FedAvg

from flwr_admm.protocol import (
    RESERVED_CONFIG_KEYS,
    RESERVED_CONFIG_PREFIXES,
    SERVER_ROUND,
)
from flwr_admm.rounds.checks import check_sampling_seed, check_sizes
from flwr_admm.rounds.layer import RoundLayer


def check_flower_fields(strategy: FedAvg, sampling_seed: int | None) -> None:
    """Validate the FedAvg keywords Flower leaves unchecked (and `sampling_seed`).

    Only values no round can run with are refused: a fraction outside [0, 1] (FedAvg
    then samples nothing, silently), a negative or non-integer count, a non-boolean
    `accept_failures`. `min_available_clients` below `min_fit_clients` is FedAvg's
    warning (its ``__init__`` logs it), not an error.
    """
    check_sizes(
        strategy,
        ("fraction_fit", "fraction_evaluate"),
        ("min_fit_clients", "min_evaluate_clients", "min_available_clients"),
    )
    if not isinstance(strategy.accept_failures, bool | np.bool_):
        raise ValueError(
            f"accept_failures: must be True or False, got {strategy.accept_failures!r}"
        )
    strategy.accept_failures = bool(strategy.accept_failures)
    check_sampling_seed(sampling_seed)


def check_user_config(
    user: Mapping[str, Scalar],
    sent: list[tuple[ClientProxy, FitIns]],
    server_round: int | None = None,
) -> None:
    """Refuse an ``on_fit_config_fn`` result that names a key the strategy sets itself.

    Reserved: `RESERVED_CONFIG_KEYS`, any key starting with one of
    `RESERVED_CONFIG_PREFIXES`, and any key whose value the strategy changed in a
    client's FitIns (`sent`). ``server_round`` equal to the round the strategy sends
    (`server_round`) is accepted: Flower's tutorials put it in their fit config.
    """
    for key in sorted(user):
        if key == SERVER_ROUND and server_round is not None and user[key] == server_round:
            continue
        overwritten = any(
            key not in ins.config
            or (ins.config[key] is not user[key] and ins.config[key] != user[key])
            for _, ins in sent
        )
        if key in RESERVED_CONFIG_KEYS or key.startswith(RESERVED_CONFIG_PREFIXES) or overwritten:
            raise ValueError(
                f"on_fit_config_fn: key {key!r} is set by the strategy itself (reserved: "
                f"{list(RESERVED_CONFIG_KEYS)} and keys starting with "
                f"{list(RESERVED_CONFIG_PREFIXES)}); rename it"
            )


def sample_clients(
    strategy: FedAvg, client_manager: ClientManager, server_round: int, layer: RoundLayer
) -> list[ClientProxy]:
    """Wait for `min_available_clients`, THEN size the sample from who is there.

    (Sizing first, as Flower's FedAvg does, samples too few clients when nodes are
    still registering at round 1 in the simulation engine.) With the layer's
    `sampling_seed` the sample is its seeded draw over the clients ordered by key,
    then cid (`RoundLayer.sample`); without, Flower's own `ClientManager.sample`.
    """
    _, min_num = strategy.num_fit_clients(client_manager.num_available())
    client_manager.wait_for(min_num, timeout=86400)
    size, _ = strategy.num_fit_clients(client_manager.num_available())
    available = client_manager.all()
    layer.connect(list(available))
    if layer.sampling_seed is None:
        return client_manager.sample(num_clients=size, min_num_clients=min_num)
    if size > len(available):
        log(
            INFO, "%s: sampling %s clients but only %s available", layer.label, size, len(available)
        )
        return []
    return [available[cid] for cid in layer.sample(list(available), size, server_round)]
