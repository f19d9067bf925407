"""The z-step, dual step and residuals of one consensus ADMM round (numpy, blocked).

With S_w = sum_i n_i s_i w_i and S_s = sum_i n_i s_i over every cached client,
S_y = sum_i n_i y_i, rho_bar = rho S_s / sum_i n_i, over-relaxation alpha and the
replies' part R, W of S_w, S_s:

    z'   = prox_{g/rho_bar}((S_w - (1 - alpha)(R - W z)) / S_s + S_y / (rho S_s))
    y_i += rho_i (alpha (w_i - z') + (1 - alpha)(z - z'))       (replying clients)

Residuals (Boyd et al. 2011, 3.3, p-weighted over the replies, p_i = n_i / sum n_j):
r = sqrt(sum p_i ||w_i - z'||^2), s = rho_bar ||z' - z||,
eps_pri = sqrt(n) eps_abs + eps_rel max(sqrt(sum p_i ||w_i||^2), ||z'||),
eps_dual = sqrt(n) eps_abs + eps_rel sqrt(sum p_i ||y_i||^2), n = number of parameters.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

import numpy as np
from numpy.typing import NDArray

from flwr_admm.core.kernels import BLOCK, axpy, blocks
from flwr_admm.core.regularizers import Regularizer
from flwr_admm.core.types import Arrays, ClientRecord, Reply, RoundReport


def _sq_norm(arrays: Iterable[NDArray[np.float64]]) -> float:
    return float(sum(np.vdot(a, a) for a in arrays))


class ConsensusSteps:
    """Z-step, dual step and round report of `ConsensusADMM` (mixed into it)."""

    z: Arrays
    rho: float
    regularizer: Regularizer | None
    eps_abs: float
    eps_rel: float
    relaxation: float
    records: dict[str, ClientRecord]
    _sum_nsw: Arrays
    _sum_ny: Arrays
    _sum_ns: float
    _sum_n: int

    if TYPE_CHECKING:

        @property
        def num_parameters(self) -> int:
            """Total number of scalars in the model."""

    def _z_step(self, shares: Arrays, weight: float, z_prev: Arrays) -> Arrays:
        """Z = prox_{g/rho_bar}((S_w - (1 - alpha)(R - W z)) / S_s + S_y / (rho S_s)).

        S_w = sum n_i s_i w_i over every cached client, S_s = sum n_i s_i; R and W are
        the replies' part of S_w and S_s (the relaxed term vanishes when alpha = 1).
        """
        rho, beta = self.rho, 1.0 - self.relaxation
        z = [acc / self._sum_ns for acc in self._sum_nsw]
        if rho != 0.0:
            for t, acc in zip(z, self._sum_ny, strict=True):
                axpy(1.0 / (rho * self._sum_ns), acc, t)
        if beta != 0.0:
            for t, share, center in zip(z, shares, z_prev, strict=True):
                axpy(-beta / self._sum_ns, share, t)
                axpy(beta * weight / self._sum_ns, center, t)
        if self.regularizer is not None:
            self.regularizer.prox_(z, rho * self._sum_ns / self._sum_n)
        return z

    def _dual_step(
        self, ordered: Sequence[Reply], shares: Arrays, weight: float, dz: Arrays
    ) -> tuple[float, float, float]:
        """y_i += rho_i (alpha (w_i - z') + (1 - alpha) dz) for the replies; S_y with them.

        dz = z - z' (the round's center minus the new z). When every cached client
        replied, S_w holds exactly their sum R, so S_y += rho (alpha (R - W z') +
        (1 - alpha) W dz) costs a few passes a round; otherwise each reply adds
        n_i rho_i alpha (w_i - z') while its block is in cache, and the dz part is added
        once. Returns the p-weighted sums of ||w_i - z'||^2, ||w_i||^2 and ||y_i||^2 over
        the replies (p_i = n_i / sum of their n). Works block by block so that w_i, y_i
        and z' are read from memory once per reply.
        """
        alpha, beta, rho = self.relaxation, 1.0 - self.relaxation, self.rho
        total = float(sum(r.num_examples for r in ordered))
        everyone = len(ordered) == len(self.records)
        largest = max(t.size for t in self.z)
        scratch = np.empty(min(BLOCK, largest))
        r_sq = w_sq = y_sq = 0.0
        for reply in ordered:
            record = self.records[reply.key]
            rho_i = rho * record.scale
            p = record.num_examples / total
            to_sum = 0.0 if everyone else record.num_examples * rho_i * alpha
            w_sq += p * (reply.sq_norm if reply.sq_norm is not None else _sq_norm(record.w))
            arrays = zip(record.y, record.w, self.z, self._sum_ny, dz, strict=True)
            for y, w, z, acc, shift in arrays:
                y_flat, w_flat, z_flat = y.reshape(-1), w.reshape(-1), z.reshape(-1)
                acc_flat, shift_flat = acc.reshape(-1), shift.reshape(-1)
                for block in blocks(w_flat.size):
                    d = scratch[: block.stop - block.start]
                    y_block = y_flat[block]
                    np.subtract(w_flat[block], z_flat[block], out=d)
                    r_sq += p * float(np.dot(d, d))
                    axpy(rho_i * alpha, d, y_block)
                    axpy(rho_i * beta, shift_flat[block], y_block)
                    y_sq += p * float(np.dot(y_block, y_block))
                    axpy(to_sum, d, acc_flat[block])
        if rho != 0.0:
            for acc, share, z, shift in zip(self._sum_ny, shares or dz, self.z, dz, strict=True):
                if everyone:  # share is S_w = R
                    axpy(rho * alpha, share, acc)  # one-pass adds, no temporary
                    axpy(-rho * alpha * weight, z, acc)
                axpy(rho * beta * weight, shift, acc)
        return r_sq, w_sq, y_sq

    def _report(
        self,
        ordered: Sequence[Reply],
        dz: Arrays,
        rho: float,
        stats: tuple[float, float, float],
    ) -> RoundReport:
        total = float(sum(r.num_examples for r in ordered))
        r_sq, w_sq, y_sq = stats
        rho_bar = rho * self._sum_ns / self._sum_n
        dual = rho_bar * math.sqrt(_sq_norm(dz))
        root_n = math.sqrt(self.num_parameters)
        primal_scale = max(math.sqrt(w_sq), math.sqrt(_sq_norm(self.z)))
        dual_scale = math.sqrt(y_sq)
        losses = [(r.num_examples, r.loss) for r in ordered]
        objective = None
        if all(loss is not None and math.isfinite(loss) for _, loss in losses):
            objective = sum(n * float(loss) for n, loss in losses if loss is not None) / total
            if self.regularizer is not None:
                objective += self.regularizer.value(self.z)
        return RoundReport(
            rho=rho,
            next_rho=rho,
            primal_residual=math.sqrt(r_sq),
            dual_residual=dual,
            eps_primal=root_n * self.eps_abs + self.eps_rel * primal_scale,
            eps_dual=root_n * self.eps_abs + self.eps_rel * dual_scale,
            objective=objective,
            num_replies=len(ordered),
            num_clients_cached=len(self.records),
            primal_scale=primal_scale,
            dual_scale=dual_scale,
        )
