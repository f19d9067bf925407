"""SecureGrid and the statistic limbs against Flower's own SecAgg+ arithmetic.

`secure_sum` (tests/secagg_emulation.py) runs flwr 1.42's weighting, `quantize` with its
stochastic rounding, the modular sum, `dequantize`, offset and division; grid values
must come out of it exactly, whatever the random rounding draws.
"""

from __future__ import annotations

import numpy as np
import pytest
from secagg_emulation import secure_sum

from flwr_admm.core.secure_sum import SecureGrid, decode_stats, encode_stats


def test_grid_values_pass_secagg_unchanged_and_the_residuals_close_the_sum() -> None:
    grid = SecureGrid(8.0, 1 << 22, scale=3.7)
    rng = np.random.default_rng(0)
    changes = [[rng.normal(size=5) * 20, rng.normal(size=(2, 3))] for _ in range(7)]
    residuals = [[rng.normal(size=5) * 1e-5, rng.normal(size=(2, 3)) * 1e-5] for _ in range(7)]
    sent = [grid.quantize(c, e) for c, e in zip(changes, residuals, strict=True)]
    mean = secure_sum([(x, 1000) for x, _ in sent])
    total = grid.total(mean, len(sent))
    for j in range(2):
        levels = sum(np.rint(x[j] / grid.step) for x, _ in sent)
        np.testing.assert_array_equal(total[j], levels * grid.scale * grid.step)  # exact
        # s sum x_i + sum e_i' = sum (Delta_i + e_i): nothing is lost, to float rounding.
        closed = total[j] + sum(kept[j] for _, kept in sent)
        expected = sum(c[j] + e[j] for c, e in zip(changes, residuals, strict=True))
        np.testing.assert_allclose(closed, expected, rtol=0, atol=1e-12)


def test_stochastic_rounding_would_lose_what_the_grid_keeps() -> None:
    # Off-grid values go through SecAgg+ with a random rounding error: the reason for
    # the grid. 0.3 h is rounded up with probability 0.3.
    grid = SecureGrid()
    values = [np.full(1000, 0.3 * grid.step)]
    mean = secure_sum([(values, 1000), (values, 1000)])
    off = grid.levels(mean, 2)[0]
    assert 0 < off.mean() < 2  # some entries rounded up, some down: not 0.6 each


def test_a_clipped_change_waits_in_the_residual() -> None:
    grid = SecureGrid(8.0, 1 << 22, scale=2.0)
    sent, kept = grid.quantize([np.array([40.0, -3.0])], None)
    assert sent[0][0] == 8.0  # clipped to c
    assert kept[0][0] == pytest.approx(40.0 - 2.0 * 8.0)
    assert abs(kept[0][1]) <= grid.scale * grid.step / 2


def test_statistics_sum_exactly_in_fixed_point() -> None:
    grid = SecureGrid()
    rng = np.random.default_rng(1)
    values = [[float(rng.integers(0, 1 << 40)) / (1 << 30), 0.0, 2.5**20] for _ in range(9)]
    mean = secure_sum([([encode_stats(grid, v)], 1000) for v in values])
    sums = decode_stats(grid, grid.levels(mean, 9)[0], 3)
    assert sums == [sum(v[i] for v in values) for i in range(3)]  # exact: multiples of 2^-30


def test_statistics_refuse_negative_and_non_finite_values() -> None:
    with pytest.raises(ValueError, match="statistics"):
        encode_stats(SecureGrid(), [-1.0])
    with pytest.raises(ValueError, match="statistics"):
        encode_stats(SecureGrid(), [float("nan")])
    with pytest.raises(ValueError, match="negative"):
        decode_stats(SecureGrid(), -np.ones(SecureGrid().num_limbs), 1)


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"clipping_range": 6.0}, "clipping_range"),
        ({"clipping_range": 0.0}, "clipping_range"),
        ({"quantization_range": 3 << 20}, "quantization_range"),
        ({"quantization_range": 4.0}, "quantization_range"),
        ({"scale": float("inf")}, "scale"),
        ({"scale": -1.0}, "scale"),
    ],
)
def test_bad_grid_names_the_field(kwargs: dict, field: str) -> None:
    with pytest.raises(ValueError, match=field):
        SecureGrid(**kwargs)


def test_non_finite_values_are_never_sent() -> None:
    # In SecAgg+ a NaN becomes an arbitrary integer inside the sum: refuse it here.
    with pytest.raises(ValueError, match="finite"):
        SecureGrid().quantize([np.array([1.0, np.nan])], None)
    with pytest.raises(ValueError, match="finite"):
        SecureGrid().quantize([np.array([1.0])], [np.array([np.inf])])
