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

Keeping y instead of u makes rho = 0 exactly FedAvg (y stays 0) and makes a change of
rho rescale u_i = y_i / rho by rho_old / rho_new for free.

Over-relaxation (Boyd et al. 2011, 3.4.3) with alpha in (0, 2): the replying clients
enter the z-step and the dual step as w^_i = alpha w_i + (1 - alpha) z (z the center
of the round), so y_i += rho_i (alpha (w_i - z') + (1 - alpha) (z - z')). alpha = 1 is
plain ADMM; 1.5-1.8 often converges faster. Clients that did not reply keep counting
with their stored w_i. The primal residual stays w_i - z'.

Residuals (Boyd et al. 2011, 3.3, in the p-weighted norm over the replying clients):
r = sqrt(sum p_i ||w_i - z'||^2), s = rho_bar ||z' - z||,
eps_pri = sqrt(n) eps_abs + eps_rel max(sqrt(sum p_i ||w_i||^2), ||z'||),
eps_dual = sqrt(n) eps_abs + eps_rel sqrt(sum p_i ||y_i||^2), n = number of parameters.

`ConsensusADMM` (this module) holds the state and runs the round (begin, absorb,
finish); its parts live in `flwr_admm.core.types` (value types and errors),
`flwr_admm.core.sums` (running sums), `flwr_admm.core.steps` (z-step, dual
step, residuals) and `flwr_admm.core.persistence` (state_dict / load_state_dict).
"""

from __future__ import annotations

import math
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field

import numpy as np
from numpy.typing import NDArray

from flwr_admm.core.kernels import axpy, finite_sq_norm, single_thread_blas
from flwr_admm.core.persistence import ConsensusPersistence
from flwr_admm.core.regularizers import Regularizer
from flwr_admm.core.schedules import Constant, RhoSchedule, RoundResiduals, ScheduleState
from flwr_admm.core.steps import ConsensusSteps
from flwr_admm.core.sums import ConsensusSums, OpenRound, RoundMode
from flwr_admm.core.types import (
    CLIENT_RHO_MODES,
    NON_FINITE,
    Arrays,
    ClientRecord,
    ClientRho,
    NonFiniteReplyError,
    Reply,
    RoundReport,
    check_rho,
    natural_key,
)

__all__ = [
    "CLIENT_RHO_MODES",
    "NON_FINITE",
    "Arrays",
    "ClientRecord",
    "ClientRho",
    "ConsensusADMM",
    "NonFiniteReplyError",
    "Reply",
    "RoundMode",
    "RoundReport",
    "natural_key",
]


@dataclass
class ConsensusADMM(ConsensusSums, ConsensusSteps, ConsensusPersistence):
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
        self.rho = check_rho(self.rho)
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
        self._round: OpenRound | None = None
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
        self._round = OpenRound(mode, shares)

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
        self.rho = check_rho(next_rho, "rho_schedule output")
        return RoundReport(**{**report.__dict__, "next_rho": self.rho})
