"""Framework-free server state of inexact consensus ADMM over lists of numpy arrays.

Problem: min_z sum_i p_i f_i(z) + g(z), split as w_i = z, p_i = n_i / sum_j n_j.
The server stores, per client key i, the last local model w_i, its unscaled dual
y_i = rho_i u_i and its weight n_i. With rho_i = rho * s_i (s_i = 1 unless per-client
rho is on) one round is

    v_i   = z - y_i / rho_i                                    (prox center sent out)
    z'    = prox_{g / rho_bar}( sum_i p_i (rho_i w_i + y_i) / rho_bar ),
            rho_bar = sum_i p_i rho_i, over every client seen so far (stale w_i, y_i
            of clients not sampled this round keep counting)
    y_i  += rho_i (w_i - z')                                   (clients that replied)

With uniform rho this is z' = prox_{g/rho}(sum_i p_i (w_i + u_i)), u_i += w_i - z'.

Over-relaxation (Boyd et al. 2011, 3.4.3) with alpha in (0, 2): the replying clients
enter the z-step and the dual step as w^_i = alpha w_i + (1 - alpha) z (z the center
of the round), so y_i += rho_i (alpha (w_i - z') + (1 - alpha) (z - z')). alpha = 1 is
plain ADMM; 1.5-1.8 often converges faster. Clients that did not reply keep counting
with their stored w_i. The primal residual stays w_i - z'.
Keeping y instead of u makes rho = 0 exactly FedAvg (y stays 0) and makes a change of
rho rescale u_i = y_i / rho by rho_old / rho_new for free.

Residuals (Boyd et al. 2011, 3.3, in the p-weighted norm over the replying clients):
r = sqrt(sum p_i ||w_i - z'||^2), s = rho_bar ||z' - z||,
eps_pri = sqrt(n) eps_abs + eps_rel max(sqrt(sum p_i ||w_i||^2), ||z'||),
eps_dual = sqrt(n) eps_abs + eps_rel sqrt(sum p_i ||y_i||^2), n = number of parameters.
"""

from __future__ import annotations

import math
import re
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
from numpy.typing import NDArray

from flwr_admm.kernels import BLOCK, axpy, blocks, finite_sq_norm, fold_in, single_thread_blas
from flwr_admm.regularizers import Regularizer
from flwr_admm.schedules import Constant, RhoSchedule, RoundResiduals, ScheduleState

Arrays = list[NDArray[np.float64]]
ClientRho = Literal["uniform", "data_size"]
CLIENT_RHO_MODES = ("uniform", "data_size")
RoundMode = Literal["full", "incremental", "recompute"]


def natural_key(key: str) -> tuple[object, ...]:
    """Sort key that orders "partition-id:2" before "partition-id:10"."""
    return tuple(int(t) if t.isdigit() else t for t in re.split(r"(\d+)", key))


@dataclass
class ClientRecord:
    """What the server remembers of client i: w_i, y_i, n_i and its rho multiplier s_i."""

    w: Arrays
    y: Arrays
    num_examples: int
    scale: float = 1.0


@dataclass(frozen=True)
class Reply:
    """One accepted client reply: its key, local model w_i, n_i and local loss f_i(w_i)."""

    key: str
    w: Arrays
    num_examples: int
    loss: float | None = None
    sq_norm: float | None = None  # ||w||^2 if the caller already computed it


@dataclass
class _OpenRound:
    """Bookkeeping between `begin` and `finish`."""

    mode: RoundMode
    shares: Arrays | None = None  # R = sum n_i w_i over the replies (relaxed, incremental)
    absorbed: list[Reply] = field(default_factory=list)
    keys: set[str] = field(default_factory=set)


@dataclass(frozen=True)
class RoundReport:
    """Residuals and bookkeeping of one aggregation."""

    rho: float
    next_rho: float
    primal_residual: float
    dual_residual: float
    eps_primal: float
    eps_dual: float
    objective: float | None
    num_replies: int
    num_clients_cached: int
    primal_scale: float = 0.0  # max(sqrt(sum p_i ||w_i||^2), ||z||)
    dual_scale: float = 0.0  # sqrt(sum p_i ||y_i||^2) after the dual step

    @property
    def converged(self) -> bool:
        """Boyd's stopping rule: r <= eps_pri and s <= eps_dual."""
        return self.primal_residual <= self.eps_primal and self.dual_residual <= self.eps_dual


NON_FINITE = "contains NaN or inf (or entries whose squared norm overflows)"


class NonFiniteReplyError(ValueError):
    """A reply holds NaN/inf (or entries whose squared norm overflows float64)."""


