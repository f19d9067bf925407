"""serverapp.FedADMM.configure_train: per-node centers, names/dtypes/0-d, config, sampling."""

from __future__ import annotations

import numpy as np
import pytest
from flwr.app import ConfigRecord
from flwr.serverapp.strategy import FedAvg, strategy_utils
from message_replies import FakeGrid, configure, named, reply

from flwr_admm import Convergence, Uplink
from flwr_admm.core.types import natural_key
from flwr_admm.protocol import START_MARK
from flwr_admm.serverapp import FedADMM, FedADMMClientDuals
from flwr_admm.serverapp import strategy as translator
from flwr_admm.serverapp.testing import flower_task_identity
from flwr_admm.uplink import StochasticQuantizer

Z0 = {
    "layer.weight": np.arange(6, dtype=np.float32).reshape(3, 2),
    "layer.bias": np.array([0.5, -1.0]),
    "bn.num_batches_tracked": np.array(7, dtype=np.int64),  # 0-d, as in a state_dict
}


def w_of(i: int) -> dict[str, np.ndarray]:
    return {
        "layer.weight": np.full((3, 2), 1.0 + i, dtype=np.float32),
        "layer.bias": np.array([i, -i], dtype=np.float64),
        "bn.num_batches_tracked": np.array(7 + i, dtype=np.int64),
    }


def two_rounds(strategy: FedADMM) -> tuple[list, list]:
    """Round 1 from Z0 (all replies from partitions 0..3), then round 2's messages."""
    grid = FakeGrid([11, 12, 13, 14])
    first = configure(strategy, 1, named(Z0), grid, lr=0.5)
    z1, _ = strategy.aggregate_train(
        1,
        [
            reply(n, w_of(i), **{"num-examples": 10 + i, "partition-id": i, START_MARK: 1})
            for i, n in enumerate([11, 12, 13, 14])
        ],
    )
    assert z1 is not None
    return first, configure(strategy, 2, z1, grid, lr=0.5)


def test_each_node_gets_its_own_center_with_the_models_names_dtypes_and_shapes() -> None:
    # the 0-d int64 tensor as a consensus variable (by default an integer tensor is kept)
    policy = {"bn.num_batches_tracked": "consensus"}
    strategy = FedADMM(rho=0.5, fraction_evaluate=0.0, tensor_policy=policy)
    first, second = two_rounds(strategy)
    assert isinstance(first, list) and isinstance(second, list)
    assert [m.metadata.dst_node_id for m in first] == [11, 12, 13, 14]
    admm = strategy.admm
    assert admm is not None
    for message in first + second:
        arrays = message.content["arrays"]
        assert list(arrays.keys()) == list(Z0)
        for name, expected in Z0.items():
            assert arrays[name].numpy().dtype == expected.dtype
            assert arrays[name].numpy().shape == expected.shape  # () stays ()
    for i, message in enumerate(second):
        key = f"partition-id:{i}"
        center = admm.center(key)  # v_i = z - y_i / rho_i
        for (name, expected), v in zip(Z0.items(), center, strict=True):
            sent = message.content["arrays"][name].numpy()
            np.testing.assert_array_equal(sent, np.asarray(v, dtype=expected.dtype))
    weights = [m.content["arrays"]["layer.weight"].numpy() for m in second]
    assert not np.array_equal(weights[0], weights[1])  # the duals differ per node


def test_messages_carry_the_round_as_group_id() -> None:
    """SuperNodes log "[RUN r, ROUND k]" from group_id (the deployment runner's kill
    waits for that line), as with the legacy API."""
    first, second = two_rounds(FedADMM(rho=0.5, fraction_evaluate=0.0))
    assert {m.metadata.group_id for m in first} == {"1"}
    assert {m.metadata.group_id for m in second} == {"2"}


def test_client_duals_and_evaluate_messages_carry_the_round_as_group_id() -> None:
    train = configure(FedADMMClientDuals(rho=0.5), 3, named(Z0), FakeGrid([11, 12]), lr=0.5)
    assert {m.metadata.group_id for m in train} == {"3"}
    strategy = FedADMM(rho=0.5, fraction_evaluate=1.0)
    with flower_task_identity():
        evaluate = strategy.configure_evaluate(4, named(Z0), ConfigRecord(), FakeGrid([11, 12]))
    assert len(evaluate) == 2 and {m.metadata.group_id for m in evaluate} == {"4"}


def test_config_is_a_copy_plus_rho_proximal_mu_and_server_round() -> None:
    strategy = FedADMM(rho=0.25, fraction_evaluate=0.0)
    given = ConfigRecord({"lr": 0.1, "layers": [1, 2]})
    with flower_task_identity():
        messages = strategy.configure_train(3, named(Z0), given, FakeGrid([5, 6]))
    assert dict(given) == {"lr": 0.1, "layers": [1, 2]}  # Strategy.start reuses it
    for message in messages:
        config = message.content["config"]
        assert dict(config) == {
            "lr": 0.1,
            "layers": [1, 2],
            "rho": 0.25,
            "proximal-mu": 0.25,
            "server-round": 3,
        }
        assert config is not given


