"""A round's replies folded into S_w together: blocks outer, replies inner (numba).

`ConsensusADMM.absorb` folds one reply at a time, S_w += n_i w_i - n_i w_i,old (and
R += n_i w_i), so at 1e6 parameters the 8 MB of S_w (and of R) stream from memory
once per reply. With the round's replies at hand (`ConsensusADMM.absorb_all`: the
legacy strategy, the Message API, `ConsensusADMM.step`) `fold_all` runs blocks outer,
replies inner: the blocks of S_w and R stay in cache while each reply's block passes,
so per reply only w_i and w_i,old are read from memory.

Each element of S_w and R sees the same operations in the same reply order, and each
reply's ||w_i||^2 the same partial sums (`flwr_admm.core.fused.fold`'s lanes, kept per
reply across the blocks), as one `RunningSums.fold` after the other: the result is
the same bit for bit.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np

from flwr_admm.core.backend import FUSED_BLOCK, compiled, fusable
from flwr_admm.core.fused import LANES
from flwr_admm.core.kernels import blocks
from flwr_admm.core.sums import OpenRound, RunningSums
from flwr_admm.core.types import Arrays, ClientRecord, Reply

__all__ = ["Pending", "batchable", "fold_all"]

assert FUSED_BLOCK % LANES == 0  # every block starts on lane 0: the norms keep their bits


class Pending(NamedTuple):
    """A reply waiting to be folded: w_i (float64), n_i and the record it replaces."""

    w: Arrays
    n: int
    old: ClientRecord | None  # incremental rounds: S_w -= n_i,old w_i,old; else None

    @property
    def n_old(self) -> int:
        """Return n_i,old (0 when nothing is taken out of S_w)."""
        return 0 if self.old is None else self.old.num_examples


def batchable(
    sums: RunningSums, rnd: OpenRound, replies: Sequence[Reply], records: dict[str, ClientRecord]
) -> bool:
    """Return whether `fold_all` can take `replies` without model-sized conversion copies.

    Every array (S_w, R, each w_i and the w_i it replaces) float64 and C-contiguous
    (numpy scalars, e.g. a 0-d tensor's arithmetic, are fine), in a folding round.
    """
    if rnd.mode == "recompute" or not replies:
        return False
    arrays: list[Any] = [*sums.nsw, *(rnd.shares or [])]
    for reply in replies:
        old = records.get(reply.key) if rnd.mode == "incremental" else None
        arrays += [t for t in reply.w if not isinstance(t, np.generic)]
        arrays += old.w if old is not None else []
    return all(isinstance(a, np.ndarray) for a in arrays) and fusable(*arrays)


def fold_all(sums: RunningSums, pending: Sequence[Pending], shares: Arrays | None) -> list[float]:
    """S_w += sum_i (n_i w_i - n_i,old w_i,old), R += n_i w_i; return each ||w_i||^2.

    In the order of `pending`, element by element. A non-finite norm flags NaN/inf
    (or an overflowing square) in that reply: S_w and R are then spoilt and must be
    rebuilt (`RunningSums.roll_back`); S_s and N are left to the caller.
    """
    fold = compiled().fold
    totals = [0.0] * len(pending)
    weights = [(float(item.n), float(item.n_old)) for item in pending]  # n_i, n_i,old
    for j, acc in enumerate(sums.nsw):
        acc_flat = acc.reshape(-1)
        share_flat = None if shares is None else shares[j].reshape(-1)
        ws = [item.w[j].reshape(-1) for item in pending]
        olds = [None if item.old is None else item.old.w[j].reshape(-1) for item in pending]
        lanes = np.zeros((len(pending), LANES))  # each reply's partial sums of squares
        norms = [0.0] * len(pending)
        for block in blocks(acc_flat.size, FUSED_BLOCK):  # a multiple of LANES values
            acc_block = acc_flat[block]
            share_block = None if share_flat is None else share_flat[block]
            for k, (n, n_old) in enumerate(weights):
                old = olds[k]
                norms[k] = fold(
                    acc_block,
                    n,
                    ws[k][block],
                    n_old,
                    None if old is None else old[block],
                    share_block,
                    lanes[k],
                )
        for k, norm in enumerate(norms):  # sum over the tensors, in order, as `fold` does
            totals[k] += norm
    return totals
