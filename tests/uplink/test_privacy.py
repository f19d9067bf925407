"""Differential privacy: local clipping + noise on the client, the RDP ledger, and
FedADMM inside Flower's own DP wrappers (server-side clipping; client-side clipping
with ``fixedclipping_mod`` through the real Message path).

References: scipy's chi-square distribution for the noise, dp-accounting's own
RdpAccountant (called directly, not through flwr_admm or Flower) for epsilon.
"""

from __future__ import annotations

import math
import time
from typing import Any

import dp_accounting
import numpy as np
import pytest
from flower_run import NUM_CLIENTS, D, admm_client_fn, run_seed, zeros_parameters
from flwr.app import Metadata
from flwr.app.message.message import make_message
from flwr.client import Client, ClientApp
from flwr.client.mod import fixedclipping_mod
from flwr.common import (
    Context,
    EvaluateIns,
    EvaluateRes,
    FitIns,
    FitRes,
    NDArrays,
    RecordDict,
    parameters_to_ndarrays,
)
from flwr.compat.common import recorddict_compat as compat
from flwr.server.client_proxy import ClientProxy
from flwr.server.strategy import (
    DifferentialPrivacyClientSideFixedClipping,
    DifferentialPrivacyServerSideFixedClipping,
    FedAvg,
)
from scipy import stats

from flwr_admm import Checkpointing, Uplink
from flwr_admm.client import ADMMClient
from flwr_admm.core.settings import TEXTBOOK
from flwr_admm.models import SoftmaxRegression
from flwr_admm.server import FedADMM
from flwr_admm.server.fedadmm import textbook
from flwr_admm.testing import InProcessClientProxy, make_proxies, run_rounds
from flwr_admm.uplink import LocalDP, PrivacyLedger, StochasticQuantizer, UplinkWrapper
from flwr_admm.uplink.privacy import RDP_ORDERS, clip_update, update_norm

CLIENT = {"local_steps": 20, "learning_rate": 1.0}
RHO = 0.1


def std_p_value(samples: np.ndarray, std: float) -> float:
    """Two-sided chi-square p-value of H0: samples ~ N(0, std^2) (known mean 0)."""
    statistic = float(np.sum((samples / std) ** 2))
    cdf = stats.chi2.cdf(statistic, df=samples.size)
    return float(2 * min(cdf, 1 - cdf))


# ------------------------------------------------------------------ LocalDP
@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"clip": 0.0, "noise_multiplier": 1.0}, "clip"),
        ({"clip": math.inf, "noise_multiplier": 1.0}, "clip"),
        ({"clip": 1.0, "noise_multiplier": -0.1}, "noise_multiplier"),
        ({"clip": 1.0, "noise_multiplier": 1.0, "delta": 1.0}, "delta"),
    ],
)
def test_bad_dp_settings_are_errors_naming_the_field(kwargs: dict[str, Any], field: str) -> None:
    with pytest.raises(ValueError, match=field):
        LocalDP(**kwargs)


def test_clipping_bounds_the_norm_and_keeps_the_direction() -> None:
    rng = np.random.default_rng(0)
    for scale in (1e-3, 1.0, 1e3):
        delta = [rng.normal(size=(5, 4)) * scale, rng.normal(size=3) * scale]
        clipped = clip_update(delta, 0.7)
        assert update_norm(clipped) <= 0.7 * (1 + 1e-12)
        factor = clipped[0].ravel()[0] / delta[0].ravel()[0]
        for a, b in zip(delta, clipped, strict=True):
            np.testing.assert_allclose(b, factor * a, rtol=1e-12)
        if update_norm(delta) <= 0.7:
            assert factor == 1.0


def test_noise_has_the_intended_std_and_the_test_can_fail() -> None:
    dp = LocalDP(clip=2.0, noise_multiplier=0.3)
    noise = dp.privatize([np.zeros(100_000)], np.random.default_rng(11))[0]
    assert std_p_value(noise, 0.6) > 1e-3
    # 2% off is detected by the same test on the same sample.
    assert std_p_value(noise, 0.6 * 1.02) < 1e-6
    assert std_p_value(noise, 0.6 / 1.02) < 1e-6


