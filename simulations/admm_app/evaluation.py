"""Server-side evaluation of the global model z on the pooled federated data.

objective F(z) = sum_i p_i f_i(z), p_i = n_i / n (the federated training objective);
gap = F(z) - F*, relative_gap = gap / |F*|, with F* from L-BFGS on the pooled data
(convex tasks only, cached on disk). Accuracy and AUC are measured on the pooled test
split when the task has one, else on the training data; binary tasks also report
every client's AUC and the worst one.
"""

from __future__ import annotations

import hashlib
import json
import math
import time
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from numpy.typing import NDArray

from flwr_admm.data import Task, load_task
from flwr_admm.models import Model

if TYPE_CHECKING:
    from scipy.optimize import OptimizeResult

Params = list[NDArray[np.float64]]


@lru_cache(maxsize=4)
def _cached_task(name: str, seed: int, options: tuple[tuple[str, Any], ...]) -> Task:
    return load_task(name, seed=seed, **dict(options))


def get_task(name: str, seed: int, options: dict[str, Any]) -> Task:
    """`load_task` memoized per process (Ray actors serve many messages)."""
    return _cached_task(name, seed, tuple(sorted(options.items())))


def federated_objective(
    model: Model, params: Params, X: list[NDArray[np.float64]], y: list[NDArray[np.int64]]
) -> tuple[float, Params]:
    """F(params) = sum_i p_i f_i(params) and its gradient, clients in index order."""
    n = float(sum(len(yi) for yi in y))
    total, grads = 0.0, [np.zeros_like(p) for p in params]
    for Xi, yi in zip(X, y, strict=True):
        loss, grad = model.loss_and_grad(params, Xi, yi)
        weight = len(yi) / n
        total += weight * loss
        for g, gi in zip(grads, grad, strict=True):
            g += weight * gi
    return total, grads


def problem_fingerprint(
    model: Model, X: list[NDArray[np.float64]], y: list[NDArray[np.int64]]
) -> str:
    """sha256 of the data, the parameter shapes and F and grad F at a fixed probe point.

    The probe catches everything else that changes the objective (ridge strength,
    intercept, model type) without having to know the model's attributes.
    """
    digest = hashlib.sha256(json.dumps(model.shapes).encode())
    for Xi, yi in zip(X, y, strict=True):
        digest.update(np.ascontiguousarray(Xi, dtype=np.float64).tobytes())
        digest.update(np.ascontiguousarray(yi, dtype=np.int64).tobytes())
    rng = np.random.default_rng(0)
    probe = [0.1 * rng.standard_normal(shape) for shape in model.shapes]
    loss, grads = federated_objective(model, probe, X, y)
    digest.update(np.asarray([loss]).tobytes())
    for g in grads:
        digest.update(np.ascontiguousarray(g).tobytes())
    return digest.hexdigest()[:16]


@dataclass(frozen=True)
class Optimum:
    """Centralized minimizer of F and its value; grad_norm says how exact it is."""

    params: Params
    objective: float
    grad_norm: float


def centralized_optimum(
    model: Model,
    X: list[NDArray[np.float64]],
    y: list[NDArray[np.int64]],
    cache_dir: Path | None = None,
    *,
    max_seconds: float = 60.0,
) -> Optimum:
    """min_w F(w) by L-BFGS-B, cached as ``optimum-<fingerprint>.npz``.

    Runs to gradient norm ~1e-12 or `max_seconds`; `Optimum.grad_norm` tells how
    exact it is (a problem without a finite minimizer never gets there).
    """
    # imported here, not at the top: every ClientApp process imports this module
    from scipy.optimize import minimize

    shapes = model.shapes
    path = None
    if cache_dir is not None:
        path = cache_dir / f"optimum-{problem_fingerprint(model, X, y)}.npz"
        if path.exists():
            stored = np.load(path)
            params = _unflatten(stored["w"], shapes)
            return Optimum(params, float(stored["objective"]), float(stored["grad_norm"]))

    def fun(flat: NDArray[np.float64]) -> tuple[float, NDArray[np.float64]]:
        loss, grads = federated_objective(model, _unflatten(flat, shapes), X, y)
        return loss, np.concatenate([g.ravel() for g in grads])

    deadline = time.monotonic() + max_seconds

    def stop_when_late(intermediate_result: OptimizeResult) -> None:
        if time.monotonic() > deadline:
            raise StopIteration

    x0 = np.concatenate([p.ravel() for p in model.init_params(0)])
    result = minimize(
        fun,
        x0,
        jac=True,
        method="L-BFGS-B",
        callback=stop_when_late,
        options={"maxiter": 50000, "maxcor": 30, "gtol": 1e-12, "ftol": 1e-16},
    )
    loss, grad = fun(result.x)
    optimum = Optimum(_unflatten(result.x, shapes), float(loss), float(np.linalg.norm(grad)))
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp.npz")
        np.savez(tmp, w=result.x, objective=optimum.objective, grad_norm=optimum.grad_norm)
        tmp.replace(path)
    return optimum


