"""A diverging or stalled Message-API run stops with `RunDivergedError` (flwr_admm.core.health).

In-process runs (`InProcessGrid` + `run_strategy`, what ``strategy.start`` does in an
``@app.main()``): handlers whose replies explode (x 100 a round, finite) or are all
NaN end ``strategy.start`` within a few rounds with the message, for every strategy;
a healthy run is bit-identical with the watchdog on and off.
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np
import pytest
from flower_run import NUM_CLIENTS, D
from flwr.app import Array, ArrayRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from flwr.serverapp.strategy import Strategy
from message_apps import ZRecorder, plain_app, warm_app, zeros

from flwr_admm.clientapp import ADMMTrainStep
from flwr_admm.core import HealthCheck, RunDivergedError
from flwr_admm.serverapp import SCAFFOLD, FedADMM, FedADMMClientDuals, FedDyn, FedNova
from flwr_admm.serverapp.testing import InProcessGrid, run_strategy

NODES = 4
COMMON: dict[str, Any] = {
    "fraction_evaluate": 0.0,
    "min_train_nodes": NODES,
    "min_available_nodes": NODES,
}


def ones() -> ArrayRecord:
    return ArrayRecord([np.ones(3), np.full((2, 2), 0.5)])


def _metrics(context: Context, **extra: Any) -> MetricRecord:
    pid = int(context.node_config["partition-id"])
    return MetricRecord({"num-examples": 10, "partition-id": pid, **extra})


exploding_app = ClientApp()


@exploding_app.train()
def explode(msg: Message, context: Context) -> Message:
    """The ADMM step of a diverging local solver: w_i = 100 (v_i + 1), finite."""
    step = ADMMTrainStep.from_message(msg, context)
    w = [100.0 * (v + 1.0) for v in step.center.values()]
    return step.reply(
        w, 10, {"loss": 1.0, "partition-id": context.node_config["partition-id"]}, context
    )


exploding_peer_app = ClientApp()


@exploding_peer_app.train()
def explode_peer(msg: Message, context: Context) -> Message:
    """A peer's reply: x 100 (plus 1) under ``arrays``, zeros under the other records."""
    records: dict[str, Any] = {"metrics": _metrics(context, local_steps=1)}
    for name, record in msg.content.array_records.items():
        blowup = 100.0 if name == "arrays" else 0.0
        records[name] = ArrayRecord([blowup * (a + 1.0) for a in record.to_numpy_ndarrays()])
    return Message(RecordDict(records), reply_to=msg)


nan_app = ClientApp()


@nan_app.train()
def nan_reply(msg: Message, context: Context) -> Message:
    """Every reply NaN (a local solve that blew up)."""
    records: dict[str, Any] = {"metrics": _metrics(context, local_steps=1)}
    for name, record in msg.content.array_records.items():
        records[name] = ArrayRecord([np.full_like(a, np.nan) for a in record.to_numpy_ndarrays()])
    return Message(RecordDict(records), reply_to=msg)


def diverged(strategy: Strategy, app: ClientApp, rounds: int = 20) -> tuple[int, str]:
    """Run until the watchdog stops the run; return its round and message."""
    grid = InProcessGrid(app, NODES)
    with pytest.raises(RunDivergedError) as caught:
        run_strategy(strategy, grid, ones(), rounds)
    message = str(caught.value)
    match = re.search(r"at round (\d+):", message)
    assert match is not None, message
    return int(match.group(1)), message


@pytest.mark.parametrize(
    ("strategy", "app"),
    [
        (FedADMM(rho=0.1, **COMMON), exploding_app),
        (FedADMMClientDuals(rho=0.1, **COMMON), exploding_app),
        (FedDyn(alpha=0.1, **COMMON), exploding_peer_app),
        (SCAFFOLD(**COMMON), exploding_peer_app),
        (FedNova(**COMMON), exploding_peer_app),
    ],
    ids=["FedADMM", "FedADMMClientDuals", "FedDyn", "SCAFFOLD", "FedNova"],
)
def test_exploding_finite_replies_stop_the_run_within_a_few_rounds(
    strategy: Strategy, app: ClientApp
) -> None:
    number, message = diverged(strategy, app)
    assert number <= 5, message
    name = type(strategy).__name__
    assert message.startswith(f"{name}: the run diverged or stalled at round {number}: ")
    assert "(explosion)" in message or "(growth)" in message
    assert "Last rounds" in message and f"round {number}: " in message
    assert "learning rate" in message and f"{name}(health=None)" in message


@pytest.mark.parametrize(
    "strategy",
    [
        FedADMM(rho=0.1, **COMMON),
        FedADMMClientDuals(rho=0.1, **COMMON),
        FedDyn(alpha=0.1, **COMMON),
        SCAFFOLD(**COMMON),
        FedNova(**COMMON),
    ],
    ids=["FedADMM", "FedADMMClientDuals", "FedDyn", "SCAFFOLD", "FedNova"],
)
def test_every_reply_nan_stops_the_run_at_round_three(strategy: Strategy) -> None:
    number, message = diverged(strategy, nan_app)
    assert number == 3, message
    assert "no reply was accepted in 3 rounds in a row" in message
    assert "round 2: -, -, -, -; replies 0/4/0" in message


