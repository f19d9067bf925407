"""tensor_policy in both FedADMMs: BatchNorm statistics averaged, num_batches_tracked kept."""

from __future__ import annotations

import numpy as np
import pytest
from flwr.client import NumPyClient
from flwr.common import Context, ndarrays_to_parameters, parameters_to_ndarrays
from flwr.server.client_manager import SimpleClientManager
from message_replies import FakeGrid, configure, named, reply

from flwr_admm import Checkpointing
from flwr_admm.protocol import START_MARK
from flwr_admm.server import FedADMM
from flwr_admm.serverapp import FedADMM as MessageFedADMM
from flwr_admm.testing import make_proxies, run_rounds

NAMES = ["fc.weight", "bn.running_mean", "bn.num_batches_tracked"]
Z0 = [np.zeros(3, dtype=np.float32), np.zeros(2, dtype=np.float32), np.array(0, dtype=np.int64)]
N = [10, 30]


def w_of(i: int) -> list[np.ndarray]:
    return [
        np.full(3, 1.0 + i, dtype=np.float32),
        np.array([2.0 + 4 * i, -1.0], dtype=np.float32),
        np.array(5 + i, dtype=np.int64),
    ]


AVERAGE = (N[0] * w_of(0)[1] + N[1] * w_of(1)[1]) / sum(N)


class Fixed(NumPyClient):
    def __init__(self, context: Context) -> None:
        self.i = int(context.node_config["partition-id"])

    def fit(self, parameters, config):  # type: ignore[no-untyped-def]
        return w_of(self.i), N[self.i], {"partition-id": self.i, START_MARK: 0}  # solves ADMM


def test_legacy_fedadmm_averages_statistics_and_keeps_integer_buffers() -> None:
    strategy = FedADMM(rho=0.5, tensor_names=NAMES, min_available_clients=2)
    proxies = make_proxies(lambda ctx: Fixed(ctx).to_client(), 2)
    result = run_rounds(strategy, proxies, 1, initial_parameters=ndarrays_to_parameters(Z0))
    z = parameters_to_ndarrays(result.parameters)
    assert [t.dtype for t in z] == [np.float32, np.float32, np.int64]
    assert z[2].shape == () and z[2] == 0  # untouched by the clients' 5 and 6
    np.testing.assert_allclose(z[1], AVERAGE, rtol=1e-6)
    assert strategy.admm is not None and len(strategy.admm.z) == 1  # duals on fc.weight only
    # round 2: the averaged and kept tensors go out as z, the consensus one as z - u_i
    manager = SimpleClientManager()
    for proxy in proxies:
        manager.register(proxy)
    sent = [
        parameters_to_ndarrays(ins.parameters)
        for _, ins in strategy.configure_fit(2, result.parameters, manager)
    ]
    np.testing.assert_array_equal(sent[0][1], sent[1][1])
    assert not np.array_equal(sent[0][0], sent[1][0])
    assert sent[0][2].shape == () and sent[0][2].dtype == np.int64


def test_legacy_checkpoint_keeps_the_held_tensors(tmp_path) -> None:  # type: ignore[no-untyped-def]
    kwargs = {"rho": 0.5, "tensor_names": NAMES, "min_available_clients": 2}
    strategy = FedADMM(checkpoint=Checkpointing(tmp_path), **kwargs)
    proxies = make_proxies(lambda ctx: Fixed(ctx).to_client(), 2)
    run_rounds(strategy, proxies, 2, initial_parameters=ndarrays_to_parameters(Z0))
    resumed = FedADMM(checkpoint=Checkpointing(tmp_path), **kwargs)
    assert resumed.algorithm.tensors is not None and strategy.algorithm.tensors is not None
    assert resumed.algorithm.tensors.roles == ("consensus", "average", "keep")
    for a, b in zip(resumed.algorithm.model() or [], strategy.algorithm.model() or [], strict=True):
        np.testing.assert_array_equal(a, b)
    with pytest.raises(Exception, match="tensor_policy"):
        FedADMM(checkpoint=Checkpointing(tmp_path), tensor_policy={"bn.*": "keep"}, **kwargs)


def test_message_fedadmm_averages_statistics_and_keeps_integer_buffers() -> None:
    strategy = MessageFedADMM(rho=0.5, fraction_evaluate=0.0)
    grid = FakeGrid([11, 12])
    z0 = dict(zip(NAMES, Z0, strict=True))
    configure(strategy, 1, named(z0), grid)
    replies = [
        reply(
            node,
            dict(zip(NAMES, w_of(i), strict=True)),
            **{"num-examples": N[i], "partition-id": i, START_MARK: 0},
        )
        for i, node in enumerate([11, 12])
    ]
    z1, metrics = strategy.aggregate_train(1, replies)
    assert z1 is not None and metrics is not None and metrics["num_rejected"] == 0
    np.testing.assert_allclose(z1["bn.running_mean"].numpy(), AVERAGE, rtol=1e-6)
    kept = z1["bn.num_batches_tracked"].numpy()
    assert kept.shape == () and kept.dtype == np.int64 and kept == 0
    second = configure(strategy, 2, z1, grid)
    means = [m.content["arrays"]["bn.running_mean"].numpy() for m in second]
    weights = [m.content["arrays"]["fc.weight"].numpy() for m in second]
    np.testing.assert_array_equal(means[0], means[1])
    assert not np.array_equal(weights[0], weights[1])
    # a NaN in an averaged tensor is a rejected reply, not a poisoned average
    bad = dict(zip(NAMES, w_of(0), strict=True))
    bad["bn.running_mean"] = np.array([np.nan, 0.0], dtype=np.float32)
    _, metrics = strategy.aggregate_train(
        2,
        [
            reply(11, bad, **{"num-examples": 10, "partition-id": 0}),
            reply(
                12,
                dict(zip(NAMES, w_of(1), strict=True)),
                **{"num-examples": 30, "partition-id": 1},
            ),
        ],
    )
    assert metrics is not None and metrics["num_rejected"] == 1
    assert np.all(np.isfinite(strategy.algorithm.model()[1]))  # type: ignore[union-attr]


