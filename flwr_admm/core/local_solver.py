"""The penalized local loop a client runs: inexact minimization of the augmented term.

    min_w  f_i(w) + <a, w> + rho/2 ||w - v||^2

with v the prox center (z - u_i for ADMM, the received model for FedProx, no penalty
for FedAvg) and a constant linear term a (SCAFFOLD's c - c_i, FedDyn's -grad_i; else
zero). Two update rules for one step with gradient g = grad f_i(w) + a:

- ``"gradient"``: w <- w - lr (g + rho (w - v))
- ``"exact"`` (proximal gradient, the quadratic solved in closed form):
  w <- (w - lr g + lr rho v) / (1 + lr rho), stable for every rho >= 0.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import numpy as np
from numpy.typing import NDArray

from flwr_admm.models.base import Model, Params

ProxStep = Literal["gradient", "exact"]
PROX_STEPS = ("gradient", "exact")


@dataclass(frozen=True)
class LocalResult:
    """Outcome of the local loop."""

    params: Params
    steps: int
    loss: float
    grad_norm: float


@dataclass(frozen=True)
class LocalPlan:
    """How long and how to run the loop: `steps` full/mini-batch steps or `epochs`."""

    learning_rate: float
    steps: int | None = None
    epochs: int | None = None
    batch_size: int | None = None
    prox_step: ProxStep = "exact"
    grad_tol: float | None = None

    def __post_init__(self) -> None:
        if not (math.isfinite(self.learning_rate) and self.learning_rate > 0):
            raise ValueError(
                f"learning_rate: must be a finite number > 0, got {self.learning_rate!r}"
            )
        if (self.steps is None) == (self.epochs is None):
            raise ValueError("local_steps / local_epochs: set exactly one of them")
        for name in ("steps", "epochs", "batch_size"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or int(value) != value or value < 1):
                raise ValueError(f"local_{name}: must be an integer >= 1, got {value!r}")
        if self.prox_step not in PROX_STEPS:
            raise ValueError(
                f"prox_step: must be one of {list(PROX_STEPS)}, got {self.prox_step!r}"
            )
        if self.grad_tol is not None and not (math.isfinite(self.grad_tol) and self.grad_tol >= 0):
            raise ValueError(f"grad_tol: must be a finite number >= 0, got {self.grad_tol!r}")

    def batches(self, n: int, rng: np.random.Generator) -> list[NDArray[np.intp] | None]:
        """Index sets per step; None means the full batch."""
        if self.batch_size is None or self.batch_size >= n:
            count = self.steps if self.steps is not None else self.epochs
            return [None] * int(count or 0)
        batches: list[NDArray[np.intp] | None] = []
        if self.epochs is not None:
            for _ in range(self.epochs):
                order = rng.permutation(n)
                batches.extend(order[i : i + self.batch_size] for i in range(0, n, self.batch_size))
            return batches
        order = rng.permutation(n)
        position = 0
        assert self.steps is not None
        for _ in range(self.steps):
            if position + self.batch_size > n:
                order, position = rng.permutation(n), 0
            batches.append(order[position : position + self.batch_size])
            position += self.batch_size
        return batches


def penalized_local_solve(
    model: Model,
    start: Params,
    X: NDArray[np.float64],
    y: NDArray[np.int64],
    plan: LocalPlan,
    *,
    center: Params | None = None,
    rho: float = 0.0,
    rng: np.random.Generator | None = None,
    linear: Params | None = None,
) -> LocalResult:
    """Run the local loop from `start`; `center=None` or rho=0 is plain gradient descent.

    `linear` is a (None: 0). The result's loss is f_i on the full local data and its
    grad_norm the norm of the last penalized gradient (a included).
    """
    if rho < 0 or not math.isfinite(rho):
        raise ValueError(f"rho: must be a finite number >= 0, got {rho!r}")
    penalized = center is not None and rho > 0.0
    lr = plan.learning_rate
    # The models are small, so a step costs mostly numpy calls per tensor: w and the
    # scaled gradient live in one flat buffer each (w as per-tensor views into it),
    # so the update below is four calls per step whatever the number of tensors.
    w_flat, w = _flat_views([np.shape(t) for t in start])
    for wk, t in zip(w, start, strict=True):
        wk[...] = t
    g_flat, g_views = _flat_views([wk.shape for wk in w])
    a_flat: NDArray[np.float64] | None = None
    if linear is not None:
        a_flat, a_views = _flat_views([wk.shape for wk in w])
        for ak, t in zip(a_views, linear, strict=True):
            ak[...] = t
    rng = rng if rng is not None else np.random.default_rng(0)
    batches = plan.batches(X.shape[0], rng)
    # One step is w <- keep * w - scale * g + shift, constants computed once:
    #   exact:    keep = 1/(1 + lr rho), scale = lr/(1 + lr rho), shift = lr rho v/(1 + lr rho)
    #   gradient: keep = 1 - lr rho,     scale = lr,              shift = lr rho v
    #   no penalty: keep = 1, scale = lr, shift = 0
    shift: NDArray[np.float64] | None = None
    if penalized and center is not None:
        exact = plan.prox_step == "exact"
        keep = 1.0 / (1.0 + lr * rho) if exact else 1.0 - lr * rho
        scale = lr * keep if exact else lr
        v_flat, v_views = _flat_views([wk.shape for wk in w])
        for vk, c in zip(v_views, center, strict=True):
            vk[...] = c
        shift = v_flat
        shift *= lr * rho / (1.0 + lr * rho) if exact else lr * rho
    else:
        keep, scale = 1.0, lr
    check_every_step, last = plan.grad_tol is not None, len(batches) - 1
    steps, grad_norm = 0, math.nan
    for k, index in enumerate(batches):
        Xb, yb = (X, y) if index is None else (X[index], y[index])
        _, grads = model.loss_and_grad(w, Xb, yb)
        for gk, g in zip(g_views, grads, strict=True):
            gk[...] = g
        if a_flat is not None:
            g_flat += a_flat
            grads = g_views
        if check_every_step or k == last:
            grad_norm = _penalized_norm(grads, w, center if penalized else None, rho)
            if plan.grad_tol is not None and grad_norm <= plan.grad_tol:
                break
        if keep != 1.0:
            w_flat *= keep
        g_flat *= scale
        w_flat -= g_flat
        if shift is not None:
            w_flat += shift
        steps += 1
    return LocalResult(params=w, steps=steps, loss=model.loss(w, X, y), grad_norm=grad_norm)


def _flat_views(shapes: list[tuple[int, ...]]) -> tuple[NDArray[np.float64], Params]:
    """One float64 buffer and a view into it of each shape, in order."""
    flat = np.empty(sum(math.prod(shape) for shape in shapes))
    views, offset = [], 0
    for shape in shapes:
        size = math.prod(shape)
        views.append(flat[offset : offset + size].reshape(shape))
        offset += size
    return flat, views


def _penalized_norm(grads: Params, w: Params, center: Params | None, rho: float) -> float:
    """||grad f(w) + rho (w - v)|| (just ||grad f(w)|| without a center)."""
    if center is None:
        return math.sqrt(sum(float(np.vdot(g, g)) for g in grads))
    total = 0.0
    for g, wk, vk in zip(grads, w, center, strict=True):
        full = g + rho * (wk - vk)
        total += float(np.vdot(full, full))
    return math.sqrt(total)
