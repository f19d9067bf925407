"""Deterministic client sampling and the keyword checks both APIs share.

`FedADMM` and `FedADMMClientDuals` key every reply by a stable client key
(`flwr_admm.rounds.identity`) and sample clients deterministically: with a
`sampling_seed`, round k draws from the clients ordered by key, then cid, with a
generator seeded by (sampling_seed, k). Both APIs use the same draw (`sample_ids`)
and keyword checks (`check_sizes`, `check_sampling_seed`), so they pick the same
clients.
"""

from __future__ import annotations

import functools
import numbers
import random
from collections.abc import Iterable, Mapping, Sequence
from typing import TypeVar

import numpy as np

from flwr_admm.core.types import natural_key

IdT = TypeVar("IdT", int, str)  # a legacy cid or a Message-API node id


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
