"""A diverging or stalled legacy run stops with `RunDivergedError` (flwr_admm.core.health).

Through `flwr_admm.testing` (the legacy server loop in process) and through Flower's
own loops on the in-process grid: `flwr.server.Server.fit`, a
``ServerApp(server_fn=...)`` (Flower 1.42 runs it through `start_grid` and
`Server.fit`) and an ``@app.main()`` running `DefaultWorkflow`; none of them catches
an error raised by ``aggregate_fit``. The seed task with lr 10 and a plain gradient
step on the penalty (lr rho = 10 > 2) diverges for real; NaN replies are rejected
every round.
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np
import pytest
from flower_run import NUM_CLIENTS, admm_client_fn, run_seed, zeros_parameters
from flwr.app import Context, RecordDict
from flwr.client import ClientApp, NumPyClient
from flwr.common import NDArrays, Scalar
from flwr.server import Server, ServerApp, ServerAppComponents, ServerConfig
from flwr.server.client_manager import SimpleClientManager
from flwr.server.compat import LegacyContext
from flwr.server.strategy import Strategy
from flwr.server.workflow import DefaultWorkflow
from flwr.serverapp import Grid

from flwr_admm.core import HealthCheck, RunDivergedError
from flwr_admm.server import SCAFFOLD, FedADMM, FedADMMClientDuals, FedDyn, FedNova
from flwr_admm.serverapp.testing import InProcessGrid, flower_task_identity
from flwr_admm.testing import make_proxies, run_rounds

LR10 = {"learning_rate": 10.0, "local_steps": 20, "prox_step": "gradient"}


class BlownUpClient(NumPyClient):
    """Replies x 100 (plus 1) or NaN, in the layout the strategy sent (peers: all blocks)."""

    def __init__(self, context: Context, mode: str) -> None:
        self.partition = int(context.node_config["partition-id"])
        self.mode = mode

    def fit(self, parameters: NDArrays, config: dict[str, Scalar]) -> Any:
        if self.mode == "nan":
            arrays = [np.full_like(p, np.nan) for p in parameters]
        else:
            arrays = [100.0 * (p + 1.0) for p in parameters]
        return arrays, 10, {"partition-id": self.partition, "local_steps": 1}


def blown_up(mode: str) -> Any:
    return lambda context: BlownUpClient(context, mode)


def diverged(strategy: Strategy, client_fn: Any, rounds: int = 20) -> tuple[int, str]:
    with pytest.raises(RunDivergedError) as caught:
        run_rounds(strategy, make_proxies(client_fn, NUM_CLIENTS), rounds)
    message = str(caught.value)
    match = re.search(r"at round (\d+):", message)
    assert match is not None, message
    return int(match.group(1)), message


def seeded(factory: Any, **kwargs: Any) -> Strategy:
    return factory(
        initial_parameters=zeros_parameters(), min_available_clients=NUM_CLIENTS, **kwargs
    )


@pytest.mark.parametrize(
    "factory",
    [lambda **kw: FedADMM(rho=1.0, **kw), lambda **kw: FedADMMClientDuals(rho=1.0, **kw)],
    ids=["FedADMM", "FedADMMClientDuals"],
)
def test_learning_rate_ten_stops_the_run_within_a_few_rounds(factory: Any) -> None:
    strategy = seeded(factory)
    number, message = diverged(strategy, admm_client_fn(**LR10))
    assert number == 1, message  # lr rho = 10: the first round already blows up
    name = type(strategy).__name__
    assert message.startswith(f"{name}: the run diverged or stalled at round {number}: ")
    assert "learning_rate * rho > 2" in message and f"{name}(health=None)" in message


@pytest.mark.parametrize(
    "factory",
    [
        lambda **kw: FedADMM(rho=0.1, **kw),
        lambda **kw: FedADMMClientDuals(rho=0.1, **kw),
        lambda **kw: SCAFFOLD(**kw),
        lambda **kw: FedDyn(alpha=0.1, **kw),
        lambda **kw: FedNova(**kw),
    ],
    ids=["FedADMM", "FedADMMClientDuals", "SCAFFOLD", "FedDyn", "FedNova"],
)
def test_blown_up_replies_stop_every_strategy(factory: Any) -> None:
    number, message = diverged(seeded(factory), blown_up("nan"))
    assert number == 3, message
    assert "no reply was accepted in 3 rounds in a row" in message
    assert f"round 3: -, -, -, -; replies 0/{NUM_CLIENTS}/0" in message
    strategy = seeded(factory)
    if not isinstance(strategy, FedADMMClientDuals):  # x 100 breaks its protocol: rejected
        number, message = diverged(strategy, blown_up("x100"))
        assert number <= 5 and ("(growth)" in message or "(explosion)" in message), message


def test_flowers_server_loop_does_not_swallow_the_error() -> None:
    manager = SimpleClientManager()
    for proxy in make_proxies(blown_up("nan"), NUM_CLIENTS):
        manager.register(proxy)
    server = Server(client_manager=manager, strategy=seeded(lambda **kw: FedADMM(rho=0.1, **kw)))
    with pytest.raises(RunDivergedError, match="at round 3: no reply was accepted"):
        server.fit(num_rounds=10, timeout=None)


@pytest.mark.parametrize("workflow", [False, True], ids=["server_fn", "DefaultWorkflow"])
@pytest.mark.parametrize("fault", ["nan", "lost"])
def test_a_legacy_server_app_ends_with_the_error(fault: str, workflow: bool) -> None:
    """Both legacy paths of Flower 1.42 leave ``aggregate_fit``'s errors alone.

    ``ServerApp(server_fn=...)`` runs `Server.fit` through one GridClientProxy per client
    (a reply that never comes is a failure there); an ``@app.main()`` running Flower's
    `DefaultWorkflow` (as the app's SecAgg+ path does) drops it: it counts as failed.
    """
    strategy = seeded(lambda **kw: FedADMM(rho=0.1, **kw))
    components = ServerAppComponents(strategy=strategy, config=ServerConfig(num_rounds=10))
    if workflow:
        app = ServerApp()

        @app.main()
        def main(grid: Grid, context: Context) -> None:
            legacy = LegacyContext(context, config=components.config, strategy=strategy)
            DefaultWorkflow()(grid, legacy)

    else:
        app = ServerApp(server_fn=lambda context: components)
    client_fn = blown_up("nan") if fault == "nan" else admm_client_fn()
    client_app = ClientApp(client_fn=lambda context: client_fn(context).to_client())
    grid = InProcessGrid(client_app, NUM_CLIENTS)
    if fault == "lost":
        grid.offline.update(grid.contexts)
    counts = f"0/{NUM_CLIENTS}/0" if fault == "nan" else f"0/0/{NUM_CLIENTS}"
    context = Context(run_id=1, node_id=0, node_config={}, state=RecordDict(), run_config={})
    with flower_task_identity(), pytest.raises(RunDivergedError, match="at round 3") as caught:
        app(grid, context)
    assert f"round 3: -, -, -, -; replies {counts}" in str(caught.value)


def test_a_healthy_run_is_bit_identical_with_the_watchdog_on_and_off() -> None:
    runs = []
    for health in (HealthCheck(), None):
        strategy, recorder, _ = run_seed(
            FedADMM, 15, client_kwargs={}, rho=0.1, health=health, min_available_clients=10
        )
        runs.append((strategy.history, recorder.matrix))
    (history_on, z_on), (history_off, z_off) = runs
    assert z_on.shape[0] == 15
    np.testing.assert_array_equal(z_on, z_off)
    assert history_on == history_off
