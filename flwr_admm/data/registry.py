"""Task registry: a task is federated data plus the model that fits it."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from flwr_admm.data.seed_logreg import FederatedData, seed_logreg
from flwr_admm.models import LogisticRegression, Model


@dataclass(frozen=True)
class Task:
    """Federated data, a model factory and the task's recommended local settings.

    `make_model()` returns a fresh model; `convex` says whether a centralized optimum
    (and hence an objective gap) is meaningful; `defaults` holds suggested
    hyperparameters (learning_rate, local_steps or local_epochs, batch_size, ...).
    """

    name: str
    data: FederatedData
    make_model: Callable[[], Model]
    convex: bool
    defaults: dict[str, Any] = field(default_factory=dict)


def _seed_logreg(seed: int, **_: Any) -> Task:
    return Task(
        name="seed-logreg",
        data=seed_logreg(seed=seed),
        make_model=lambda: LogisticRegression(20, l2=0.01, fit_intercept=False),
        convex=True,
        defaults={"learning_rate": 1.0, "local_steps": 20},
    )


TASKS: dict[str, Callable[..., Task]] = {"seed-logreg": _seed_logreg}


def load_task(name: str, *, seed: int = 42, **options: Any) -> Task:
    """Build task `name` deterministically from `seed` (options: partitioner, ...)."""
    if name not in TASKS:
        raise ValueError(f"task: must be one of {sorted(TASKS)}, got {name!r}")
    return TASKS[name](seed=seed, **options)