def test_rho_is_sent_as_rho_and_proximal_mu() -> None:
    strategy = FedADMM(rho=1.0, rho_schedule="constant", fraction_evaluate=0.0)
    _, second = two_rounds(strategy)
    sent = [m.content["config"]["rho"] for m in second]
    assert sent == [1.0] * 4
    assert [m.content["config"]["proximal-mu"] for m in second] == sent


@pytest.mark.parametrize(
    "key",
    [
        "rho",
        "proximal-mu",
        "server-round",
        "proximal_mu",
        "server_round",
        "admm-duals",
        "admm-ack-round",
        "uplink",
        "uplink-bits",
        "dp-clip",
    ],
)
def test_config_keys_the_strategy_sets_are_refused(key: str) -> None:
    strategy = FedADMM(rho=0.1)
    with pytest.raises(ValueError, match=f"key '{key}'"):
        configure(strategy, 1, named(Z0), FakeGrid([1, 2]), **{key: 1})


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"uplink": "8-bit"}, r"uplink: must be Uplink\(\.\.\.\)"),
        ({"uplink": StochasticQuantizer(bits=8)}, r"uplink: must be Uplink\(\.\.\.\)"),
    ],
)
def test_the_uplink_keyword_takes_an_uplink_value(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        FedADMM(rho=0.1, **kwargs)


def test_uplink_entries_reach_the_config() -> None:
    strategy = FedADMM(rho=0.1, uplink=Uplink(StochasticQuantizer(bits=8)))
    messages = configure(strategy, 1, named(Z0), FakeGrid([1, 2]))
    config = messages[0].content["config"]
    assert config["uplink"] == "sq" and config["uplink-bits"] == 8


def test_unknown_keyword_and_bad_values_are_refused() -> None:
    with pytest.raises(TypeError, match="fraction_fit"):
        FedADMM(fraction_fit=0.5)
    for kwargs, field in [
        ({"fraction_train": 1.5}, "fraction_train"),
        ({"min_train_nodes": -1}, "min_train_nodes"),
        ({"sampling_seed": -2}, "sampling_seed"),
        ({"rho": -1.0}, "rho"),
        ({"relaxation": 2.0}, "relaxation"),
        ({"rho_schedule": "nope"}, "rho_schedule"),
    ]:
        with pytest.raises(ValueError, match=field):
            FedADMM(**kwargs)


def test_waits_for_min_available_nodes_then_sizes_the_sample(monkeypatch) -> None:
    # Nodes register while the strategy waits: 0, then 3, then all 10 connected.
    monkeypatch.setattr(translator, "WAIT_INTERVAL", 0.0)
    monkeypatch.setattr(strategy_utils, "sleep", lambda seconds: None)
    stages = ([], list(range(1, 4)), list(range(1, 11)))
    ours = FedADMM(rho=0.1, min_available_nodes=10)
    sent = configure(ours, 1, named(Z0), FakeGrid(*stages))
    assert sorted(m.metadata.dst_node_id for m in sent) == list(range(1, 11))
    # Flower's FedAvg sizes its sample before waiting: 2 of the 10 nodes (the race).
    with flower_task_identity():
        theirs = FedAvg(min_available_nodes=10).configure_train(
            1, named(Z0), ConfigRecord(), FakeGrid(*stages)
        )
    assert len(list(theirs)) == 2


def test_seeded_sampling_orders_by_key_then_node_id_and_is_reproducible() -> None:
    node_ids = [907, 15, 3, 88, 41, 1200, 6, 77, 530, 2]

    def sample(seed: int, server_round: int) -> list[int]:
        strategy = FedADMM(rho=0.1, fraction_train=0.5, sampling_seed=seed)
        sent = configure(strategy, server_round, named(Z0), FakeGrid(node_ids))
        return [m.metadata.dst_node_id for m in sent]

    assert sample(3, 1) == sample(3, 1)
    assert sample(3, 1) != sample(3, 2)
    # The legacy rule: nodes ordered by (key, node id), rng seeded by (seed, round).
    order = sorted(node_ids, key=lambda n: (natural_key("~"), natural_key(str(n))))
    picked = np.sort(np.random.default_rng([3, 1]).choice(10, size=5, replace=False))
    assert sample(3, 1) == [order[i] for i in picked]


def test_no_nodes_are_sampled_after_convergence_when_asked() -> None:
    strategy = FedADMM(rho=0.1, convergence=Convergence(stop=True, eps_abs=1.0, eps_rel=1.0))
    grid = FakeGrid([1, 2])
    configure(strategy, 1, named(Z0), grid)
    z1, metrics = strategy.aggregate_train(1, [reply(n, Z0, **{"num-examples": 5}) for n in (1, 2)])
    assert metrics is not None and metrics["converged"] == 1 and z1 is not None
    assert configure(strategy, 2, z1, grid) == []
