"""Which local models the z-step averages: every cached client's, or this round's replies.

With partial participation the textbook z-step (`flwr_admm.core.steps.z_step`) averages
the last w_i of every client seen so far, so a client sampled ten rounds ago still pulls
z towards its ten-round-old model. ``z_average="replies"`` averages only the models
that arrived this round (FedDyn's server does the same, Acar et al. 2021), while the
duals of every client seen keep counting. With R = sum_{i in S} n_i s_i w_i and
W = sum_{i in S} n_i s_i over the round's replies S:

    cached:   z' = prox_{g/rho_bar}((S_w - (1 - alpha)(R - W z)) / S_s + S_y / (rho S_s))
    replies:  z' = prox_{g/rho_bar}((alpha R + (1 - alpha) W z) / W + S_y / (rho S_s))

The dual step is unchanged (y_i += rho_i (alpha (w_i - z') + (1 - alpha)(z - z')) for
the replies). The fixed point is the same optimum: once every client's reply stops
moving, w_i = z' = z (dual step), so S_y = 0 in the z-step without g (and S_y / N in
the subdifferential of g with it), and each local solve gives y_i = -grad f_i(z):
sum_i n_i grad f_i(z) + N dg(z) contains 0. When every cached client replied, R = S_w
and W = S_s, and both are the textbook step (the same code runs). With rho = 0 the
replies option is Flower's FedAvg exactly (no stale models).
"""

from __future__ import annotations

from typing import Literal

import numpy as np

from flwr_admm.core.kernels import axpy
from flwr_admm.core.regularizers import Regularizer
from flwr_admm.core.steps import z_step
from flwr_admm.core.sums import RunningSums
from flwr_admm.core.types import Arrays

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

    "replies": z' = prox_{g/rho_bar}((alpha R + (1 - alpha) W z) / W + S_y / (rho S_s)),
    `shares` R and `weight` W being the replies' part of S_w and S_s; z is the round's
    center. Pass "cached" when every cached client replied (the same step).
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
