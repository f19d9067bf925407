"""Uplink compression: codecs, wire bytes, rejection of bad payloads, error feedback,
the baseline wrapper, and convergence of FedADMM on seed-logreg when compressing.

Measured (this machine, `python -m pytest tests/test_compression.py -s` prints them):
- 1e5-parameter model, one FitRes serialized by flwr.common.serde.fit_res_to_proto:
  float32 400,377 B; 8 bits 100,170 B (3.997x fewer); 4 bits 50,170 B (7.980x);
  in the 1.42 message form (recorddict_to_proto): 400,540 / 100,333 / 50,333 B
  (3.992x, 7.958x).
- seed-logreg, FedADMM rho 0.1, 20 local steps, lr 1.0, 100 rounds, error feedback:
  8 bits: gap <= 1e-4 from round 10, 4.6e-7 at round 100 (max of the last 20
  rounds 1.3e-6); 4 bits: <= 1e-3 from round 8, <= 1e-4 first at round 17, 2.3e-4
  at round 100 (max of the last 20 rounds 3.6e-4): 4 bits meets 1e-3, not 1e-4.
- residual "dual" (the client holds the residual as its share of the dual) ends at
  1.5e-5 (8 bits) and 8.9e-3 (4 bits): worse than error feedback, which stays the
  default.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from centralized import Pooled, ridge_optimum
from flower_run import (
    NUM_CLIENTS,
    C,
    D,
    admm_client_fn,
    run_seed,
    seed_data,
    seed_model,
    zeros_parameters,
)
from flwr.client import Client, NumPyClient
from flwr.common import (
    Context,
    FitIns,
    FitRes,
    Parameters,
    RecordDict,
    ndarrays_to_parameters,
    parameters_to_ndarrays,
)
from flwr.common.serde import fit_res_to_proto, recorddict_to_proto
from flwr.compat.common import recorddict_compat as compat
from flwr.server.strategy import FedAvg, FedProx
from scipy import stats

from flwr_admm import ADMMClient, FedADMM, StochasticQuantizer, TopK, UplinkWrapper
from flwr_admm.client.admm_client import STATE_RESIDUAL
from flwr_admm.models import SoftmaxRegression
from flwr_admm.testing import make_proxies, run_rounds
from flwr_admm.uplink.compression import compressor_from_config, pack_bits, unpack_bits

CLIENT = {"local_steps": 20, "learning_rate": 1.0}


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


# ---------------------------------------------------------- bad payloads
def corrupt(parameters: Parameters, how: str) -> Parameters:
    tensors = list(parameters.tensors)
    if how == "flip":
        body = bytearray(tensors[0])
        body[-1] ^= 0x01
        tensors[0] = bytes(body)
    elif how == "truncate":
        tensors[0] = tensors[0][:-3]
    elif how == "extra":
        tensors.append(tensors[0])
    elif how == "type":
        return Parameters(tensors=tensors, tensor_type="flwr_admm.topk/v1")
    elif how == "bits":
        x = StochasticQuantizer(bits=4).encode([np.ones(D)], np.random.default_rng(0))
        return x
    return Parameters(tensors=tensors, tensor_type=parameters.tensor_type)


class Corrupting(Client):
    """Wrap a client; mangle its fit payload in the scripted way."""

    def __init__(self, inner: Client, how: str | None) -> None:
        self.inner, self.how = inner, how

    def fit(self, ins: FitIns) -> FitRes:
        res = self.inner.fit(ins)
        if self.how is not None:
            res.parameters = corrupt(res.parameters, self.how)
        return res


def test_corrupted_or_inconsistent_payloads_are_rejected() -> None:
    make = admm_client_fn(**CLIENT)
    faults = {0: "flip", 1: "truncate", 2: "extra", 3: "type", 4: "bits"}

    def client_fn(context: Context) -> Client:
        pid = int(context.node_config["partition-id"])
        return Corrupting(make(context).to_client(), faults.get(pid))

    strategy = FedADMM(
        rho=0.1, uplink=StochasticQuantizer(bits=8), initial_parameters=zeros_parameters()
    )
    result = run_rounds(strategy, make_proxies(client_fn, NUM_CLIENTS), 3)
    for metrics in result.fit_metrics:
        assert metrics["num_rejected"] == len(faults)
        assert metrics["num_replies"] == NUM_CLIENTS - len(faults)
    assert strategy.admm is not None
    assert sorted(strategy.admm.records) == [f"partition-id:{i}" for i in range(5, 10)]
    assert np.all(np.isfinite(strategy.admm.z[0]))


def test_plain_numpy_replies_are_accepted_as_full_precision() -> None:
    make = admm_client_fn(**CLIENT)

    def client_fn(context: Context) -> Client:
        # Flower's own NumPyClient wrapper: ignores the packed payload, sends arrays.
        return NumPyClient.to_client(make(context))

    strategy = FedADMM(
        rho=0.1, uplink=StochasticQuantizer(bits=8), initial_parameters=zeros_parameters()
    )
    result = run_rounds(strategy, make_proxies(client_fn, NUM_CLIENTS), 2)
    assert [m["num_rejected"] for m in result.fit_metrics] == [0, 0]
    assert result.fit_metrics[-1]["uplink_bytes"] > 10 * 8 * D  # float64 arrays


# ---------------------------------------------------------- error feedback
def test_error_feedback_residual_persists_in_context_state() -> None:
    data = seed_data()
    context = Context(0, 1, {"partition-id": 0}, RecordDict(), {})
    quantizer = StochasticQuantizer(bits=2)

    def client(ctx: Context) -> ADMMClient:
        return ADMMClient(seed_model(), data.X[0], data.y[0], context=ctx, **CLIENT)

    config = {"rho": 0.1, **quantizer.config()}
    received = [np.linspace(-1, 1, D)]
    # Twin without compression: the same local solve, so w_i is known exactly.
    twin = copy.deepcopy(context)
    w1 = client(twin).fit(received, {**config, "uplink": "none", "server_round": 1})[0]
    reply1 = (
        client(context)
        .to_client()
        .fit(FitIns(ndarrays_to_parameters(received), {**config, "server_round": 1}))
    )
    sent1 = quantizer.decode(reply1.parameters, [(D,)])[0]
    residual1 = context.state.array_records[STATE_RESIDUAL].to_numpy_ndarrays()[0]
    np.testing.assert_allclose(residual1, (w1[0] - received[0]) - sent1, rtol=0, atol=1e-15)
    assert np.linalg.norm(residual1) > 0

    twin = copy.deepcopy(context)
    w2 = client(twin).fit(received, {**config, "uplink": "none", "server_round": 2})[0]
    reply2 = (
        client(context)
        .to_client()
        .fit(FitIns(ndarrays_to_parameters(received), {**config, "server_round": 2}))
    )
    sent2 = quantizer.decode(reply2.parameters, [(D,)])[0]
    residual2 = context.state.array_records[STATE_RESIDUAL].to_numpy_ndarrays()[0]
    # The second payload carried w2 - c + residual1; what it could not carry is kept.
    np.testing.assert_allclose(
        residual2, (w2[0] - received[0] + residual1) - sent2, rtol=0, atol=1e-15
    )
    # A round without compression drops the residual.
    client(context).fit(received, {"rho": 0.1, "server_round": 3})
    assert STATE_RESIDUAL not in context.state.array_records


def test_dual_residual_needs_an_admm_server() -> None:
    data = seed_data()
    client = ADMMClient(seed_model(), data.X[0], data.y[0])
    config = {**StochasticQuantizer(bits=8).config(), "uplink-residual": "dual"}
    with pytest.raises(ValueError, match="uplink-residual"):
        client.fit([np.zeros(D)], config)
    with pytest.raises(ValueError, match="uplink_residual"):
        FedADMM(uplink=StochasticQuantizer(bits=8), uplink_residual="server")  # type: ignore[arg-type]


# ------------------------------------------------------- baseline wrapper
@pytest.mark.parametrize("inner", ["FedAvg", "FedProx"])
def test_wrapper_gives_the_baseline_the_decoded_replies(inner: str) -> None:
    quantizer = StochasticQuantizer(bits=4)
    common: dict[str, Any] = {"initial_parameters": zeros_parameters()}
    base = FedAvg(**common) if inner == "FedAvg" else FedProx(proximal_mu=0.1, **common)
    strategy = UplinkWrapper(base, uplink=quantizer)
    make = admm_client_fn(**CLIENT)
    proxies = make_proxies(make, NUM_CLIENTS)
    result = run_rounds(strategy, proxies, 1)
    assert result.fit_metrics[0]["num_rejected"] == 0
    # Independently: each client's NumPy fit returns exactly c + decoded delta.
    config = {**quantizer.config(), "server_round": 1}
    if inner == "FedProx":
        config["proximal_mu"] = 0.1
    replies = []
    for i in range(NUM_CLIENTS):
        context = Context(0, i + 1, {"partition-id": i, "num-partitions": 10}, RecordDict(), {})
        replies.append(make(context).fit([np.zeros(D)], dict(config))[0][0])
    assert result.parameters is not None
    np.testing.assert_allclose(
        parameters_to_ndarrays(result.parameters)[0], np.mean(replies, axis=0), atol=1e-15
    )
    per_client = 16 + 8 + -(-D * 4 // 8)  # header, lo + scale, packed 4-bit levels
    assert result.fit_metrics[0]["uplink_bytes"] == NUM_CLIENTS * per_client


# ------------------------------------------------------------ convergence
def seed_gaps(rounds: int, **strategy_kwargs: Any) -> np.ndarray:
    data = seed_data()
    pooled = Pooled.of(data.X, data.y, C)
    f_star = pooled.objective(ridge_optimum(pooled))
    _, recorder, result = run_seed(
        FedADMM, rounds, client_kwargs=CLIENT, rho=0.1, **strategy_kwargs
    )
    assert all(m["num_rejected"] == 0 for m in result.fit_metrics)
    return np.array([(pooled.objective(z) - f_star) / abs(f_star) for z in recorder.matrix])


def first_below(gap: np.ndarray, tol: float) -> int | None:
    hits = np.flatnonzero(gap <= tol)
    return int(hits[0]) + 1 if hits.size else None


def test_seed_logreg_8_bits_with_error_feedback_reaches_1e4() -> None:
    gap = seed_gaps(100, uplink=StochasticQuantizer(bits=8))
    print(f"8 bits: <=1e-4 at round {first_below(gap, 1e-4)}, final {gap[-1]:.2e}")
    reached = first_below(gap, 1e-4)
    assert reached is not None and reached <= 100
    assert gap[-20:].max() <= 1e-5  # measured 1.3e-6: it stays there


def test_seed_logreg_4_bits_with_error_feedback_reaches_1e3() -> None:
    gap = seed_gaps(100, uplink=StochasticQuantizer(bits=4))
    print(f"4 bits: <=1e-3 at round {first_below(gap, 1e-3)}, final {gap[-1]:.2e}")
    reached = first_below(gap, 1e-3)
    assert reached is not None and reached <= 100
    assert gap[-20:].max() <= 1e-3  # measured 3.6e-4 (1e-4 is not held at 4 bits)


def test_error_feedback_beats_the_dual_residual_variant_at_4_bits() -> None:
    update = seed_gaps(60, uplink=StochasticQuantizer(bits=4))
    dual = seed_gaps(60, uplink=StochasticQuantizer(bits=4), uplink_residual="dual")
    print(f"4 bits, last 20 rounds: update {update[-20:].mean():.2e}, dual {dual[-20:].mean():.2e}")
    assert update[-20:].mean() < dual[-20:].mean() / 5


# ------------------------------------------------------ Flower's real engine
@pytest.mark.ray
def test_compressed_run_in_the_simulation_engine_matches_the_driver() -> None:
    from flwr.client import ClientApp
    from flwr.server import ServerApp, ServerAppComponents, ServerConfig
    from flwr.simulation import run_simulation

    rounds = 3

    def strategy() -> FedADMM:
        return FedADMM(
            rho=0.1,
            uplink=StochasticQuantizer(bits=4),
            initial_parameters=zeros_parameters(),
            min_available_clients=NUM_CLIENTS,
        )

    ray_strategy = strategy()
    make = admm_client_fn(**CLIENT)
    run_simulation(
        server_app=ServerApp(
            server_fn=lambda ctx: ServerAppComponents(
                strategy=ray_strategy, config=ServerConfig(num_rounds=rounds)
            )
        ),
        client_app=ClientApp(client_fn=lambda ctx: make(ctx).to_client()),
        num_supernodes=NUM_CLIENTS,
        backend_config={
            "client_resources": {"num_cpus": 1, "num_gpus": 0.0},
            "init_args": {"num_cpus": 2, "include_dashboard": False},
        },
    )
    local = strategy()
    run_rounds(local, make_proxies(make, NUM_CLIENTS), rounds)
    assert ray_strategy.admm is not None and local.admm is not None
    assert [h["num_rejected"] for h in ray_strategy.history] == [0] * rounds
    assert [h["uplink_bytes"] for h in ray_strategy.history] == [
        h["uplink_bytes"] for h in local.history
    ]
    np.testing.assert_allclose(ray_strategy.admm.z[0], local.admm.z[0], rtol=1e-12, atol=0)