def _sq_norm(arrays: Iterable[NDArray[np.float64]]) -> float:
    return float(sum(np.vdot(a, a) for a in arrays))


def _check_rho(rho: float, field_name: str = "rho") -> float:
    if not (isinstance(rho, int | float) and math.isfinite(rho) and rho >= 0):
        raise ValueError(f"{field_name}: must be a finite number >= 0, got {rho!r}")
    return float(rho)


@dataclass
class ConsensusADMM:
    """Server side of consensus ADMM; the Flower strategy is a thin adapter over it.

    Parameters
    ----------
    z : list of ndarray
        Initial consensus model z^0 (copied to float64).
    rho : float
        Penalty rho >= 0; rho = 0 is FedAvg (with stale contributions if partial).
    schedule : RhoSchedule, optional
        Rule for rho between rounds; `Constant()` by default.
    regularizer : Regularizer, optional
        Server regularizer g; requires rho > 0.
    client_rho : {"uniform", "data_size"}
        Per-client rho_i = rho * s_i with s_i = 1 or s_i = n_i / max_j n_j (seed 001).
    eps_abs, eps_rel : float
        Absolute and relative tolerances of the stopping thresholds.
    relaxation : float
        Over-relaxation alpha in (0, 2); 1 is plain ADMM.

    """

    z: Arrays
    rho: float
    schedule: RhoSchedule = field(default_factory=Constant)
    regularizer: Regularizer | None = None
    client_rho: ClientRho = "uniform"
    eps_abs: float = 1e-6
    eps_rel: float = 1e-4
    relaxation: float = 1.0
    records: dict[str, ClientRecord] = field(default_factory=dict)
    schedule_state: ScheduleState = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.rho = _check_rho(self.rho)
        if self.client_rho not in CLIENT_RHO_MODES:
            raise ValueError(
                f"client_rho: must be one of {list(CLIENT_RHO_MODES)}, got {self.client_rho!r}"
            )
        if self.rho == 0 and (self.regularizer is not None or self.client_rho != "uniform"):
            raise ValueError("rho: must be > 0 with a regularizer or client_rho='data_size', got 0")
        for name in ("eps_abs", "eps_rel"):
            value = getattr(self, name)
            if not (isinstance(value, int | float) and math.isfinite(value) and value >= 0):
                raise ValueError(f"{name}: must be a finite number >= 0, got {value!r}")
        alpha = self.relaxation
        if isinstance(alpha, bool) or not (isinstance(alpha, int | float) and 0 < alpha < 2):
            raise ValueError(f"relaxation: must be a number in (0, 2), got {alpha!r}")
        self.relaxation = float(alpha)
        self.z = [np.array(t, dtype=np.float64) for t in self.z]
        if not self.schedule_state:
            self.schedule_state = self.schedule.init()
        self._sum_nsw: Arrays = [np.zeros_like(t) for t in self.z]
        self._sum_ny: Arrays = [np.zeros_like(t) for t in self.z]
        self._sum_ns = 0.0
        self._sum_n = 0
        self._round: _OpenRound | None = None
        self._recompute_sums()

    # ----------------------------------------------------------------- queries
    @property
    def num_parameters(self) -> int:
        """Total number of scalars in the model."""
        return int(sum(t.size for t in self.z))

    def rho_for(self, key: str | None) -> float:
        """rho_i = rho * s_i (s_i = 1 for an unseen client)."""
        record = self.records.get(key) if key is not None else None
        return self.rho * (record.scale if record is not None else 1.0)

    def center(self, key: str | None) -> Arrays:
        """Prox center v_i = z - y_i / rho_i; z itself (not a copy) for an unseen client."""
        record = self.records.get(key) if key is not None else None
        rho_i = self.rho_for(key)
        if record is None or rho_i == 0.0:
            return self.z
        return [z - y / rho_i for z, y in zip(self.z, record.y, strict=True)]

    def check_shapes(self, arrays: Sequence[NDArray[np.generic]], field_name: str) -> None:
        """Raise ValueError unless `arrays` match z in count and shapes."""
        if len(arrays) != len(self.z):
            raise ValueError(f"{field_name}: expected {len(self.z)} arrays, got {len(arrays)}")
        for i, (a, z) in enumerate(zip(arrays, self.z, strict=True)):
            if np.shape(a) != z.shape:
                raise ValueError(f"{field_name}[{i}]: expected shape {z.shape}, got {np.shape(a)}")

    def adopt_consensus(self, z: Sequence[NDArray[np.generic]]) -> None:
        """Take the broadcast z (e.g. after a DP wrapper added noise) as the current z."""
        self.check_shapes(z, "parameters")
        self.z = [np.array(t, dtype=np.float64) for t in z]

    # ------------------------------------------------------------- persistence
    def state_dict(self) -> tuple[dict[str, NDArray[np.float64]], dict[str, Any]]:
        """Arrays and JSON metadata that restore this state bit for bit."""
        keys = sorted(self.records, key=natural_key)
        arrays: dict[str, NDArray[np.float64]] = {}
        for j in range(len(self.z)):
            arrays[f"z.{j}"] = self.z[j]
            arrays[f"sum_nsw.{j}"] = self._sum_nsw[j]
            arrays[f"sum_ny.{j}"] = self._sum_ny[j]
            for i, key in enumerate(keys):
                arrays[f"w.{i}.{j}"] = self.records[key].w[j]
                arrays[f"y.{i}.{j}"] = self.records[key].y[j]
        meta = {
            "rho": self.rho,
            "schedule_state": self.schedule_state,
            "clients": [
                {
                    "key": k,
                    "num_examples": self.records[k].num_examples,
                    "scale": self.records[k].scale,
                }
                for k in keys
            ],
            "sum_ns": self._sum_ns,
            "sum_n": self._sum_n,
            "shapes": [list(t.shape) for t in self.z],
        }
        return arrays, meta

    def load_state_dict(self, arrays: dict[str, NDArray[np.float64]], meta: dict[str, Any]) -> None:
        """Restore what `state_dict` wrote; the model shapes must match."""
        shapes = [tuple(s) for s in meta["shapes"]]
        if shapes != [t.shape for t in self.z]:
            raise ValueError(
                f"checkpoint: model shapes {shapes} differ from the current model's "
                f"{[t.shape for t in self.z]}"
            )
        count = len(self.z)

        def take(prefix: str) -> Arrays:
            return [np.array(arrays[f"{prefix}.{j}"], dtype=np.float64) for j in range(count)]

        self.z, self._sum_nsw, self._sum_ny = take("z"), take("sum_nsw"), take("sum_ny")
        self.records = {
            c["key"]: ClientRecord(
                take(f"w.{i}"), take(f"y.{i}"), int(c["num_examples"]), float(c["scale"])
            )
            for i, c in enumerate(meta["clients"])
        }
        self.rho = _check_rho(float(meta["rho"]), "checkpoint rho")
        self.schedule_state = meta["schedule_state"]
        self._sum_ns, self._sum_n = float(meta["sum_ns"]), int(meta["sum_n"])

    # ------------------------------------------------------------------ update
    def step(self, replies: Sequence[Reply], server_round: int) -> RoundReport:
        """Run the z-step and the dual step on the accepted replies of one round.

        Equivalent to `begin` + `absorb` of each reply in key order + `finish`.
        """
        if not replies:
            raise ValueError("replies: need at least one reply to aggregate")
        if len({r.key for r in replies}) != len(replies):
            raise ValueError("replies: client keys must be unique within a round")
        for reply in replies:  # refuse the round before touching any state
            self.check_shapes(reply.w, f"reply {reply.key!r}")
            if reply.num_examples <= 0:
                raise ValueError(f"reply {reply.key!r}: num_examples must be > 0")
        self.begin([r.key for r in replies])
        with single_thread_blas():
            for reply in sorted(replies, key=lambda r: natural_key(r.key)):
                self.absorb(reply)
        return self.finish(server_round)

    def begin(self, keys: Collection[str]) -> None:
        """Open a round whose replies will come from (at most) `keys`.

        Replies are then folded in one at a time with `absorb`, so a server never holds
        more than one reply besides its state. How S_w = sum n_i s_i w_i is kept:
        "full" (every cached client is expected): rebuilt from the replies as they
        arrive, in absorb order, then the clients that did not reply; "incremental"
        (uniform rho, partial participation): S_w += n_i w_i' - n_i w_i per reply;
        "recompute" (per-client rho, whose scales may all change): exactly in sorted
        key order at `finish`.
        """
        mode: RoundMode
        if self.client_rho != "uniform":
            mode = "recompute"
        elif set(self.records) <= set(keys):
            mode = "full"
            for acc in self._sum_nsw:
                acc.fill(0.0)
            self._sum_ns, self._sum_n = 0.0, 0
        else:
            mode = "incremental"
        shares = None
        if mode == "incremental" and self.relaxation != 1.0:
            shares = [np.zeros_like(t) for t in self.z]
        self._round = _OpenRound(mode, shares)

    def absorb(self, reply: Reply) -> None:
        """Store w_i, n_i of one replying client and fold it into S_w.

        The arrays are kept, not copied (read-only views into a reply's bytes are
        fine: the state never writes into w_i). S_y = sum n_i y_i is corrected when
        n_i changes. The order of the absorb calls fixes the order of summation.
        Unless the reply brings ||w_i||^2, it is computed in the same pass that folds
        w_i into S_w; NaN/inf entries (or a squared norm that overflows) raise
        `NonFiniteReplyError` and leave the state as it was.
        """
        rnd = self._round
        if rnd is None:
            raise ValueError("absorb: call begin() first")
        self.check_shapes(reply.w, f"reply {reply.key!r}")
        if reply.num_examples <= 0:
            raise ValueError(f"reply {reply.key!r}: num_examples must be > 0")
        if reply.key in rnd.keys:
            raise ValueError("replies: client keys must be unique within a round")
        w = [np.ascontiguousarray(t, dtype=np.float64) for t in reply.w]
        n = int(reply.num_examples)
        record = self.records.get(reply.key)
        n_old = record.num_examples if record is not None else 0
        if rnd.mode == "recompute":
            sq_norm = reply.sq_norm if reply.sq_norm is not None else finite_sq_norm(w)
        else:
            old = record.w if rnd.mode == "incremental" and record is not None else None
            sq_norm = self._fold_in(w, float(n), old, float(n_old), rnd.shares)
            if sq_norm is None:
                self._roll_back(rnd)
                raise NonFiniteReplyError(f"reply {reply.key!r}: {NON_FINITE}")
            self._sum_ns += n - (n_old if old is not None else 0)
            self._sum_n += n - (n_old if old is not None else 0)
        if sq_norm is None or not math.isfinite(sq_norm):
            raise NonFiniteReplyError(f"reply {reply.key!r}: {NON_FINITE}")
        if record is not None and n != n_old:
            for acc, y in zip(self._sum_ny, record.y, strict=True):
                axpy(float(n - n_old), y, acc)
        if record is None:
            self.records[reply.key] = ClientRecord(w, [np.zeros_like(t) for t in w], n)
        else:
            record.w, record.num_examples = w, n
        rnd.absorbed.append(Reply(reply.key, [], n, reply.loss, sq_norm))
        rnd.keys.add(reply.key)

    def _fold_in(
        self, w: Arrays, n: float, w_old: Arrays | None, n_old: float, shares: Arrays | None
    ) -> float | None:
        """S_w += n w - n_old w_old (and R += n w) in one blocked pass; ||w||^2 or None."""
        total = 0.0
        for j, (acc, w_new) in enumerate(zip(self._sum_nsw, w, strict=True)):
            old = None if w_old is None else w_old[j]
            total += fold_in(acc, n, w_new, n_old, old, None if shares is None else shares[j])
        return total if math.isfinite(total) else None

    def _roll_back(self, rnd: _OpenRound) -> None:
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

    def cancel(self) -> None:
        """Close a round in which nothing was absorbed (the state is unchanged)."""
        if self._round is not None and self._round.absorbed:
            raise ValueError("cancel: replies were absorbed; call finish()")
        if self._round is not None and self._round.mode == "full":
            self._recompute_sums(duals=False)
        self._round = None

    def finish(self, server_round: int) -> RoundReport:
        """Close the round: z-step, dual step, residuals, next rho."""
        rnd, self._round = self._round, None
        if rnd is None or not rnd.absorbed:
            raise ValueError("replies: need at least one reply to aggregate")
        ordered = sorted(rnd.absorbed, key=lambda r: natural_key(r.key))
        rho, z_prev = self.rho, self.z
        with single_thread_blas():
            self._complete_sums(rnd)
            shares, weight = self._round_shares(rnd, ordered)
            self.z = self._z_step(shares, weight, z_prev)
            dz = [a - b for a, b in zip(z_prev, self.z, strict=True)]
            stats = self._dual_step(ordered, shares, weight, dz)
        report = self._report(ordered, dz, rho, stats)
        next_rho, self.schedule_state = self.schedule.update(
            rho,
            self.schedule_state,
            RoundResiduals(
                server_round=server_round,
                primal_residual=report.primal_residual,
                dual_residual=report.dual_residual,
                objective=report.objective,
                primal_scale=report.primal_scale,
                dual_scale=report.dual_scale,
            ),
        )
        self.rho = _check_rho(next_rho, "rho_schedule output")
        return RoundReport(**{**report.__dict__, "next_rho": self.rho})

    def _complete_sums(self, rnd: _OpenRound) -> None:
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

    def _round_shares(self, rnd: _OpenRound, ordered: Sequence[Reply]) -> tuple[Arrays, float]:
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
