"""Test helpers: seed-task clients and strategy runs through `flwr_admm.testing`."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cache
from typing import Any

import numpy as np
from flwr.common import Context, NDArrays, Scalar, ndarrays_to_parameters
from flwr.server.strategy import Strategy

from flwr_admm.client import ADMMClient
from flwr_admm.data.base import FederatedData
from flwr_admm.data.seed_logreg import seed_logreg
from flwr_admm.models import LogisticRegression
from flwr_admm.testing import RunResult, make_proxies, run_rounds

C = 0.01
D = 20
NUM_CLIENTS = 10


@cache
def seed_data() -> FederatedData:
    """Seed 000's task (10 clients, d = 20, 500 samples each, labels +-1)."""
    return seed_logreg()


def seed_model() -> LogisticRegression:
    """The seed's model: logistic regression, C = 0.01, no intercept."""
    return LogisticRegression(D, l2=C, fit_intercept=False)


def zeros_parameters() -> Any:
    """z^0 = 0, as in the seed."""
    return ndarrays_to_parameters([np.zeros(D)])


def admm_client_fn(**client_kwargs: Any) -> Callable[[Context], ADMMClient]:
    """client_fn building an ADMMClient on partition ``partition-id`` of the seed task."""
    data = seed_data()

    def client_fn(context: Context) -> ADMMClient:
        i = int(context.node_config["partition-id"])
        return ADMMClient(seed_model(), data.X[i], data.y[i], context=context, **client_kwargs)

    return client_fn


@dataclass
class Recorder:
    """An ``evaluate_fn`` that stores z after every round (the driver calls it)."""

    z: list[np.ndarray] = field(default_factory=list)
    hook: Callable[[int], None] | None = None

    def __call__(self, server_round: int, parameters: NDArrays, config: dict[str, Scalar]) -> None:
        """Record a copy of z; never reports a loss."""
        self.z.append(np.array(parameters[0], dtype=np.float64))
        if self.hook is not None:
            self.hook(server_round)

    @property
    def matrix(self) -> np.ndarray:
        """z of every round stacked, shape (rounds, d)."""
        return np.array(self.z)


def run_seed(
    strategy_factory: Callable[..., Strategy],
    rounds: int,
    *,
    client_kwargs: dict[str, Any],
    on_round: Callable[[Any, int], None] | None = None,
    **strategy_kwargs: Any,
) -> tuple[Any, Recorder, RunResult]:
    """Run `rounds` rounds of the seed task in process and record z per round.

    ``on_round(strategy, server_round)`` runs after every aggregation.
    """
    recorder = Recorder()
    strategy = strategy_factory(
        initial_parameters=zeros_parameters(), evaluate_fn=recorder, **strategy_kwargs
    )
    if on_round is not None:
        recorder.hook = lambda server_round: on_round(strategy, server_round)
    proxies = make_proxies(admm_client_fn(**client_kwargs), NUM_CLIENTS)
    result = run_rounds(strategy, proxies, rounds)
    return strategy, recorder, result


def relative_errors(actual: np.ndarray, expected: np.ndarray) -> np.ndarray:
    """Per-round ||actual_k - expected_k|| / ||expected_k|| over the leading axis."""
    axes = tuple(range(1, expected.ndim))
    diff = np.sqrt(np.sum((actual - expected) ** 2, axis=axes))
    return diff / np.sqrt(np.sum(expected**2, axis=axes))
