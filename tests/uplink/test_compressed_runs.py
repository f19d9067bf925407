"""Compression inside federated runs: rejection of bad payloads, error feedback, the
baseline wrapper, and convergence of FedADMM on seed-logreg when compressing.

References: the pooled seed-logreg optimum (scipy, tests/centralized.py) for the gaps;
an uncompressed twin client for the error-feedback residual; each client's own NumPy
fit for the wrapper's average. A compressed run in Flower's Simulation Engine is in
tests/apps/test_ray_engine.py (the legacy API's engine-equals-driver run).

Measured (this machine, `python -m pytest tests/uplink/test_compressed_runs.py -s`
prints them):
- seed-logreg, FedADMM rho 0.1, 20 local steps, lr 1.0, 100 rounds, error feedback:
  8 bits: gap <= 1e-4 from round 10, 4.6e-7 at round 100 (max of the last 20
  rounds 1.3e-6); 4 bits: <= 1e-3 from round 8, <= 1e-4 first at round 17, 2.3e-4
  at round 100 (max of the last 20 rounds 3.6e-4): 4 bits meets 1e-3, not 1e-4.
"""

from __future__ import annotations

import copy
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
from flwr.server.strategy import FedAvg, FedProx

from flwr_admm import Uplink
from flwr_admm.client import ADMMClient
from flwr_admm.protocol import STATE_RESIDUAL
from flwr_admm.server.fedadmm import textbook
from flwr_admm.testing import make_proxies, run_rounds
from flwr_admm.uplink import StochasticQuantizer, UplinkWrapper

CLIENT = {"local_steps": 20, "learning_rate": 1.0}


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

    strategy = textbook(
        rho=0.1, uplink=Uplink(StochasticQuantizer(bits=8)), initial_parameters=zeros_parameters()
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

    strategy = textbook(
        rho=0.1, uplink=Uplink(StochasticQuantizer(bits=8)), initial_parameters=zeros_parameters()
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
        textbook, rounds, client_kwargs=CLIENT, rho=0.1, **strategy_kwargs
    )
    assert all(m["num_rejected"] == 0 for m in result.fit_metrics)
    return np.array([(pooled.objective(z) - f_star) / abs(f_star) for z in recorder.matrix])


def first_below(gap: np.ndarray, tol: float) -> int | None:
    hits = np.flatnonzero(gap <= tol)
    return int(hits[0]) + 1 if hits.size else None


def test_seed_logreg_8_bits_with_error_feedback_reaches_1e4() -> None:
    gap = seed_gaps(100, uplink=Uplink(StochasticQuantizer(bits=8)))
    print(f"8 bits: <=1e-4 at round {first_below(gap, 1e-4)}, final {gap[-1]:.2e}")
    reached = first_below(gap, 1e-4)
    assert reached is not None and reached <= 100
    assert gap[-20:].max() <= 1e-5  # measured 1.3e-6: it stays there


def test_seed_logreg_4_bits_with_error_feedback_reaches_1e3() -> None:
    gap = seed_gaps(100, uplink=Uplink(StochasticQuantizer(bits=4)))
    print(f"4 bits: <=1e-3 at round {first_below(gap, 1e-3)}, final {gap[-1]:.2e}")
    reached = first_below(gap, 1e-3)
    assert reached is not None and reached <= 100
    assert gap[-20:].max() <= 1e-3  # measured 3.6e-4 (1e-4 is not held at 4 bits)
