"""A user's Message-API app on seed 000's task, as issue 11's must-show describes it.

`plain_app`: a FedProx-style ``@app.train()`` handler written with Flower's Message API
only (start at the received arrays, add proximal-mu/2 ||w - received||^2, 20 gradient
steps of lr 1.0, return the trained arrays). `warm_app`: the same handler starting from
its own last w (``context.state``) through `flwr_admm.clientapp.ADMMTrainStep`.
`routed_app` runs either handler, by the ``test-handler`` key of the train config (one
engine run for both). `server_app` runs one or more strategies with ``strategy.start``
in one ``@app.main()`` and records z per round through ``evaluate_fn``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from flower_run import D, seed_data, seed_model
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from flwr.serverapp import Grid, ServerApp
from flwr.serverapp.strategy import Strategy

from flwr_admm.clientapp import ADMMTrainStep
from flwr_admm.clientapp.identity import identity_reply

LOCAL_STEPS = 20
LR = 1.0


def local_data(context: Context) -> tuple[np.ndarray, np.ndarray]:
    i = int(context.node_config["partition-id"])
    data = seed_data()
    return data.X[i], seed_model().encode_labels(data.y[i])


def fedprox_steps(
    start: list[np.ndarray], received: list[np.ndarray], mu: float, X: np.ndarray, y: np.ndarray
) -> tuple[list[np.ndarray], float]:
    """20 gradient steps on f_i(w) + mu/2 ||w - received||^2 from `start`."""
    model, w = seed_model(), [a.copy() for a in start]
    for _ in range(LOCAL_STEPS):
        _, grads = model.loss_and_grad(w, X, y)
        w = [wk - LR * (g + mu * (wk - rk)) for wk, g, rk in zip(w, grads, received, strict=True)]
    return w, float(model.loss(w, X, y))


plain_app = ClientApp()


@plain_app.train()
def plain_train(msg: Message, context: Context) -> Message:
    X, y = local_data(context)
    received = msg.content["arrays"].to_numpy_ndarrays()
    mu = float(msg.content["config"].get("proximal-mu", 0.0))
    w, loss = fedprox_steps(received, received, mu, X, y)
    metrics = MetricRecord({"loss": loss, "num-examples": len(y)})
    return Message(RecordDict({"arrays": ArrayRecord(w), "metrics": metrics}), reply_to=msg)


warm_app = ClientApp()


@warm_app.train()
def warm_train(msg: Message, context: Context) -> Message:
    X, y = local_data(context)
    step = ADMMTrainStep.from_message(msg, context)
    start = list(step.start().values())
    w, loss = fedprox_steps(start, list(step.center.values()), step.rho, X, y)
    return step.reply(w, len(y), {"loss": loss}, context)


HANDLER_KEY = "test-handler"
routed_app = ClientApp()


@routed_app.train()
def routed_train(msg: Message, context: Context) -> Message:
    """`warm_train` when the train config says ``test-handler = "warm"``, else `plain_train`."""
    warm = msg.content["config"].get(HANDLER_KEY) == "warm"
    return (warm_train if warm else plain_train)(msg, context)


@routed_app.query()
def routed_query(msg: Message, context: Context) -> Message:
    """Answer the strategies' identity query (``ClientPolicy(identify=True)``)."""
    return identity_reply(msg, context)


def zeros() -> ArrayRecord:
    return ArrayRecord([np.zeros(D)])


@dataclass
class ZRecorder:
    """An ``evaluate_fn`` for ``strategy.start``: keeps z (its first tensor) every round."""

    z: list[np.ndarray] = field(default_factory=list)

    def __call__(self, server_round: int, arrays: ArrayRecord) -> MetricRecord | None:
        first = next(iter(arrays.values()))  # "0" for a list, the name for a state_dict
        self.z.append(np.asarray(first.numpy(), dtype=np.float64))
        return None

    @property
    def matrix(self) -> np.ndarray:
        return np.array(self.z)


@dataclass
class Run:
    """One ``strategy.start`` of a ServerApp: strategy, rounds and its z recorder."""

    strategy: Strategy
    rounds: int
    recorder: ZRecorder = field(default_factory=ZRecorder)
    train_config: dict[str, Any] | None = None


def server_app(runs: Sequence[Run]) -> ServerApp:
    """Return a ServerApp whose ``@app.main()`` runs each of `runs` in turn from z = 0."""
    app = ServerApp()

    @app.main()
    def main(grid: Grid, context: Context) -> None:
        for run in runs:
            config = None if run.train_config is None else ConfigRecord(run.train_config)
            run.strategy.start(
                grid, zeros(), num_rounds=run.rounds, train_config=config, evaluate_fn=run.recorder
            )

    return app