def test_tensor_policy_is_validated_in_both_apis() -> None:
    with pytest.raises(ValueError, match="tensor_policy"):
        FedADMM(tensor_policy={"bn.*": "median"})
    with pytest.raises(ValueError, match="tensor_policy"):
        MessageFedADMM(tensor_policy={"bn.*": "median"})


def test_message_checkpoint_keeps_the_held_tensors(tmp_path) -> None:  # type: ignore[no-untyped-def]
    kwargs = {"rho": 0.5, "fraction_evaluate": 0.0, "checkpoint": Checkpointing(tmp_path)}
    strategy = MessageFedADMM(**kwargs)
    grid = FakeGrid([11, 12])
    z = named(dict(zip(NAMES, Z0, strict=True)))
    for rnd in (1, 2):
        configure(strategy, rnd, z, grid)
        replies = [
            reply(node, dict(zip(NAMES, w_of(i), strict=True)), **{"num-examples": N[i]})
            for i, node in enumerate([11, 12])
        ]
        z, _ = strategy.aggregate_train(rnd, replies)
        assert z is not None
    resumed = MessageFedADMM(**kwargs)
    assert resumed.algorithm.tensors is not None and resumed.algorithm.tensors.roles == (
        "consensus",
        "average",
        "keep",
    )
    assert resumed.admm is not None and strategy.admm is not None
    restored = resumed.algorithm.model()
    for a, b in zip(restored, strategy.algorithm.model(), strict=True):
        np.testing.assert_array_equal(a, b)
    np.testing.assert_allclose(restored[1], AVERAGE, rtol=1e-6)  # not the initial zeros
    with pytest.raises(Exception, match="tensor_policy"):
        MessageFedADMM(tensor_policy={"bn.*": "keep"}, **kwargs)


VAR_NAMES = ["fc.weight", "bn.running_var"]
VAR_Z0 = [np.zeros(3, dtype=np.float32), np.ones(2, dtype=np.float32)]


def var_reply(i: int, variance: list[float]) -> list[np.ndarray]:
    return [np.full(3, 1.0 + i, dtype=np.float32), np.array(variance, dtype=np.float32)]


class Variances(NumPyClient):
    """Client 0 reports a negative running variance; client 1 an honest one."""

    def __init__(self, context: Context) -> None:
        self.i = int(context.node_config["partition-id"])

    def fit(self, parameters, config):  # type: ignore[no-untyped-def]
        variance = [-4.0, 1.0] if self.i == 0 else [2.0, 3.0]
        return var_reply(self.i, variance), N[self.i], {"partition-id": self.i, START_MARK: 0}


def test_legacy_fedadmm_refuses_a_negative_running_variance(tmp_path) -> None:  # type: ignore[no-untyped-def]
    kwargs = {"rho": 0.5, "tensor_names": VAR_NAMES, "min_available_clients": 2}
    strategy = FedADMM(checkpoint=Checkpointing(tmp_path), **kwargs)
    proxies = make_proxies(lambda ctx: Variances(ctx).to_client(), 2)
    result = run_rounds(strategy, proxies, 1, initial_parameters=ndarrays_to_parameters(VAR_Z0))
    assert result.fit_metrics[0]["num_rejected"] == 1
    z = parameters_to_ndarrays(result.parameters)
    np.testing.assert_array_equal(z[1], [2.0, 3.0])  # the honest client's alone
    resumed = FedADMM(checkpoint=Checkpointing(tmp_path), **kwargs)  # the check survives a resume
    assert resumed.algorithm.tensors is not None and resumed.algorithm.tensors.nonnegative == (1,)


def test_message_fedadmm_refuses_a_negative_running_variance() -> None:
    strategy = MessageFedADMM(rho=0.5, fraction_evaluate=0.0)
    grid = FakeGrid([11, 12])
    configure(strategy, 1, named(dict(zip(VAR_NAMES, VAR_Z0, strict=True))), grid)
    replies = [
        reply(
            node,
            dict(zip(VAR_NAMES, var_reply(i, variance), strict=True)),
            **{"num-examples": N[i], "partition-id": i, START_MARK: 0},
        )
        for i, (node, variance) in enumerate([(11, [-4.0, 1.0]), (12, [2.0, 3.0])])
    ]
    z1, metrics = strategy.aggregate_train(1, replies)
    assert z1 is not None and metrics is not None and metrics["num_rejected"] == 1
    np.testing.assert_array_equal(z1["bn.running_var"].numpy(), [2.0, 3.0])
