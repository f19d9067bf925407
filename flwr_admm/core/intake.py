"""Replies into the server's state: w_i, n_i stored and folded into S_w, one or all at once.

`absorb_one` folds a reply as it arrives; `absorb_many` takes the round's replies in
order, one after the other. A reply with NaN/inf entries (or a squared norm that
overflows) is refused and the state is left as if it had never arrived.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from flwr_admm.core.kernels import finite_sq_norm
from flwr_admm.core.sums import OpenRound, RunningSums
from flwr_admm.core.types import NON_FINITE, Arrays, ClientRecord, NonFiniteReplyError, Reply

__all__ = ["absorb_many", "absorb_one"]

Records = dict[str, ClientRecord]


def absorb_one(sums: RunningSums, records: Records, rnd: OpenRound, reply: Reply) -> None:
    """Fold one checked reply into S_w and store it; `NonFiniteReplyError` if not finite."""
    # asarray(order="C"), not ascontiguousarray: that one turns 0-d tensors into (1,)
    w = [np.asarray(t, dtype=np.float64, order="C") for t in reply.w]
    n = int(reply.num_examples)
    if rnd.mode == "recompute":
        sq_norm = finite_sq_norm(w) if reply.sq_norm is None else reply.sq_norm
    else:
        replaced = records.get(reply.key) if rnd.mode == "incremental" else None
        sq_norm = sums.fold(w, n, replaced, rnd.shares)  # S_w += n_i' w_i' (- n_i w_i)
        if sq_norm is None:
            sums.roll_back(rnd, records)
    if sq_norm is None or not math.isfinite(sq_norm):
        raise NonFiniteReplyError(f"reply {reply.key!r}: {NON_FINITE}")
    store(sums, records, rnd, reply, w, sq_norm)


def absorb_many(
    sums: RunningSums, records: Records, rnd: OpenRound, replies: Sequence[Reply]
) -> list[str]:
    """Absorb checked replies in order, as `absorb_one` each; return the refused keys."""
    refused = []
    for reply in replies:
        try:
            absorb_one(sums, records, rnd, reply)
        except NonFiniteReplyError:
            refused.append(reply.key)
    return refused


def store(
    sums: RunningSums, records: Records, rnd: OpenRound, reply: Reply, w: Arrays, sq_norm: float
) -> None:
    """Keep a folded reply's w_i, n_i (S_y += dn_i y_i) and s_i, and note it in the round.

    The arrays are kept, not copied (read-only views into a reply's bytes are fine:
    the state never writes into w_i).
    """
    n = int(reply.num_examples)
    record = records.get(reply.key)
    if record is None:
        records[reply.key] = record = ClientRecord(w, [np.zeros_like(t) for t in w], n)
    else:
        if n != record.num_examples:
            sums.reweight_dual(record.y, n - record.num_examples)  # S_y += dn_i y_i
        record.w, record.num_examples = w, n
    if reply.scale is not None:  # client_rho="reported": rho_i = rho s_i from this reply
        record.scale = reply.scale
    rnd.absorbed.append(Reply(reply.key, [], n, reply.loss, sq_norm))
    rnd.keys.add(reply.key)