def test_replies_that_never_come_count_as_failed() -> None:
    grid = InProcessGrid(plain_app, NODES)
    grid.offline.update(grid.contexts)  # every reply late: absent, as in Flower
    strategy = FedADMM(rho=0.1, **COMMON)
    with pytest.raises(RunDivergedError, match=r"round 3: no reply was accepted") as caught:
        run_strategy(strategy, grid, zeros(), 10)
    assert "replies 0/0/4" in str(caught.value)


def test_health_none_lets_a_diverging_run_go_on() -> None:
    grid = InProcessGrid(nan_app, NODES)
    strategy = FedADMM(rho=0.1, health=None, **COMMON)
    result = run_strategy(strategy, grid, ones(), 5)
    assert result.train_metrics_clientapp[5]["num_rejected"] == NODES


def test_looser_thresholds_are_taken() -> None:
    number, _ = diverged(FedADMM(rho=0.1, health=HealthCheck(idle_rounds=5), **COMMON), nan_app)
    assert number == 5


@pytest.mark.parametrize(
    ("make", "app"),
    [
        (lambda **kw: FedADMM(rho=0.1, **kw), plain_app),
        (lambda **kw: FedADMMClientDuals(rho=0.1, **kw), warm_app),
    ],
    ids=["FedADMM", "FedADMMClientDuals"],
)
def test_a_healthy_run_is_bit_identical_with_the_watchdog_on_and_off(make: Any, app: Any) -> None:
    common = {**COMMON, "min_train_nodes": NUM_CLIENTS, "min_available_nodes": NUM_CLIENTS}
    runs = []
    for health in (HealthCheck(), None):
        strategy, recorder = make(health=health, **common), ZRecorder()
        run_strategy(strategy, InProcessGrid(app, NUM_CLIENTS), zeros(), 12, evaluate_fn=recorder)
        runs.append((strategy.history, recorder.matrix))
    (history_on, z_on), (history_off, z_off) = runs
    assert z_on.shape == (13, D)
    np.testing.assert_array_equal(z_on, z_off)
    assert history_on == history_off


def momentum_cnn_app(lr: float) -> tuple[ClientApp, Any]:
    """The issue's setting in small: a CNN trained by momentum SGD with the loss penalty."""
    torch = pytest.importorskip("torch")
    from sklearn.datasets import load_digits

    from flwr_admm.torch import TorchADMM
    from flwr_admm.torch.models import SmallCNN

    digits = load_digits()
    X = torch.tensor(digits.data / 16.0, dtype=torch.float32)
    y = torch.tensor(digits.target)
    rows = np.argsort(digits.target, kind="stable")[::4]  # 450 images, label-sorted
    shards = np.array_split(rows, NODES)

    def model() -> Any:
        torch.manual_seed(0)
        return SmallCNN((1, 8, 8), 10, width=4)

    app = ClientApp()

    @app.train()
    def train(msg: Message, context: Context) -> Message:
        i = int(context.node_config["partition-id"])
        net = model()
        admm = TorchADMM.from_message(net, msg, context, penalty="loss")
        admm.start()
        optimizer = torch.optim.SGD(net.parameters(), lr=lr, momentum=0.9)
        rows = torch.tensor(shards[i])
        for b in range(0, len(rows), 32):
            optimizer.zero_grad()
            loss = torch.nn.functional.cross_entropy(net(X[rows[b : b + 32]]), y[rows[b : b + 32]])
            (loss + admm.penalty_term()).backward()
            optimizer.step()
            admm.after_step(optimizer)
        return admm.reply(len(rows), {"loss": float(loss.detach()), "partition-id": i})

    state = {k: np.asarray(v.detach().numpy()) for k, v in model().state_dict().items()}
    return app, ArrayRecord({k: Array(v) for k, v in state.items()})


def test_a_momentum_sgd_cnn_at_lr_10_stops_at_once_and_at_lr_005_trains_on() -> None:
    torch = pytest.importorskip("torch")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny convolutions: more threads only contend
    try:
        app, initial = momentum_cnn_app(10.0)
        with pytest.raises(RunDivergedError, match=r"at round 1: \|\|z'\|\| = .* \(explosion\)"):
            run_strategy(FedADMM(rho=0.1, **COMMON), InProcessGrid(app, NODES), initial, 10)
        app, initial = momentum_cnn_app(0.05)
        strategy = FedADMM(rho=0.1, **COMMON)
        run_strategy(strategy, InProcessGrid(app, NODES), initial, 6)
        assert len(strategy.history) == 6
    finally:
        torch.set_num_threads(threads)