def test_client_adds_noise_of_std_sigma_c_to_its_clipped_update() -> None:
    model = SoftmaxRegression(999, 10)  # 10,000 parameters
    rng = np.random.default_rng(1)
    X, y = rng.normal(size=(60, 999)), np.arange(60) % 10
    received = model.init_params(0)
    clip, sigma = 0.5, 0.2

    def reply(noise: float) -> NDArrays:
        context = Context(0, 1, {"partition-id": 3}, RecordDict(), {})
        client = ADMMClient(model, X, y, context=context, local_steps=5, seed=9, dp_seed=9)
        config = {"rho": RHO, "server_round": 1, "dp-clip": clip, "dp-noise": noise}
        return client.fit(received, config)[0]

    clipped, noisy = reply(0.0), reply(sigma)
    update = [a - r for a, r in zip(clipped, received, strict=True)]
    assert update_norm(update) == pytest.approx(clip, rel=1e-12)  # the raw update was longer
    noise = np.concatenate([(a - b).ravel() for a, b in zip(noisy, clipped, strict=True)])
    assert std_p_value(noise, sigma * clip) > 1e-3


class SpyADMM(FedADMM):
    """FedADMM that records ||w_i - v_i|| of every reply it reads."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.update_norms: list[float] = []
        algorithm, read = self.algorithm, self.algorithm.read

        def spied(reply: Any) -> Any:
            value, problem = read(reply)
            if problem is None:
                center = algorithm._sent_center(reply.node)
                w = value[0]
                self.update_norms.append(
                    update_norm([a - c for a, c in zip(w, center, strict=True)])
                )
            return value, problem

        algorithm.read = spied  # type: ignore[method-assign]


@pytest.mark.parametrize("uplink", [None, StochasticQuantizer(bits=16, error_feedback=False)])
def test_clipping_bounds_every_update_of_a_run(uplink: Any) -> None:
    clip = 0.05
    strategy, _, result = run_seed(
        SpyADMM,
        8,
        client_kwargs=CLIENT,
        rho=RHO,
        uplink=Uplink(uplink, local_dp=LocalDP(clip, 0.0)),
    )
    norms = np.array(strategy.update_norms)
    assert norms.size == 8 * NUM_CLIENTS
    assert result.fit_metrics[-1]["num_rejected"] == 0
    # 16-bit quantization of the clipped update moves its norm by at most ~1e-5 C.
    assert norms.max() <= clip * (1 + (1e-4 if uplink else 1e-12))
    assert np.mean(norms >= clip * 0.999) > 0.5  # clipping was active
    assert "dp_epsilon" not in result.fit_metrics[-1]  # no noise, no epsilon


# ------------------------------------------------------------------- ledger
def reference_epsilons(sigma: float, q: float, rounds: int, delta: float) -> list[float]:
    """dp-accounting directly: one Poisson-subsampled Gaussian per round."""
    accountant = dp_accounting.rdp.RdpAccountant(orders=list(RDP_ORDERS))
    out = []
    event = dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(sigma))
    for _ in range(rounds):
        accountant.compose(event)
        out.append(accountant.get_epsilon(delta))
    return out


def test_epsilon_grows_every_round_as_the_accountant_says() -> None:
    sigma, rounds = 1.0, 6
    _, _, result = run_seed(
        textbook,
        rounds,
        client_kwargs=CLIENT,
        rho=RHO,
        uplink=Uplink(local_dp=LocalDP(clip=1.0, noise_multiplier=sigma, delta=1e-5)),
        fraction_fit=0.5,
        min_fit_clients=5,
        min_available_clients=NUM_CLIENTS,
    )
    eps = [float(m["dp_epsilon"]) for m in result.fit_metrics]
    unamplified = [float(m["dp_epsilon_unamplified"]) for m in result.fit_metrics]
    assert [m["dp_rounds"] for m in result.fit_metrics] == list(range(1, rounds + 1))
    assert [m["dp_sampling_rate"] for m in result.fit_metrics] == [0.5] * rounds
    assert np.all(np.diff(eps) > 0)
    np.testing.assert_allclose(eps, reference_epsilons(sigma, 0.5, rounds, 1e-5), rtol=1e-9)
    np.testing.assert_allclose(unamplified, reference_epsilons(sigma, 1.0, rounds, 1e-5), rtol=1e-9)
    assert all(a < b for a, b in zip(eps, unamplified, strict=True))


def test_ledger_survives_a_checkpoint_resume(tmp_path: Any) -> None:
    dp = LocalDP(clip=1.0, noise_multiplier=2.0)
    kwargs: dict[str, Any] = {"client_kwargs": CLIENT, "rho": RHO, "uplink": Uplink(local_dp=dp)}
    _, _, straight = run_seed(textbook, 5, **kwargs)
    run_seed(textbook, 3, checkpoint=Checkpointing(tmp_path), **kwargs)
    resumed, _, _ = run_seed(textbook, 2, checkpoint=Checkpointing(tmp_path), **kwargs)
    assert resumed.history[-1]["dp_rounds"] == 5
    assert resumed.history[-1]["dp_epsilon"] == straight.fit_metrics[-1]["dp_epsilon"]


def test_ledger_state_round_trips() -> None:
    ledger = PrivacyLedger(1.5, 1e-6)
    assert ledger.epsilon() == 0.0 and ledger.state_dict() == {}
    for size in (3, 4, 3):
        ledger.record(size, 10)
    copy = PrivacyLedger(1.5, 1e-6)
    copy.load_state_dict(ledger.state_dict())
    assert copy.metrics() == ledger.metrics()


def test_wrapper_gives_fedavg_the_same_local_dp_and_epsilon() -> None:
    dp = LocalDP(clip=0.05, noise_multiplier=0.5)
    strategy = UplinkWrapper(FedAvg(initial_parameters=zeros_parameters()), local_dp=dp)
    result = run_rounds(strategy, make_proxies(admm_client_fn(**CLIENT), NUM_CLIENTS), 3)
    assert [m["dp_rounds"] for m in result.fit_metrics] == [1, 2, 3]
    np.testing.assert_allclose(
        [m["dp_epsilon"] for m in result.fit_metrics],
        reference_epsilons(0.5, 1.0, 3, 1e-5),
        rtol=1e-9,
    )


# ------------------------------------------------- Flower's own DP wrappers
class Recording(Client):
    """Wrap a client; record the parameters each fit received, by partition and round."""

    def __init__(self, inner: Client, pid: int, log: dict[tuple[int, int], NDArrays]) -> None:
        self.inner, self.pid, self.log = inner, pid, log

    def fit(self, ins: FitIns) -> FitRes:
        self.log[(self.pid, int(ins.config["server_round"]))] = parameters_to_ndarrays(
            ins.parameters
        )
        return self.inner.fit(ins)

    def evaluate(self, ins: EvaluateIns) -> EvaluateRes:
        return self.inner.evaluate(ins)


def test_server_side_dp_wrapper_noise_is_the_z_the_duals_use() -> None:
    received: dict[tuple[int, int], NDArrays] = {}
    make = admm_client_fn(**CLIENT)

    def client_fn(context: Context) -> Client:
        pid = int(context.node_config["partition-id"])
        return Recording(make(context).to_client(), pid, received)

    noisy_z: list[np.ndarray] = []
    clean_z: list[np.ndarray] = []
    centers: list[dict[str, np.ndarray]] = []
    inner = textbook(rho=RHO, initial_parameters=zeros_parameters())

    def record(server_round: int, parameters: NDArrays, config: Any) -> None:
        if server_round == 0 or inner.admm is None:
            return
        noisy_z.append(np.array(parameters[0]))
        clean_z.append(inner.admm.z[0].copy())  # z' before the wrapper's noise
        centers.append({k: inner.admm.center(k)[0] for k in inner.admm.records})

    inner.evaluate_fn = record
    np.random.seed(0)  # noqa: NPY002 (the wrapper draws from numpy's global generator)
    noise_multiplier, clip = 0.5, 1.0
    strategy = DifferentialPrivacyServerSideFixedClipping(
        inner, noise_multiplier, clip, NUM_CLIENTS
    )
    rounds = 4
    run_rounds(strategy, make_proxies(client_fn, NUM_CLIENTS), rounds)
    std = noise_multiplier * clip / NUM_CLIENTS
    for k in range(1, rounds):
        noise = noisy_z[k - 1] - clean_z[k - 1]
        assert 0.3 * std < noise.std() < 3 * std  # the wrapper did add noise
        for i in range(NUM_CLIENTS):
            # Round k+1's center: the NOISY z minus u_i (not the clean z' minus u_i).
            sent = received[(i, k + 1)][0]
            expected = noisy_z[k - 1] - (clean_z[k - 1] - centers[k - 1][f"partition-id:{i}"])
            np.testing.assert_allclose(sent, expected, rtol=0, atol=1e-14)
        # The dual residual s = rho ||z_{k+1} - z_k|| is measured from the noisy z_k.
        s = inner.history[k]["dual_residual"]
        assert s == pytest.approx(RHO * np.linalg.norm(clean_z[k] - noisy_z[k - 1]), rel=1e-12)


class MessageProxy(InProcessClientProxy):
    """Fit through a real `ClientApp` (with its mods) on Flower's Message records."""

    def __init__(self, proxy: InProcessClientProxy, app: ClientApp) -> None:
        super().__init__(proxy.cid, proxy.client_fn, proxy.context)
        self.app = app

    def fit(self, ins: FitIns, timeout: float | None, group_id: int | None) -> FitRes:
        metadata = Metadata(
            run_id=0,
            message_id=f"{self.cid}-{group_id}",
            src_node_id=0,
            dst_node_id=self.node_id,
            reply_to_message_id="",
            group_id=str(group_id),
            created_at=time.time(),
            ttl=3600.0,
            message_type="train",
        )
        message = make_message(metadata, compat.fitins_to_recorddict(ins, keep_input=True))
        reply = self.app(message, self.context)
        assert not reply.has_error(), reply.error
        return compat.recorddict_to_fitres(reply.content, keep_input=False)


