"""Exact sums through SecAgg+'s clipped, quantized integer arithmetic (numpy only).

Flower's SecAgg+ (`secaggplus_mod`) weights a client's values by
num_examples / max_weight, clips them to [-c, c], maps x to the integer level
(x + c) T / (2c) by stochastic rounding and sums the masked levels modulo M; the
server unmasks only the sum and hands `aggregate_fit` the weighted mean. A client that
reports num_examples = max_weight (weight exactly 1) and sends only grid values
x = k h, h = 2c / T, |k| <= T/2, passes that pipeline unchanged: (k h + c) T / (2c) =
k + T/2 is an integer (exactly so in float64 when c and T are powers of two) and
stochastic rounding leaves integers alone. The server then recovers sum_i k_i exactly
(`SecureGrid.levels`). Two encodings use this:

    contribution change, with error feedback (as the uplink compression residual):
        k = clip(round((Delta_i + e_i) / (s h)), -T/2, T/2),  x = k h      sent
        e_i' = Delta_i + e_i - s h k                                        kept
    so S += s h sum_i k_i keeps S = sum_i n_i c_i - sum_i e_i at all times; clipping
    only delays the clipped part (it stays in e_i), it never loses it.

    statistics (numbers v >= 0 such as n_i ||w_i||^2): the fixed-point integer
    K = round(v 2^F) split in L limbs of B bits (B = log2(T) - 1, so a limb is a level
    <= T/2), sent as limb h; the server recombines sum_i v_i = sum_j (sum_i limb_ij)
    2^(B j) / 2^F exactly (`decode_stats`). v is capped at 2^(L B - F).

The modular sum does not wrap while m T < M (m clients a round), Flower's own bound.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from flwr_admm.core.types import Arrays

__all__ = ["SecureGrid", "decode_stats", "encode_stats"]

FRACTION_BITS = 30  # F: statistics are summed with a resolution of 2^-30
TOTAL_BITS = 84  # L B >= 84: statistics up to 2^54 (about 1.8e16)


def _power_of_two(value: float) -> bool:
    return value > 0 and math.isfinite(value) and math.frexp(value)[0] == 0.5


@dataclass(frozen=True)
class SecureGrid:
    """SecAgg+'s clipping range c and quantization range T, with the common scale s.

    The server's sum of grid values is exact when c and T are powers of two (checked).
    """

    clipping_range: float = 8.0
    quantization_range: int = 1 << 22
    scale: float = 1.0

    def __post_init__(self) -> None:
        if isinstance(self.clipping_range, bool) or not _power_of_two(float(self.clipping_range)):
            raise ValueError(
                "clipping_range: must be a power of two (e.g. 8.0, SecAgg+'s default) for "
                f"exact sums, got {self.clipping_range!r}"
            )
        levels = self.quantization_range
        if isinstance(levels, bool) or not isinstance(levels, int) or levels < 8:
            raise ValueError(f"quantization_range: must be an integer >= 8, got {levels!r}")
        if not _power_of_two(float(levels)):
            raise ValueError(
                f"quantization_range: must be a power of two (default 2**22), got {levels!r}"
            )
        if isinstance(self.scale, bool) or not (
            isinstance(self.scale, int | float) and math.isfinite(self.scale) and self.scale > 0
        ):
            raise ValueError(f"scale: must be a finite number > 0, got {self.scale!r}")

    @property
    def step(self) -> float:
        """Return h = 2c / T, the spacing of the grid."""
        return 2.0 * float(self.clipping_range) / self.quantization_range

    @property
    def max_level(self) -> int:
        """Return T / 2, the largest |k| a client may send."""
        return self.quantization_range // 2

    @property
    def limb_bits(self) -> int:
        """Return B = log2(T) - 1: a limb 0 <= l < 2^B is a level <= T/2."""
        return self.quantization_range.bit_length() - 2

    @property
    def num_limbs(self) -> int:
        """Return L = ceil(84 / B), the limbs of one statistic."""
        return -(-TOTAL_BITS // self.limb_bits)

    def quantize(self, values: Arrays, residual: Arrays | None) -> tuple[Arrays, Arrays]:
        """Return (x, e'): x = k h, k = clip(round((v + e) / (s h)), +-T/2), e' = v + e - s h k.

        ValueError if v + e is not finite: SecAgg+ would turn NaN into an arbitrary
        integer inside the sum, where no server check can find it; the client must not
        send it (its fit fails instead: a dropout, which SecAgg+ handles).
        """
        unit = float(self.scale) * self.step
        sent, kept = [], []
        for i, value in enumerate(values):
            target = value if residual is None else value + residual[i]
            if not np.isfinite(target).all():
                raise ValueError("secure sum: the values to send must be finite")
            levels = np.clip(np.rint(target / unit), -self.max_level, self.max_level)
            sent.append(levels * self.step)
            kept.append(target - unit * levels)
        return sent, kept

    def levels(self, mean: Sequence[NDArray[np.generic]], count: int) -> list[NDArray[np.float64]]:
        """Return sum_i k_i from SecAgg+'s mean of `count` clients' grid values (integers)."""
        return [np.rint(np.asarray(t, dtype=np.float64) * count / self.step) for t in mean]

    def total(self, mean: Sequence[NDArray[np.generic]], count: int) -> Arrays:
        """Return s h sum_i k_i: the exact sum of what the clients' `quantize` sent, times s."""
        unit = float(self.scale) * self.step
        return [unit * levels for levels in self.levels(mean, count)]


def encode_stats(grid: SecureGrid, values: Sequence[float]) -> NDArray[np.float64]:
    """Return the limbs of round(v 2^F) for each v >= 0 (capped), as grid values limb h."""
    bits, count = grid.limb_bits, grid.num_limbs
    cap = (1 << (bits * count)) - 1
    limbs = np.zeros(len(values) * count)
    for i, value in enumerate(values):
        if not (math.isfinite(value) and value >= 0):
            raise ValueError(f"statistics must be finite numbers >= 0, got {value!r}")
        fixed = min(round(math.ldexp(value, FRACTION_BITS)), cap)
        for j in range(count):
            limbs[i * count + j] = (fixed >> (bits * j)) & ((1 << bits) - 1)
    return limbs * grid.step


def decode_stats(grid: SecureGrid, level_sums: NDArray[np.float64], num_values: int) -> list[float]:
    """Return sum_i v_i of each statistic from the summed limbs (`SecureGrid.levels`).

    ValueError if the sums do not have the expected size or a limb sum is negative.
    """
    bits, count = grid.limb_bits, grid.num_limbs
    flat = np.asarray(level_sums).reshape(-1)
    if flat.size != num_values * count:
        raise ValueError(f"expected {num_values * count} statistic limbs, got {flat.size}")
    if np.any(flat < 0):
        raise ValueError("a statistic's limb sum is negative")
    sums = []
    for i in range(num_values):
        fixed = sum(int(flat[i * count + j]) << (bits * j) for j in range(count))
        sums.append(fixed / (1 << FRACTION_BITS))
    return sums