def _unflatten(flat: NDArray[np.float64], shapes: list[tuple[int, ...]]) -> Params:
    out, start = [], 0
    for shape in shapes:
        size = int(np.prod(shape))
        out.append(np.asarray(flat[start : start + size], dtype=np.float64).reshape(shape))
        start += size
    return out


@dataclass
class Evaluator:
    """Callable `evaluate_fn(server_round, ndarrays, config) -> (F(z), metrics)`."""

    task: Task
    model: Model
    X: list[NDArray[np.float64]] = field(default_factory=list)
    y: list[NDArray[np.int64]] = field(default_factory=list)
    optimum: Optimum | None = None
    client_eval: list[tuple[NDArray[np.float64], NDArray[np.int64]]] = field(default_factory=list)

    @classmethod
    def build(cls, task: Task, cache_dir: Path | None) -> Evaluator:
        """Encode the data once and, for convex tasks, find (or load) F*."""
        model = task.make_model()
        X = [model.check_data(Xi) for Xi in task.data.X]
        y = [model.encode_labels(yi) for yi in task.data.y]
        evaluator = cls(task, model, X, y)
        if task.data.X_test is not None and task.data.y_test is not None:
            evaluator.client_eval = [
                (model.check_data(Xi), model.encode_labels(yi))
                for Xi, yi in zip(task.data.X_test, task.data.y_test, strict=True)
            ]
        else:
            evaluator.client_eval = list(zip(X, y, strict=True))
        if task.convex:
            evaluator.optimum = centralized_optimum(model, X, y, cache_dir)
        return evaluator

    def __call__(
        self, server_round: int, ndarrays: list[NDArray[Any]], config: dict[str, Any]
    ) -> tuple[float, dict[str, Any]]:
        """F(z), gap, accuracies and AUCs of the global model."""
        params = [np.asarray(a, dtype=np.float64) for a in ndarrays]
        objective, _ = federated_objective(self.model, params, self.X, self.y)
        metrics: dict[str, Any] = {"objective": objective}
        if self.optimum is not None:
            gap = objective - self.optimum.objective
            metrics["gap"] = gap
            metrics["relative_gap"] = gap / max(abs(self.optimum.objective), 1e-300)
        X_eval = np.concatenate([Xi for Xi, _ in self.client_eval])
        y_eval = np.concatenate([yi for _, yi in self.client_eval])
        proba = self.model.predict_proba(params, X_eval)
        metrics["test_loss"] = float(self.model.loss(params, X_eval, y_eval))
        metrics["test_accuracy"] = float(np.mean(proba.argmax(axis=1) == y_eval))
        if proba.shape[1] == 2:
            metrics.update(self._aucs(params, proba[:, 1], y_eval))
        return float(objective), metrics

    def _aucs(
        self, params: Params, score: NDArray[np.float64], y_eval: NDArray[np.int64]
    ) -> dict[str, Any]:
        # imported here, not at the top: 0.8 s less for every ClientApp process
        from sklearn.metrics import roc_auc_score

        out: dict[str, Any] = {}
        if np.unique(y_eval).size == 2:
            out["test_auc"] = float(roc_auc_score(y_eval, score))
        per_client = []
        for i, (Xi, yi) in enumerate(self.client_eval):
            if np.unique(yi).size == 2:
                auc = float(roc_auc_score(yi, self.model.predict_proba(params, Xi)[:, 1]))
                out[f"client_auc_{i}"] = auc
                per_client.append(auc)
        if per_client:
            out["worst_client_auc"] = min(per_client)
        return out


def finite_or_none(value: Any) -> Any:
    """NaN/inf become None so the JSON stays standard."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value
