"""Running sums over every cached client, so that a z-step costs a few passes over the model.

    S_w = sum_i n_i s_i w_i,   S_y = sum_i n_i y_i,   S_s = sum_i n_i s_i,   N = sum_i n_i

Replies are folded in as they arrive (`absorb_one`); one with NaN/inf entries (or a
squared norm that overflows) is refused and the state left as if it never arrived.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from typing import Literal

import numpy as np

from flwr_admm.core.kernels import axpy, finite_sq_norm, fold_in
from flwr_admm.core.types import (
    NON_FINITE,
    Arrays,
    ClientRecord,
    NonFiniteReplyError,
    Reply,
    natural_key,
)

RoundMode = Literal["full", "incremental", "recompute"]


@dataclass
class OpenRound:
    """Bookkeeping between `begin` and `finish`."""

    mode: RoundMode
    shares: Arrays | None = None  # R = sum n_i w_i over the replies (relaxed, incremental)
    absorbed: list[Reply] = field(default_factory=list)
    keys: set[str] = field(default_factory=set)


@dataclass(eq=False)
class RunningSums:
    """S_w, S_y, S_s and N over every cached client, and their upkeep."""

    nsw: Arrays  # S_w = sum n_i s_i w_i
    ny: Arrays  # S_y = sum n_i y_i
    ns: float = 0.0  # S_s = sum n_i s_i
    n: int = 0  # N = sum n_i
    moving: set[str] = field(default_factory=set)  # keys whose y_i may be nonzero

    @classmethod
    def zeros_like(cls, z: Arrays) -> RunningSums:
        """Return empty sums shaped like the model z."""
        return cls([np.zeros_like(t) for t in z], [np.zeros_like(t) for t in z])

    def rho_bar(self, rho: float) -> float:
        """Return rho_bar = sum_i p_i rho_i = rho S_s / N."""
        return rho * self.ns / self.n

    def clear_models(self) -> None:
        """Set S_w, S_s and N to zero (S_y is kept)."""
        for acc in self.nsw:
            acc.fill(0.0)
        self.ns, self.n = 0.0, 0

    def open_round(
        self,
        keys: Collection[str],
        records: dict[str, ClientRecord],
        z: Arrays,
        uniform: bool,
        relaxed: bool,
    ) -> OpenRound:
        """Return a round whose replies come from (at most) `keys`; choose how S_w is kept.

        "full" (uniform rho, every cached client is expected): S_w is cleared here and
        rebuilt from the replies as they arrive, in absorb order, then from the clients
        that did not reply; "incremental" (uniform rho, partial participation):
        S_w += n_i w_i' - n_i w_i per reply (and R = sum n_i w_i' when relaxed);
        "recompute" (per-client rho, whose scales may all change): exactly, in sorted
        key order, at the end of the round.
        """
        mode: RoundMode
        if not uniform:
            mode = "recompute"
        elif set(records) <= set(keys):
            mode = "full"
            self.clear_models()
        else:
            mode = "incremental"
        shares = None
        if mode == "incremental" and relaxed:
            shares = [np.zeros_like(t) for t in z]
        return OpenRound(mode, shares)

    def fold(
        self,
        w: Arrays,
        n: int,
        old: ClientRecord | None,
        shares: Arrays | None,
    ) -> float | None:
        """Fold a reply in, S_w += n w - n_old w_old (R += n w); return ||w||^2 or None.

        `old` is the record the reply replaces (incremental rounds), None when S_w is
        being rebuilt. None flags NaN/inf: S_w (and R) are then spoilt, see `roll_back`.
        """
        n_old = old.num_examples if old is not None else 0
        total = 0.0
        for j, (acc, w_new) in enumerate(zip(self.nsw, w, strict=True)):
            w_old = None if old is None else old.w[j]
            share = None if shares is None else shares[j]
            total += fold_in(acc, float(n), w_new, float(n_old), w_old, share)
        if not math.isfinite(total):
            return None
        self.count(n, n_old)
        return total

    def count(self, n: int, n_old: int) -> None:
        """Follow a folded reply: S_s += n - n_old, N += n - n_old (s_i = 1 when folding)."""
        self.ns += n - n_old
        self.n += n - n_old

    def reweight_dual(self, y: Arrays, change: int) -> None:
        """Follow a change of n_i: S_y += (n_i' - n_i) y_i."""
        for acc, y_i in zip(self.ny, y, strict=True):
            axpy(float(change), y_i, acc)

    def roll_back(self, rnd: OpenRound, records: dict[str, ClientRecord]) -> None:
        """Undo a half-folded reply: S_w as the absorbed replies (or all records) left it.

        "full": re-sum the replies absorbed so far, in the same order, bit for bit the
        S_w before the bad reply;
        "incremental": the exact sum over the records.
        """
        if rnd.mode == "incremental":
            self.recompute(records, duals=False)
            if rnd.shares is not None:
                for share in rnd.shares:
                    share.fill(0.0)
                for done in rnd.absorbed:
                    for share, w in zip(rnd.shares, records[done.key].w, strict=True):
                        axpy(float(done.num_examples), w, share)
            return
        for acc in self.nsw:
            acc.fill(0.0)
        for done in rnd.absorbed:
            n = float(done.num_examples)
            for acc, w in zip(self.nsw, records[done.key].w, strict=True):
                axpy(n, w, acc)

    def complete(self, rnd: OpenRound, records: dict[str, ClientRecord]) -> None:
        """Bring S_w, S_s and N up to date with every cached client before the z-step."""
        if rnd.mode == "recompute":
            self.recompute(records, duals=False)
        elif rnd.mode == "full":
            for key in sorted(set(records) - rnd.keys, key=natural_key):
                record = records[key]
                for acc, w in zip(self.nsw, record.w, strict=True):
                    axpy(float(record.num_examples), w, acc)
                self.ns += record.num_examples
                self.n += record.num_examples

    def recompute(self, records: dict[str, ClientRecord], duals: bool = True) -> None:
        """Sum S_w, S_s, N (and S_y) exactly, in sorted key order."""
        ordered = [records[k] for k in sorted(records, key=natural_key)]
        self.clear_models()
        for record in ordered:
            ns = record.num_examples * record.scale
            for acc, w in zip(self.nsw, record.w, strict=True):
                axpy(ns, w, acc)
            self.ns += ns
            self.n += record.num_examples
        if duals:
            self.moving = {k for k, r in records.items() if any(np.any(y) for y in r.y)}
            self.resum_duals(records)

    def resum_duals(self, records: dict[str, ClientRecord]) -> None:
        """Sum S_y = sum n_i y_i exactly, in key order, over the `moving` duals only.

        The others are 0 and would add nothing: the same bits as summing every client.
        """
        for acc in self.ny:
            acc.fill(0.0)
        for key in sorted(self.moving, key=natural_key):
            record = records[key]
            for acc, y in zip(self.ny, record.y, strict=True):
                axpy(float(record.num_examples), y, acc)

    def hold(self, records: dict[str, ClientRecord], keys: Collection[str]) -> list[str]:
        """Set y_i = 0 for the known `keys` and re-sum S_y; return those keys, in order.

        O(moving x model), not O(clients x model): with only stock FedProx handlers,
        whose duals are held at 0 every round, nothing moves and S_y is exactly 0.
        """
        held = sorted((k for k in set(keys) if k in records), key=natural_key)
        if held:
            for key in held:
                for y in records[key].y:
                    y.fill(0.0)
            self.moving.difference_update(held)
            self.resum_duals(records)
        return held

    def reply_part(
        self,
        rnd: OpenRound,
        ordered: Sequence[Reply],
        records: dict[str, ClientRecord],
        z: Arrays,
        relaxed: bool,
    ) -> tuple[Arrays, float]:
        """Return R = sum n_i s_i w_i over the replies (relaxed only) and W = sum n_i s_i.

        When every cached client replied, R is S_w itself; otherwise (and only with
        over-relaxation) the incremental round accumulated it, or it is summed here.
        """
        weight = float(sum(r.num_examples * records[r.key].scale for r in ordered))
        if len(ordered) == len(records):
            return self.nsw, weight
        if not relaxed:
            return [], weight
        if rnd.shares is not None:
            return rnd.shares, weight
        shares = [np.zeros_like(t) for t in z]
        for reply in ordered:
            record = records[reply.key]
            for share, w in zip(shares, record.w, strict=True):
                axpy(record.num_examples * record.scale, w, share)
        return shares, weight


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
