"""Task registry: a task is federated data plus the model that fits it.

Every task is a pure function of `seed` and its options, so each ClientApp process can
rebuild it and index ``task.data`` by its partition id. ``task_options(name)`` lists
the options a task accepts; `load_task` rejects any other name.

``defaults`` are the local settings a FedAvg baseline makes steady progress with
(``learning_rate`` plus ``local_epochs`` or ``local_steps``, and ``batch_size``;
``fraction_fit`` / ``min_fit_clients`` where the task samples clients); see each
builder's docstring for how they were chosen.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from flwr_admm.data.base import FederatedData
from flwr_admm.data.credit import FEATURES as CREDIT_FEATURES
from flwr_admm.data.credit import credit_banks
from flwr_admm.data.digits import NUM_CLASSES as DIGITS_CLASSES
from flwr_admm.data.digits import NUM_FEATURES as DIGITS_FEATURES
from flwr_admm.data.digits import digits_federated
from flwr_admm.data.images import IMAGE_SETS, image_federated
from flwr_admm.data.partition import PartitionSpec
from flwr_admm.data.seed_logreg import seed_logreg
from flwr_admm.data.synthetic import NUM_CLASSES, NUM_FEATURES, fedprox_synthetic
from flwr_admm.models import MLP, LogisticRegression, Model, SoftmaxRegression

MODELS = ("softmax", "mlp")


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


def _classifier(
    model: str, n_features: int, n_classes: int, *, l2: float, hidden: int, seed: int
) -> tuple[Callable[[], Model], bool]:
    """(model factory, convex) for ``model`` in `MODELS`."""
    if model == "softmax":
        return lambda: SoftmaxRegression(n_features, n_classes, l2=l2), True
    if model == "mlp":
        return lambda: MLP(n_features, n_classes, n_hidden=hidden, l2=l2, seed=seed), False
    raise ValueError(f"model: must be one of {list(MODELS)}, got {model!r}")


def _seed_logreg(
    seed: int, num_clients: int = 10, n_features: int = 20, samples: int = 500
) -> Task:
    """Seed 000's problem; lr 1.0 with 20 full-batch local steps."""
    return Task(
        name="seed-logreg",
        data=seed_logreg(
            num_clients=num_clients, n_features=n_features, samples=samples, seed=seed
        ),
        make_model=lambda: LogisticRegression(n_features, l2=0.01, fit_intercept=False),
        convex=True,
        defaults={"learning_rate": 1.0, "local_steps": 20},
    )


def _synthetic(
    seed: int,
    alpha: float = 1.0,
    beta: float = 1.0,
    num_clients: int = 30,
    l2: float = 1e-4,
) -> Task:
    """FedProx's Synthetic(alpha, beta), the paper's settings.

    Minibatch SGD with batch 10, 20 local epochs, lr 0.01, 10 clients a round
    (``fraction_fit`` = 10 / num_clients, ``min_fit_clients`` = 10 guards rounding).
    The paper's loss has no ridge term, but its data are close to separable: without
    one the centralized minimizer runs off to infinity (L-BFGS: ||W|| > 70 and still
    growing), so the default ``l2=1e-4`` makes the optimum, and the objective gap,
    well defined; ``l2=0`` is the paper's exact loss.
    """
    per_round = min(10, int(num_clients))
    return Task(
        name="synthetic",
        data=fedprox_synthetic(alpha=alpha, beta=beta, num_clients=num_clients, seed=seed),
        make_model=lambda: SoftmaxRegression(NUM_FEATURES, NUM_CLASSES, l2=l2),
        convex=True,
        defaults={
            "learning_rate": 0.01,
            "local_epochs": 20,
            "batch_size": 10,
            "fraction_fit": per_round / int(num_clients),
            "min_fit_clients": per_round,
        },
    )


