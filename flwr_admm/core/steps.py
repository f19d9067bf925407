"""The z-step, the dual step and the round report of consensus ADMM (numpy, blocked).

With the running sums S_w, S_y, S_s, N (`flwr_admm.core.sums`), rho_bar = rho S_s / N,
alpha the over-relaxation and R, W the replies' part of S_w, S_s:

    z'   = prox_{g/rho_bar}((S_w - (1 - alpha)(R - W z)) / S_s + S_y / (rho S_s))
    y_i += rho_i (alpha (w_i - z') + (1 - alpha)(z - z'))       (replying clients)

``z_average="replies"`` averages the round's replies only, as FedDyn's server does
(Acar et al. 2021), so that a client sampled long ago stops pulling z towards its old
model; the duals of every client seen keep counting:

    replies:  z' = prox_{g/rho_bar}((alpha R + (1 - alpha) W z) / W + S_y / (rho S_s))

Both have the same fixed point (at rest w_i = z' = z, y_i = -grad f_i(z)); with every
cached client replying both are the textbook step, and with rho = 0 "replies" is FedAvg.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Literal, NamedTuple

import numpy as np
from numpy.typing import NDArray

from flwr_admm.core.kernels import BLOCK, axpy, blocks
from flwr_admm.core.regularizers import Regularizer
from flwr_admm.core.sums import RunningSums
from flwr_admm.core.types import Arrays, ClientRecord, Reply, RoundReport


class DualStats(NamedTuple):
    """P-weighted sums over the replies, gathered by `dual_step` (p_i = n_i / sum n_j)."""

    r_sq: float  # sum p_i ||w_i - z'||^2
    w_sq: float  # sum p_i ||w_i||^2
    y_sq: float  # sum p_i ||y_i||^2, after the dual step
    c: float | None = None  # the alignment c_k (`core.schedules.AdaptiveDualStep`), if asked


def sum_sq_norm(arrays: Iterable[NDArray[np.float64]]) -> float:
    """Return sum_j ||a_j||^2 (np.vdot per array, summed in order)."""
    return float(sum(np.vdot(a, a) for a in arrays))


def z_step(
    sums: RunningSums,
    shares: Arrays,
    weight: float,
    z: Arrays,
    *,
    rho: float,
    relaxation: float,
    regularizer: Regularizer | None,
) -> tuple[Arrays, Arrays]:
    """Return z' = prox_{g/rho_bar}((S_w - (1 - alpha)(R - W z)) / S_s + S_y / (rho S_s)), z - z'.

    z is the round's center; R (`shares`) and W (`weight`) are the replies' part of
    S_w and S_s (the relaxed term vanishes when alpha = 1).
    """
    beta = 1.0 - relaxation
    c_y = 1.0 / (rho * sums.ns) if rho != 0.0 else 0.0
    # S_w / S_s into new arrays: `acc / ns` turns a 0-d tensor into a numpy scalar,
    # which the in-place terms below would silently leave alone
    z_new = [np.divide(acc, sums.ns, out=np.empty_like(acc)) for acc in sums.nsw]
    if rho != 0.0:
        for t, acc in zip(z_new, sums.ny, strict=True):
            axpy(c_y, acc, t)  # + S_y / (rho S_s)
    if beta != 0.0:
        for t, share, center in zip(z_new, shares, z, strict=True):
            axpy(-beta / sums.ns, share, t)  # - (1 - alpha) R / S_s
            axpy(beta * weight / sums.ns, center, t)  # + (1 - alpha) W z / S_s
    if regularizer is not None:
        regularizer.prox_(z_new, sums.rho_bar(rho))
    return z_new, [a - b for a, b in zip(z, z_new, strict=True)]


def dual_step(
    ordered: Sequence[Reply],
    records: dict[str, ClientRecord],
    z_new: Arrays,
    dz: Arrays | None,
    sums: RunningSums,
    shares: Arrays,
    weight: float,
    *,
    rho: float,
    relaxation: float,
    gamma: float = 1.0,
    aligned: bool = False,
) -> DualStats:
    """Update y_i += gamma rho_i (alpha (w_i - z') + (1 - alpha) dz) of the replies, and S_y.

    dz = z - z' (None only when alpha = 1). When every cached client replied, S_w is
    their sum R and S_y += rho (alpha (R - W z') + (1 - alpha) W dz) takes a few passes;
    otherwise each reply adds n_i rho_i alpha (w_i - z') while its block is in cache.
    Blocks outer, replies inner: w_i and y_i are read from memory once per reply.
    `aligned` also returns the alignment c_k of the residuals w_i - z' with the duals
    before the step, from the same pass (None when rho = 0 or either side is zero).
    """
    alpha, beta = relaxation, 1.0 - relaxation
    if dz is None and beta != 0.0:
        raise ValueError("dz: z - z' is needed when relaxation != 1")
    total = float(sum(r.num_examples for r in ordered))
    chosen = [records[reply.key] for reply in ordered]
    everyone = len(ordered) == len(records)
    r_sq = w_sq = y_sq = 0.0
    for reply, record in zip(ordered, chosen, strict=True):
        p = record.num_examples / total
        w_sq += p * (reply.sq_norm if reply.sq_norm is not None else sum_sq_norm(record.w))
    step = rho * gamma  # y_i += gamma rho_i (...): the dual step size
    parts = _numpy_blocks(chosen, z_new, dz, sums.ny, step, alpha, everyone, aligned)
    for record, r_part, y_part in zip(chosen, parts.r, parts.y, strict=True):
        p = record.num_examples / total
        for r_value, y_value in zip(r_part, y_part, strict=True):
            r_sq += p * r_value
            y_sq += p * y_value
    if step != 0.0:
        for j, (acc, z) in enumerate(zip(sums.ny, z_new, strict=True)):
            if everyone:  # shares are S_w = R: S_y += rho alpha (R - W z'), no temporary
                axpy(step * alpha, shares[j], acc)
                axpy(-step * alpha * weight, z, acc)
            if dz is not None:
                axpy(step * beta * weight, dz[j], acc)  # S_y += rho (1 - alpha) W dz
        sums.moving.update(reply.key for reply in ordered)  # their y_i moved
    c = _alignment(chosen, parts, total, rho) if aligned else None
    return DualStats(r_sq, w_sq, y_sq, c)


class _BlockParts(NamedTuple):
    """Per reply, per block: ||w_i - z'||^2, ||y_i'||^2; if asked <w_i - z', y_i>, ||y_i||^2."""

    r: list[list[float]]
    y: list[list[float]]
    along: list[list[float]]  # before the step
    dual: list[list[float]]  # before the step


def _alignment(
    chosen: Sequence[ClientRecord], parts: _BlockParts, total: float, rho: float
) -> float | None:
    """Return c_k from the per-block sums (`flwr_admm.core.schedules`); None if undefined."""
    if rho == 0.0:
        return None
    along = residual_sq = dual_sq = 0.0
    for k, record in enumerate(chosen):
        p, rho_i = record.num_examples / total, rho * record.scale
        for a, r, q in zip(parts.along[k], parts.r[k], parts.dual[k], strict=True):
            along += p * rho_i * a
            residual_sq += p * rho_i * rho_i * r
            dual_sq += p * q
    if residual_sq == 0.0 or dual_sq == 0.0:
        return None
    return along / math.sqrt(residual_sq * dual_sq)


def _numpy_blocks(
    chosen: Sequence[ClientRecord],
    z_new: Arrays,
    dz: Arrays | None,
    ny: Arrays,
    rho: float,
    alpha: float,
    everyone: bool,
    aligned: bool,
) -> _BlockParts:
    """Run the dual step's block loop in numpy; the per-block sums of `_BlockParts`."""
    beta = 1.0 - alpha
    scratch = np.empty(min(BLOCK, max(t.size for t in z_new)))
    # Blocks outer, replies inner: the blocks of z', dz and S_y stay in cache while
    # every reply's block passes. Each y_i and S_y element sees the same operations in
    # the same reply order as a replies-outer loop, and the per-block dot products are
    # summed afterwards in replies-outer order, so the result is bit for bit the same.
    parts = _BlockParts([[] for _ in chosen], [[] for _ in chosen], [], [])
    if aligned:
        parts.along.extend([] for _ in chosen)
        parts.dual.extend([] for _ in chosen)
    for j, (z, acc) in enumerate(zip(z_new, ny, strict=True)):
        z_flat, acc_flat = z.reshape(-1), acc.reshape(-1)
        shift_flat = None if dz is None else dz[j].reshape(-1)
        for block in blocks(z_flat.size):
            d = scratch[: block.stop - block.start]
            z_block, acc_block = z_flat[block], acc_flat[block]
            shift_block = None if shift_flat is None else shift_flat[block]
            for k, record in enumerate(chosen):
                rho_i = rho * record.scale
                to_sum = 0.0 if everyone else record.num_examples * rho_i * alpha
                y_block = record.y[j].reshape(-1)[block]
                w_block = record.w[j].reshape(-1)[block]
                np.subtract(w_block, z_block, out=d)  # w_i - z'
                parts.r[k].append(float(np.dot(d, d)))
                if aligned:  # c_k's terms, y_i before the step
                    parts.along[k].append(float(np.dot(d, y_block)))
                    parts.dual[k].append(float(np.dot(y_block, y_block)))
                axpy(rho_i * alpha, d, y_block)  # y_i += rho_i alpha (w_i - z')
                if shift_block is not None:
                    axpy(rho_i * beta, shift_block, y_block)  # + rho_i (1 - alpha) dz
                parts.y[k].append(float(np.dot(y_block, y_block)))
                axpy(to_sum, d, acc_block)  # S_y += n_i rho_i alpha (w_i - z')
    return parts


def round_report(
    ordered: Sequence[Reply],
    z_new: Arrays,
    dz_sq: float,
    stats: DualStats,
    sums: RunningSums,
    *,
    rho: float,
    eps_abs: float,
    eps_rel: float,
    regularizer: Regularizer | None,
    num_clients_cached: int,
) -> RoundReport:
    """Return Boyd's residuals and thresholds of the round (Boyd et al. 2011, 3.3).

    p_i over the replies, n the number of parameters, `dz_sq` = ||z' - z||^2:

        r        = sqrt(sum p_i ||w_i - z'||^2),   s = rho_bar ||z' - z||
        eps_pri  = sqrt(n) eps_abs + eps_rel max(sqrt(sum p_i ||w_i||^2), ||z'||)
        eps_dual = sqrt(n) eps_abs + eps_rel sqrt(sum p_i ||y_i||^2)

    `next_rho` is `rho` until the schedule has run.
    """
    total = float(sum(r.num_examples for r in ordered))
    dual = sums.rho_bar(rho) * math.sqrt(dz_sq)
    root_n = math.sqrt(int(sum(t.size for t in z_new)))
    z_sq = sum_sq_norm(z_new)
    primal_scale = max(math.sqrt(stats.w_sq), math.sqrt(z_sq))
    dual_scale = math.sqrt(stats.y_sq)
    losses = [(r.num_examples, r.loss) for r in ordered]
    objective = None
    if all(loss is not None and math.isfinite(loss) for _, loss in losses):
        objective = sum(n * float(loss) for n, loss in losses if loss is not None) / total
        if regularizer is not None:
            objective += regularizer.value(z_new)
    return RoundReport(
        rho=rho,
        next_rho=rho,
        primal_residual=math.sqrt(stats.r_sq),
        dual_residual=dual,
        eps_primal=root_n * eps_abs + eps_rel * primal_scale,
        eps_dual=root_n * eps_abs + eps_rel * dual_scale,
        objective=objective,
        num_replies=len(ordered),
        num_clients_cached=num_clients_cached,
        primal_scale=primal_scale,
        dual_scale=dual_scale,
    )


ZAverage = Literal["cached", "replies"]
Z_AVERAGES: tuple[str, ...] = ("cached", "replies")


def check_z_average(value: object) -> ZAverage:
    """Return `value` if it is in Z_AVERAGES; ValueError naming the field otherwise."""
    if not isinstance(value, str) or value not in Z_AVERAGES:
        raise ValueError(f"z_average: must be one of {list(Z_AVERAGES)}, got {value!r}")
    return "replies" if value == "replies" else "cached"


def averaged_z_step(
    sums: RunningSums,
    shares: Arrays,
    weight: float,
    z: Arrays,
    *,
    z_average: ZAverage,
    rho: float,
    relaxation: float,
    regularizer: Regularizer | None,
) -> tuple[Arrays, Arrays]:
    """Return z' averaging every cached w_i ("cached", `z_step`) or the replies' only, z - z'.

    "replies": the module's second formula, with R = `shares` and W = `weight`. Pass
    "cached" when every cached client replied (the same step).
    """
    if z_average == "cached":
        return z_step(
            sums,
            shares,
            weight,
            z,
            rho=rho,
            relaxation=relaxation,
            regularizer=regularizer,
        )
    # into new arrays: `c * share` would turn a 0-d tensor into a numpy scalar, which
    # the in-place terms below would silently leave alone
    z_new = [
        np.multiply(np.asarray(share, dtype=np.float64), relaxation / weight, out=np.empty_like(c))
        for share, c in zip(shares, z, strict=True)
    ]
    if relaxation != 1.0:
        for t, center in zip(z_new, z, strict=True):
            axpy(1.0 - relaxation, center, t)  # + (1 - alpha) z
    if rho != 0.0:
        for t, acc in zip(z_new, sums.ny, strict=True):
            axpy(1.0 / (rho * sums.ns), acc, t)  # + S_y / (rho S_s)
    if regularizer is not None:
        regularizer.prox_(z_new, sums.rho_bar(rho))
    return z_new, [a - b for a, b in zip(z, z_new, strict=True)]
