"""The keyword checks both translators share, and the error of an early aggregate call."""

from __future__ import annotations

import numbers
from collections.abc import Sequence


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