def _digits(
    seed: int,
    partitioner: str = "iid",
    dirichlet_alpha: float = 0.5,
    num_clients: int = 10,
    model: str = "softmax",
    standardize: bool = False,
    l2: float = 1e-3,
) -> Task:
    """Digits (64 features in [0, 1]); softmax regression or a 32-unit tanh MLP.

    Defaults: lr 0.5 (softmax) / 0.2 (MLP), 1 local epoch of batches of 16.
    """
    spec = PartitionSpec(kind=partitioner, num_clients=num_clients, dirichlet_alpha=dirichlet_alpha)
    make_model, convex = _classifier(
        model, DIGITS_FEATURES, DIGITS_CLASSES, l2=l2, hidden=32, seed=seed
    )
    return Task(
        name="digits",
        data=digits_federated(spec, seed=seed, standardize=standardize),
        make_model=make_model,
        convex=convex,
        defaults={
            "learning_rate": 0.5 if model == "softmax" else 0.2,
            "local_epochs": 1,
            "batch_size": 16,
        },
    )


def _credit(
    seed: int, test_fraction: float = 0.3, standardize: bool = True, l2: float = 1e-3
) -> Task:
    """Three banks (Lending Club), logistic regression with intercept.

    Defaults: 10 full-batch local steps of lr 0.5, with which FedAvg reaches the
    centralized objective; minibatch SGD stalls above it.
    """
    return Task(
        name="credit",
        data=credit_banks(seed=seed, test_fraction=test_fraction, standardize=standardize),
        make_model=lambda: LogisticRegression(len(CREDIT_FEATURES), l2=l2),
        convex=True,
        defaults={"learning_rate": 0.5, "local_steps": 10},
    )


def _image_task(name: str) -> Callable[..., Task]:
    def build(
        seed: int,
        partitioner: str = "iid",
        dirichlet_alpha: float = 0.5,
        num_clients: int = 10,
        model: str = "softmax",
        standardize: bool = False,
        l2: float = 1e-4,
        dataset: Any = None,
        load_kwargs: dict[str, Any] | None = None,
    ) -> Task:
        spec = PartitionSpec(
            kind=partitioner, num_clients=num_clients, dirichlet_alpha=dirichlet_alpha
        )
        _, _, n_features, n_classes = IMAGE_SETS[name]
        make_model, convex = _classifier(model, n_features, n_classes, l2=l2, hidden=64, seed=seed)
        data = image_federated(
            name,
            spec,
            seed=seed,
            dataset=dataset,
            load_kwargs=load_kwargs,
            standardize=standardize,
        )
        return Task(
            name=name,
            data=data,
            make_model=make_model,
            convex=convex,
            defaults={
                "learning_rate": 0.1 if name == "mnist" else 0.01,
                "local_epochs": 1,
                "batch_size": 32,
            },
        )

    build.__doc__ = (
        f"{name} (flattened pixels in [0, 1]); softmax regression or a 64-unit MLP. "
        "Defaults (1 local epoch of batches of 32, lr 0.1 MNIST / 0.01 CIFAR-10) "
        "follow the digits tuning scaled to the input size; not tuned on the real data."
    )
    return build


TASKS: dict[str, Callable[..., Task]] = {
    "seed-logreg": _seed_logreg,
    "synthetic": _synthetic,
    "digits": _digits,
    "credit": _credit,
    "mnist": _image_task("mnist"),
    "cifar10": _image_task("cifar10"),
}


def task_options(name: str) -> dict[str, Any]:
    """Return the options task `name` accepts, with their default values."""
    if name not in TASKS:
        raise ValueError(f"task: must be one of {sorted(TASKS)}, got {name!r}")
    parameters = inspect.signature(TASKS[name]).parameters.values()
    return {p.name: p.default for p in parameters if p.name != "seed"}


def load_task(name: str, *, seed: int = 42, **options: Any) -> Task:
    """Build task `name` deterministically from `seed` and `options` (`task_options`)."""
    allowed = task_options(name)
    unknown = sorted(set(options) - set(allowed))
    if unknown:
        raise ValueError(f"task {name!r}: unknown option(s) {unknown}; allowed: {sorted(allowed)}")
    if isinstance(seed, bool) or int(seed) != seed or seed < 0:
        raise ValueError(f"seed: must be an integer >= 0, got {seed!r}")
    return TASKS[name](seed=int(seed), **options)
