"""Helpers shared by the ADMM strategies: keyword checks, sampling, reply keys, records.

`FedADMM` and `FedADMMClientDuals` key every reply by a stable client key
(`flwr_admm.rounds.identity`) and sample clients deterministically: with a
`sampling_seed`, round k draws from the clients ordered by key, then cid, with a
generator seeded by (sampling_seed, k). The Message-API strategy
(`flwr_admm.serverapp`) uses the same draw (`sample_ids`) and keyword checks
(`check_sizes`, `check_sampling_seed`), so both APIs pick the same clients.
"""

from __future__ import annotations

import functools
import numbers
import random
from collections.abc import Callable, Iterable, Mapping, Sequence
from logging import INFO, WARNING
from typing import Any, NamedTuple, TypeVar

import numpy as np
from flwr.common import FitIns, FitRes, Scalar
from flwr.common.logger import log
from flwr.server.client_manager import ClientManager
from flwr.server.client_proxy import ClientProxy
from flwr.server.strategy import FedAvg

from flwr_admm.core.types import natural_key
from flwr_admm.protocol import (
    NUM_REJECTED,
    RESERVED_CONFIG_KEYS,
    RESERVED_CONFIG_PREFIXES,
    ROUND,
    SERVER_ROUND,
)
from flwr_admm.rounds.report import without_reply_keys

IdT = TypeVar("IdT", int, str)  # a legacy cid or a Message-API node id


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


def check_sizes(strategy: object, fractions: Sequence[str], counts: Sequence[str]) -> None:
    """Refuse a fraction outside [0, 1] or a count that is not an integer >= 0.

    `fractions` and `counts` name the strategy's attributes (Flower's legacy and
    Message-API FedAvg call them differently); the ValueError names the field.
    """
    for name in fractions:
        fraction = getattr(strategy, name)
        if isinstance(fraction, bool) or not (
            isinstance(fraction, numbers.Real) and 0.0 <= float(fraction) <= 1.0
        ):
            raise ValueError(f"{name}: must be a number in [0, 1], got {fraction!r}")
    for name in counts:
        count = getattr(strategy, name)
        if isinstance(count, bool) or not isinstance(count, numbers.Integral) or count < 0:
            raise ValueError(f"{name}: must be an integer >= 0, got {count!r}")


def check_sampling_seed(sampling_seed: int | None) -> None:
    """Refuse a `sampling_seed` that is neither None nor an integer >= 0 (ValueError)."""
    if sampling_seed is not None and (
        isinstance(sampling_seed, bool)
        or not isinstance(sampling_seed, numbers.Integral)
        or sampling_seed < 0
    ):
        raise ValueError(f"sampling_seed: must be None or an integer >= 0, got {sampling_seed!r}")


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
    strategy: FedAvg,
    client_manager: ClientManager,
    server_round: int,
    sampling_seed: int | None,
    key_of_cid: dict[str, str],
) -> list[ClientProxy]:
    """Wait for `min_available_clients`, THEN size the sample from who is there.

    (Sizing first, as Flower's FedAvg does, samples too few clients when nodes are
    still registering at round 1 in the simulation engine.) With a `sampling_seed`
    the sample is drawn from the clients ordered by key (`key_of_cid`), then cid,
    with a generator seeded by (sampling_seed, server_round).
    """
    _, min_num = strategy.num_fit_clients(client_manager.num_available())
    client_manager.wait_for(min_num, timeout=86400)
    size, _ = strategy.num_fit_clients(client_manager.num_available())
    if sampling_seed is None:
        return client_manager.sample(num_clients=size, min_num_clients=min_num)
    available = client_manager.all()
    if size > len(available):
        log(
            INFO,
            "%s: sampling %s clients but only %s available",
            type(strategy).__name__,
            size,
            len(available),
        )
        return []
    order = sample_ids(available, size, server_round, sampling_seed, key_of_cid)
    return [available[cid] for cid in order]


# Sort keys of client keys and ids, parsed once per string instead of twice per client
# every round: without the cache, ordering 10,000 clients cost ~0.15 s a round, more
# than the round itself (benchmarks/scale.py). Bounded, so a churning federation
# cannot grow it without limit.
SORT_KEY_CACHE_SIZE = 1 << 17


@functools.lru_cache(maxsize=SORT_KEY_CACHE_SIZE)
def sort_key(text: str) -> tuple[object, ...]:
    """Return `natural_key(text)`, memoized (the sampling order's key)."""
    return natural_key(text)


def sample_ids(
    ids: Iterable[IdT],
    size: int,
    server_round: int,
    sampling_seed: int | None,
    key_of: Mapping[str, str],
) -> list[IdT]:
    """Return `size` of `ids` (all if fewer), ordered by (client key, id).

    `key_of` maps an id (as str) to the client key it speaks for; unknown ids sort
    last. With a `sampling_seed`, round k picks ``default_rng([sampling_seed, k])
    .choice(len(ids), size, replace=False)`` of that order, so a run is reproducible
    and both APIs pick the same clients; None draws with `random`, as Flower does.
    """
    order = sorted(ids, key=lambda i: (sort_key(key_of.get(str(i), "~")), sort_key(str(i))))
    if size >= len(order):
        return order
    if sampling_seed is None:
        picked = sorted(random.sample(range(len(order)), size))
    else:
        rng = np.random.default_rng([sampling_seed, server_round])
        picked = [int(i) for i in np.sort(rng.choice(len(order), size=size, replace=False))]
    return [order[i] for i in picked]


def unconfigured(strategy: str, aggregate: str, configure: str) -> ValueError:
    """Return the error of an `aggregate` call before any `configure` call.

    Every strategy of the package reads a reply against what `configure` sent that
    node (FedADMM: the center v_i = z - u_i; SCAFFOLD, FedDyn, FedNova: x); before the
    first `configure` call nothing was sent.
    """
    return ValueError(
        f"{strategy}.{aggregate}: call {configure} first (each reply is read against "
        f"what {configure} sent its node; nothing was sent yet)"
    )


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
