"""Client side of `FedADMMClientDualsSecAgg`: replies SecAgg+ sums exactly.

Under Flower's ``secaggplus_mod`` the server learns only the sum of the replies'
arrays, so everything the strategy needs as a sum goes into them, on SecAgg+'s grid
(`flwr_admm.core.secure_sum`), and only protocol metadata stays in the clear metrics:

    arrays   x_i = grid(Delta_i + e_i)            the contribution change (P tensors),
                                                   error feedback: e_i' = Delta_i + e_i - s x_i
             [b_i]                                 while a rebuild sweep is on
                                                   (``admm-secagg-sweep`` = 1): grid(sigma_i')
                                                   if asked to rebuild, else x_i again
             limbs of (n_i ||w_i'||^2, n_i ||u_i||^2, n_i d2_i, n_i f_i(w_i'), [loss unusable])
    metrics  previous round, change of n_i, n_i (``admm-num-examples``), resync flag, key
    num_examples = SecAgg+'s max_weight: every client weighs exactly 1 in its sum.

A rebuilt share is quantized too: S_new receives s b_i = sigma_i' - err_i, i.e. the
client's share with residual e_i' + err_i, which is what it keeps from then on (S, which
S_new replaces when the sweep ends, is off by err_i for this client until then).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, replace

import numpy as np
from flwr.common import Scalar

from flwr_admm.core.client_duals import DualStart, DualState
from flwr_admm.core.secure_sum import SecureGrid, encode_stats
from flwr_admm.core.types import Arrays
from flwr_admm.protocol import (
    EXAMPLES_CHANGE,
    PREVIOUS_ROUND,
    RESYNC,
    SECAGG_CLIP,
    SECAGG_EXAMPLES,
    SECAGG_LEVELS,
    SECAGG_SCALE,
    SECAGG_SWEEP,
    SECAGG_WEIGHT,
)

__all__ = ["NUM_STATS", "SecureReply", "SecureRound", "secure_reply"]

NUM_STATS = 5  # n ||w||^2, n ||u||^2, n d2, n loss, loss unusable (0/1)


@dataclass(frozen=True)
class SecureRound:
    """What the fit config says about SecAgg+: the grid, the weight, the sweep flag."""

    grid: SecureGrid
    weight: int
    sweep: bool

    @classmethod
    def from_config(cls, config: Mapping[str, Scalar]) -> SecureRound | None:
        """Return the settings if the config holds ``admm-secagg-scale``, else None."""
        if SECAGG_SCALE not in config:
            return None
        for name in (SECAGG_CLIP, SECAGG_LEVELS, SECAGG_WEIGHT):
            if name not in config:
                raise ValueError(f"{name}: required next to {SECAGG_SCALE}")
        weight, sweep = config[SECAGG_WEIGHT], config.get(SECAGG_SWEEP, 0)
        if isinstance(weight, bool) or not isinstance(weight, int) or weight < 1:
            raise ValueError(f"{SECAGG_WEIGHT}: must be an integer >= 1, got {weight!r}")
        if isinstance(sweep, bool) or sweep not in (0, 1):
            raise ValueError(f"{SECAGG_SWEEP}: must be 0 or 1, got {sweep!r}")
        grid = SecureGrid(
            clipping_range=config[SECAGG_CLIP],  # type: ignore[arg-type]
            quantization_range=config[SECAGG_LEVELS],  # type: ignore[arg-type]
            scale=config[SECAGG_SCALE],  # type: ignore[arg-type]
        )
        return cls(grid, weight, sweep == 1)


@dataclass(frozen=True)
class SecureReply:
    """The reply's arrays, num_examples and metrics, and the residual e_i' to keep."""

    arrays: Arrays
    num_examples: int
    metrics: dict[str, Scalar]
    residual: Arrays


def secure_reply(
    settings: SecureRound,
    state: DualState | None,
    start: DualStart,
    pending: DualState,
    change: Arrays,
    *,
    rebuild: bool,
    resync: bool,
    loss: float,
) -> SecureReply:
    """Build the SecAgg+ reply of one round (see the module docstring).

    `pending` is the state the node keeps (w_i', u_i, n_i', b_i'), `change` its Delta_i.
    """
    grid, w, num_examples = settings.grid, pending.w, pending.num_examples
    sent, kept = grid.quantize(change, None if state is None else state.residual)
    arrays = list(sent)
    if settings.sweep and rebuild:
        share = replace(pending, residual=kept).share  # sigma_i' = omega_i' c_i' - e_i'
        block, error = grid.quantize(share, None)
        kept = [e + r for e, r in zip(kept, error, strict=True)]
        arrays += block
    elif settings.sweep:
        arrays += [t.copy() for t in sent]
    n = float(num_examples)
    usable = math.isfinite(loss) and loss >= 0
    stats = [
        n * float(sum(np.vdot(t, t) for t in w)),
        n * float(sum(np.vdot(u, u) for u in start.dual)),
        n * (start.delayed_sq_residual or 0.0),
        n * loss if usable else 0.0,
        0.0 if usable else 1.0,
    ]
    arrays.append(encode_stats(grid, stats))
    metrics: dict[str, Scalar] = {
        PREVIOUS_ROUND: 0 if state is None else int(state.server_round),
        EXAMPLES_CHANGE: int(num_examples) - (0 if state is None else int(state.num_examples)),
        SECAGG_EXAMPLES: int(num_examples),
        RESYNC: int(resync),
    }
    return SecureReply(arrays, settings.weight, metrics, kept)
