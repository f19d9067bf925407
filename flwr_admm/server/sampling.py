"""Legacy `flwr.server.strategy` plumbing of the consensus strategies: keywords, sampling, records.

Keyword checks of Flower's legacy `FedAvg`, the seeded draw from a `ClientManager`
(`sample_clients`: the order and the draw are `flwr_admm.rounds.sampling.sample_ids`,
which the Message-API strategies use too), the user's fit-config check, keyed replies
and the round record of `FedADMM` and `FedADMMClientDuals`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from logging import INFO, WARNING
from typing import Any, NamedTuple

import numpy as np
from flwr.common import FitIns, FitRes, Scalar
from flwr.common.logger import log
from flwr.server.client_manager import ClientManager
from flwr.server.client_proxy import ClientProxy
from flwr.server.strategy import FedAvg

from flwr_admm.protocol import (
    NUM_REJECTED,
    RESERVED_CONFIG_KEYS,
    RESERVED_CONFIG_PREFIXES,
    ROUND,
    SERVER_ROUND,
)
from flwr_admm.rounds.layer import RoundLayer
from flwr_admm.rounds.report import without_reply_keys
from flwr_admm.rounds.sampling import check_sampling_seed, check_sizes


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
            continue  # Flower's examples send the round themselves: the same value is no clash
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


def record_round(
    strategy: Any,
    server_round: int,
    accepted: list[tuple[ClientProxy, FitRes]],
    metrics: dict[str, Scalar],
) -> dict[str, Scalar]:
    """Record one aggregation: merged metrics, appended to `strategy.history`.

    The user's `fit_metrics_aggregation_fn` sees the `accepted` replies only; its
    entries, without identity and protocol keys (`without_reply_keys`), come first,
    and where a name is also one of ours, ours wins (with a warning naming the
    names). `strategy.last_round` becomes `server_round`.
    """
    if strategy.fit_metrics_aggregation_fn is not None:
        user = without_reply_keys(
            strategy.fit_metrics_aggregation_fn(
                [(res.num_examples, res.metrics) for _, res in accepted]
            )
        )
        clashes = sorted(set(user) & set(metrics))
        if clashes:
            log(
                WARNING,
                "%s: fit_metrics_aggregation_fn returned %s, which the strategy reports "
                "itself; the strategy's values are kept",
                type(strategy).__name__,
                clashes,
            )
        metrics = {**user, **metrics}
    strategy.history.append({ROUND: server_round, **metrics})
    strategy.last_round = server_round
    return metrics


class KeyedReply(NamedTuple):
    """One fit reply with the client key it is filed under."""

    key: str
    proxy: ClientProxy
    res: FitRes


def keyed_replies(
    results: list[tuple[ClientProxy, FitRes]],
    key_of: Callable[[str, dict[str, Scalar]], str],
    reject: Callable[[str, str], None],
) -> list[KeyedReply]:
    """Each reply with its client key; one whose key cannot be read goes to `reject`."""
    keyed: list[KeyedReply] = []
    for proxy, res in results:
        try:
            keyed.append(KeyedReply(key_of(proxy.cid, res.metrics), proxy, res))
        except ValueError as error:  # a key of the wrong type or size
            reject(f"cid:{proxy.cid}", f"unusable client key: {error}")
        except Exception as error:  # a malformed reply must not stop the server
            reject(f"cid:{proxy.cid}", f"unreadable reply ({error!r})")
    return keyed


def reject_reply(strategy: str, key: str, problem: str, counts: dict[str, Scalar]) -> None:
    """Log why `strategy` rejected the reply of `key` and count it in ``num_rejected``."""
    log(WARNING, "%s: rejected reply of %s: %s", strategy, key, problem)
    counts[NUM_REJECTED] = int(counts[NUM_REJECTED]) + 1
