"""Uplink codecs: bit packing, the stochastic quantizer, top-k, their configs, wire bytes.

References: exact round trips of pack_bits / unpack_bits; a chi-square test of
unbiasedness that the biased round-to-nearest quantizer (the seed's MATLAB one) fails;
error bounds of one quantization level per block; numpy's argsort for top-k; and
Flower's own serializers for the bytes on the wire.

Measured (this machine, `python -m pytest tests/uplink/test_codecs.py -s` prints them):
- 1e5-parameter model, one FitRes serialized by flwr.common.serde.fit_res_to_proto:
  float32 400,402 B; 8 bits 100,195 B (3.996x fewer); 4 bits 50,195 B (7.977x);
  in the 1.42 message form (recorddict_to_proto): 400,565 / 100,358 / 50,358 B
  (3.991x, 7.954x).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from flwr.common import (
    Context,
    FitIns,
    FitRes,
    RecordDict,
    ndarrays_to_parameters,
    parameters_to_ndarrays,
)
from flwr.common.serde import fit_res_to_proto, recorddict_to_proto
from flwr.compat.common import recorddict_compat as compat
from scipy import stats

from flwr_admm.client import ADMMClient
from flwr_admm.models import SoftmaxRegression
from flwr_admm.uplink import StochasticQuantizer, TopK
from flwr_admm.uplink.compression import compressor_from_config, pack_bits, unpack_bits


# ------------------------------------------------------------------ codecs
@pytest.mark.parametrize("bits", range(1, 17))
def test_bit_packing_round_trips_every_width(bits: int) -> None:
    rng = np.random.default_rng(bits)
    values = rng.integers(0, 1 << bits, size=1001, dtype=np.uint32)
    packed = pack_bits(values, bits)
    assert len(packed) == -(-1001 * bits // 8)
    np.testing.assert_array_equal(unpack_bits(packed, bits, 1001), values)


def test_unpack_rejects_wrong_length_and_dirty_padding() -> None:
    packed = pack_bits(np.array([1, 2, 3], dtype=np.uint32), 3)  # 9 bits -> 2 bytes
    with pytest.raises(ValueError, match="bytes"):
        unpack_bits(packed + b"\0", 3, 3)
    dirty = packed[:-1] + bytes([packed[-1] | 0x80])
    with pytest.raises(ValueError, match="padding"):
        unpack_bits(dirty, 3, 3)


def chi2_of_mean_error(decode_many: Callable[[int], np.ndarray], x: np.ndarray) -> float:
    """p-value of H0: E[decode] = x, from N draws and the exact rounding variance."""
    draws = 4000
    samples = np.array([decode_many(seed) for seed in range(draws)])
    lo, hi = x.min(), x.max()
    scale = (hi - lo) / 15
    frac = (x - lo) / scale - np.floor((x - lo) / scale)
    variance = scale**2 * frac * (1 - frac)
    keep = variance > 1e-12 * scale**2  # entries on a level have no rounding noise
    z = (samples.mean(axis=0) - x)[keep] / np.sqrt(variance[keep] / draws)
    return float(stats.chi2.sf(np.sum(z**2), df=int(keep.sum())))


def test_stochastic_rounding_is_unbiased_and_the_test_can_fail() -> None:
    x = np.random.default_rng(7).normal(size=200)
    quantizer = StochasticQuantizer(bits=4)

    def unbiased(seed: int) -> np.ndarray:
        payload = quantizer.encode([x], np.random.default_rng(seed))
        return quantizer.decode(payload, [x.shape])[0]

    assert chi2_of_mean_error(unbiased, x) > 1e-3
    # Round-to-nearest (the seed's MATLAB quantizer) is biased: same test, p ~ 0.
    lo, scale = x.min(), (x.max() - x.min()) / 15

    def nearest(seed: int) -> np.ndarray:
        return lo + np.round((x - lo) / scale) * scale

    assert chi2_of_mean_error(nearest, x) < 1e-12


@pytest.mark.parametrize("block_size", [None, 7, 64])
def test_quantizer_error_is_below_one_level_of_its_block(block_size: int | None) -> None:
    x = np.random.default_rng(3).normal(size=(30, 11)) * np.linspace(0.1, 10, 11)
    quantizer = StochasticQuantizer(bits=3, block_size=block_size)
    decoded = quantizer.decode(quantizer.encode([x], np.random.default_rng(0)), [x.shape])[0]
    flat, out = x.ravel(), decoded.ravel()
    block = block_size or flat.size
    for start in range(0, flat.size, block):
        part = flat[start : start + block]
        level = (part.max() - part.min()) / 7
        slack = 1e-6 * (level + np.abs(part).max())  # float32 block parameters
        assert np.all(np.abs(out[start : start + block] - part) <= level + slack)
        assert out[start : start + block].min() >= part.min() - slack
        assert out[start : start + block].max() <= part.max() + slack


def test_quantizer_handles_constant_and_empty_tensors() -> None:
    quantizer = StochasticQuantizer(bits=8)
    arrays = [np.full((4, 3), 2.5), np.zeros(0), np.array([-1e-3])]
    decoded = quantizer.decode(
        quantizer.encode(arrays, np.random.default_rng(0)), [a.shape for a in arrays]
    )
    for a, b in zip(arrays, decoded, strict=True):
        np.testing.assert_allclose(b, a, rtol=1e-7)


def test_topk_keeps_exactly_the_largest_entries() -> None:
    x = np.random.default_rng(5).normal(size=(40, 25))
    topk = TopK(fraction=0.1)
    decoded = topk.decode(topk.encode([x], np.random.default_rng(0)), [x.shape])[0]
    k = 100
    largest = np.argsort(-np.abs(x.ravel()))[:k]
    assert np.count_nonzero(decoded) == k
    assert set(np.flatnonzero(decoded)) == set(largest.tolist())
    np.testing.assert_array_equal(decoded.ravel()[largest], x.ravel()[largest].astype(np.float32))


@pytest.mark.parametrize(
    "compressor",
    [
        StochasticQuantizer(bits=5, block_size=32, error_feedback=False),
        StochasticQuantizer(bits=16),
        TopK(fraction=0.3),
    ],
)
def test_config_round_trips(compressor: Any) -> None:
    parsed = compressor_from_config(compressor.config())
    assert repr(parsed) == repr(compressor)


@pytest.mark.parametrize(
    ("kwargs_or_config", "field"),
    [
        ({"bits": 0}, "bits"),
        ({"bits": 17}, "bits"),
        ({"bits": 8, "block_size": 0}, "block_size"),
        ({"fraction": 0.0}, "fraction"),
        ({"fraction": 1.5}, "fraction"),
        ({"uplink": "zip"}, "uplink"),
        ({"uplink": "sq", "uplink-bits": 2.5}, "uplink-bits"),
    ],
)
def test_bad_settings_are_errors_naming_the_field(
    kwargs_or_config: dict[str, Any], field: str
) -> None:
    with pytest.raises(ValueError, match=field):
        if "uplink" in kwargs_or_config:
            compressor_from_config(kwargs_or_config)
        elif "fraction" in kwargs_or_config:
            TopK(**kwargs_or_config)
        else:
            StochasticQuantizer(**kwargs_or_config)


# -------------------------------------------------------------- wire bytes
def serialized_sizes(res: FitRes) -> tuple[int, int]:
    """Bytes of the legacy FitRes proto and of the 1.42 message content."""
    legacy = fit_res_to_proto(res).ByteSize()
    record = recorddict_to_proto(compat.fitres_to_recorddict(res, keep_input=True)).ByteSize()
    return legacy, record


def test_payload_bytes_vs_float32_on_a_1e5_parameter_model() -> None:
    model = SoftmaxRegression(9999, 10)  # 99,990 + 10 = 100,000 parameters
    rng = np.random.default_rng(0)
    X, y = rng.normal(size=(40, 9999)), np.arange(40) % 10
    start = ndarrays_to_parameters(model.init_params(0))
    sizes: dict[str, tuple[int, int]] = {}
    for name, compressor in [
        ("plain", None),
        ("8 bits", StochasticQuantizer(bits=8)),
        ("4 bits", StochasticQuantizer(bits=4)),
        ("topk 0.1", TopK(fraction=0.1)),
    ]:
        context = Context(0, 1, {"partition-id": 0}, RecordDict(), {})
        client = ADMMClient(model, X, y, context=context, local_steps=2).to_client()
        config = {"rho": 0.1, **(compressor.config() if compressor else {})}
        res = client.fit(FitIns(start, config))
        expected = compressor.tensor_type if compressor else "numpy.ndarray"
        assert res.parameters.tensor_type == expected
        sizes[name] = serialized_sizes(res)
        if compressor is None:
            arrays = [a.astype(np.float32) for a in parameters_to_ndarrays(res.parameters)]
            f32 = FitRes(res.status, ndarrays_to_parameters(arrays), res.num_examples, res.metrics)
            sizes["float32"] = serialized_sizes(f32)
    for form in (0, 1):
        ratio8 = sizes["float32"][form] / sizes["8 bits"][form]
        ratio4 = sizes["float32"][form] / sizes["4 bits"][form]
        print(f"form {form}: {sizes} -> 8 bits {ratio8:.3f}x, 4 bits {ratio4:.3f}x fewer")
        assert ratio8 >= 3.9
        assert ratio4 >= 7.5
        assert sizes["float32"][form] / sizes["topk 0.1"][form] >= 6.0
