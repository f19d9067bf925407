"""Running sums of the consensus ADMM core and their upkeep during a round.

The server keeps S_w = sum_i n_i s_i w_i, S_s = sum_i n_i s_i, N = sum_i n_i and
S_y = sum_i n_i y_i over every cached client, so that the z-step costs a few passes
over the model whatever the number of clients. An `OpenRound` records how S_w is
kept between `begin` and `finish`: "full" (rebuilt from the replies, then the clients
that did not reply), "incremental" (S_w += n_i w_i' - n_i w_i per reply) or
"recompute" (exactly, in sorted key order, when per-client rho rescales s_i).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

import numpy as np

from flwr_admm.core.kernels import axpy, fold_in
from flwr_admm.core.types import Arrays, ClientRecord, ClientRho, Reply, natural_key

RoundMode = Literal["full", "incremental", "recompute"]


@dataclass
class OpenRound:
    """Bookkeeping between `begin` and `finish`."""

    mode: RoundMode
    shares: Arrays | None = None  # R = sum n_i w_i over the replies (relaxed, incremental)
    absorbed: list[Reply] = field(default_factory=list)
    keys: set[str] = field(default_factory=set)


class ConsensusSums:
    """Upkeep of S_w, S_s, N and S_y for `ConsensusADMM` (mixed into it)."""

    z: Arrays
    client_rho: ClientRho
    relaxation: float
    records: dict[str, ClientRecord]
    _sum_nsw: Arrays
    _sum_ny: Arrays
    _sum_ns: float
    _sum_n: int

    def _fold_in(
        self, w: Arrays, n: float, w_old: Arrays | None, n_old: float, shares: Arrays | None
    ) -> float | None:
        """S_w += n w - n_old w_old (and R += n w) in one blocked pass; ||w||^2 or None."""
        total = 0.0
        for j, (acc, w_new) in enumerate(zip(self._sum_nsw, w, strict=True)):
            old = None if w_old is None else w_old[j]
            total += fold_in(acc, n, w_new, n_old, old, None if shares is None else shares[j])
        return total if math.isfinite(total) else None

    def _roll_back(self, rnd: OpenRound) -> None:
        """Undo a half-folded reply: S_w as the absorbed replies (or all records) left it.

        "full": re-sum the replies absorbed so far, in the same order (bit for bit the
        S_w before the bad reply); "incremental": the exact sum over the records.
        """
        if rnd.mode == "incremental":
            self._recompute_sums(duals=False)
            if rnd.shares is not None:
                for share in rnd.shares:
                    share.fill(0.0)
                for done in rnd.absorbed:
                    for share, w in zip(rnd.shares, self.records[done.key].w, strict=True):
                        axpy(float(done.num_examples), w, share)
            return
        for acc in self._sum_nsw:
            acc.fill(0.0)
        for done in rnd.absorbed:
            for acc, w in zip(self._sum_nsw, self.records[done.key].w, strict=True):
                axpy(float(done.num_examples), w, acc)

    def _complete_sums(self, rnd: OpenRound) -> None:
        """Bring S_w up to date with every cached client before the z-step."""
        if rnd.mode == "recompute":
            self._update_scales()
            self._recompute_sums(duals=False)
        elif rnd.mode == "full":
            for key in sorted(set(self.records) - rnd.keys, key=natural_key):
                record = self.records[key]
                for acc, w in zip(self._sum_nsw, record.w, strict=True):
                    axpy(float(record.num_examples), w, acc)
                self._sum_ns += record.num_examples
                self._sum_n += record.num_examples

    def _round_shares(self, rnd: OpenRound, ordered: Sequence[Reply]) -> tuple[Arrays, float]:
        """R = sum n_i s_i w_i over the replies and W = sum n_i s_i (R: relaxed only).

        When every cached client replied, R is S_w itself; otherwise (and only with
        over-relaxation) the incremental round accumulated it, or it is summed here.
        """
        weight = float(sum(r.num_examples * self.records[r.key].scale for r in ordered))
        if len(ordered) == len(self.records):
            return self._sum_nsw, weight
        if self.relaxation == 1.0:
            return [], weight
        if rnd.shares is not None:
            return rnd.shares, weight
        shares = [np.zeros_like(t) for t in self.z]
        for reply in ordered:
            record = self.records[reply.key]
            for share, w in zip(shares, record.w, strict=True):
                axpy(record.num_examples * record.scale, w, share)
        return shares, weight

    def _update_scales(self) -> None:
        """Set s_i = n_i / max_j n_j (data_size; S_w is then recomputed by the caller)."""
        if self.client_rho == "uniform":
            return
        max_n = max(r.num_examples for r in self.records.values())
        for record in self.records.values():
            record.scale = record.num_examples / max_n

    def _recompute_sums(self, duals: bool = True) -> None:
        """Exact sums S_w = sum n_i s_i w_i (and S_y = sum n_i y_i) in sorted key order."""
        ordered = [self.records[k] for k in sorted(self.records, key=natural_key)]
        for acc in self._sum_nsw:
            acc.fill(0.0)
        self._sum_ns, self._sum_n = 0.0, 0
        for record in ordered:
            ns = record.num_examples * record.scale
            for acc, w in zip(self._sum_nsw, record.w, strict=True):
                axpy(ns, w, acc)
            self._sum_ns += ns
            self._sum_n += record.num_examples
        if duals:
            for acc in self._sum_ny:
                acc.fill(0.0)
            for record in ordered:
                for acc, y in zip(self._sum_ny, record.y, strict=True):
                    axpy(float(record.num_examples), y, acc)