def test_client_side_dp_wrapper_with_fixedclipping_mod() -> None:
    clip = 0.02
    make = admm_client_fn(**CLIENT)
    app = ClientApp(client_fn=lambda ctx: make(ctx).to_client(), mods=[fixedclipping_mod])
    proxies: list[ClientProxy] = [MessageProxy(p, app) for p in make_proxies(make, NUM_CLIENTS)]
    inner = SpyADMM(rho=RHO, initial_parameters=zeros_parameters(), **TEXTBOOK)
    snapshots: list[tuple[np.ndarray, np.ndarray]] = []

    def record(server_round: int, parameters: NDArrays, config: Any) -> None:
        if server_round > 0 and inner.admm is not None:
            snapshots.append((np.array(parameters[0]), inner.admm.z[0].copy()))

    inner.evaluate_fn = record
    np.random.seed(1)  # noqa: NPY002
    strategy = DifferentialPrivacyClientSideFixedClipping(inner, 0.5, clip, NUM_CLIENTS)
    run_rounds(strategy, proxies, 4)  # type: ignore[arg-type]
    # The mod clipped w_i - v_i (v_i = what the client received) to norm C.
    assert len(inner.update_norms) == 4 * NUM_CLIENTS
    assert max(inner.update_norms) <= clip * (1 + 1e-12)
    assert np.mean(np.array(inner.update_norms) >= clip * 0.999) > 0.5
    # Each round FedADMM adopted the noisy broadcast z as its consensus.
    for k in range(len(snapshots) - 1):
        noisy, clean = snapshots[k]
        assert np.linalg.norm(noisy - clean) > 0
        assert inner.history[k + 1]["dual_residual"] == pytest.approx(
            RHO * np.linalg.norm(snapshots[k + 1][1] - noisy), rel=1e-12
        )
    assert D == snapshots[0][0].size


def test_dp_noise_is_secret_unless_a_dp_seed_is_given() -> None:
    """Two fits with identical inputs and seed but no dp_seed draw different noise."""
    from flwr_admm.models import SoftmaxRegression

    model = SoftmaxRegression(4, 3)
    rng = np.random.default_rng(0)
    X, y = rng.normal(size=(30, 4)), np.arange(30) % 3
    config = {"rho": RHO, "server_round": 1, "dp-clip": 1.0, "dp-noise": 0.5}

    def reply(dp_seed: int | None) -> NDArrays:
        context = Context(0, 1, {"partition-id": 0}, RecordDict(), {})
        client = ADMMClient(model, X, y, context=context, local_steps=2, seed=0, dp_seed=dp_seed)
        return client.fit(model.init_params(0), config)[0]

    assert not np.array_equal(reply(None)[0], reply(None)[0])
    np.testing.assert_array_equal(reply(7)[0], reply(7)[0])
