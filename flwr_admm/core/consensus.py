"""Server state of inexact consensus ADMM over lists of numpy arrays (`ConsensusADMM`)."""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
from numpy.typing import NDArray

from flwr_admm.core.kernels import single_thread_blas
from flwr_admm.core.persistence import SavedState, StateArrays, dump_state, load_state
from flwr_admm.core.regularizers import Regularizer
from flwr_admm.core.schedules import (
    AdaptiveDualStep,
    Constant,
    DualStep,
    RhoSchedule,
    ScheduleState,
    check_dual_step_spec,
    first_gamma,
    saved_gamma,
)
from flwr_admm.core.start_momentum import StartMomentum, check_momentum, check_steady
from flwr_admm.core.steps import (
    DualStats,
    ZAverage,
    averaged_z_step,
    check_z_average,
    dual_step,
    round_report,
    sum_sq_norm,
)
from flwr_admm.core.sums import OpenRound, RoundMode, RunningSums, absorb_many, absorb_one
from flwr_admm.core.types import (
    CLIENT_RHO_MODES,
    NON_FINITE,
    Arrays,
    ClientRecord,
    ClientRho,
    NonFiniteReplyError,
    Reply,
    RoundReport,
    check_relaxation,
    check_rho,
    check_scale,
    check_tolerances,
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
class ConsensusADMM:
    """Server side of consensus ADMM; the strategies are adapters over it.

    Solves min_z sum_i p_i f_i(z) + g(z) split as w_i = z, p_i = n_i / sum_j n_j. Per
    client key i it stores the last w_i, the unscaled dual y_i = rho_i u_i and n_i, with
    rho_i = rho s_i (s_i = 1 unless ``client_rho="reported"``). The round, over-relaxed
    by alpha (Boyd et al. 2011, 3.4.3), with w^_i = alpha w_i + (1 - alpha) z:

        v_i   = z - y_i / rho_i                                  (prox center sent out)
        z'    = prox_{g / rho_bar}( sum_i p_i (rho_i w^_i + y_i) / rho_bar ),
                rho_bar = sum_i p_i rho_i
        y_i  += gamma rho_i (w^_i - z')                          (replying clients)

    The sums run over every client seen: the stale w_i, y_i of absent clients keep
    counting, unrelaxed. With uniform rho and alpha = gamma = 1 this is the round of
    `flwr_admm.serverapp.FedADMM`; `flwr_admm.core.steps` has the z-step in running
    sums and the residuals. Keeping y rather than u makes rho = 0 exactly FedAvg (y stays
    0) and a change of rho rescale u_i = y_i / rho for free.

    Parameters
    ----------
    z : list of ndarray
        Initial consensus model z^0 (copied to float64).
    rho : float
        Penalty rho >= 0; 0 is FedAvg (with stale contributions under partial participation).
    schedule : RhoSchedule, optional
        Rule for rho between rounds; `Constant()` by default.
    regularizer : Regularizer, optional
        Server regularizer g; requires rho > 0.
    client_rho : {"uniform", "reported"}
        Per-client rho_i = rho * s_i with s_i = 1, or s_i given by each reply
        (`Reply.scale`; the linearized form, `core.linearized`).
    eps_abs, eps_rel : float
        Absolute and relative tolerances of the stopping thresholds.
    relaxation : float
        Over-relaxation alpha in (0, 2); 1 is plain ADMM (Boyd et al. suggest 1.5-1.8).
    z_average : {"cached", "replies"}
        z-step over every cached w_i or the round's replies (`flwr_admm.core.steps`).
    dual_step : float or AdaptiveDualStep
        The dual step gamma in (0, 1] (1: the textbook step), or the rule that sets it
        each round from the replies (`flwr_admm.core.schedules`; the current gamma is
        ``gamma``). The fixed point is unchanged; gamma < 1 damps a noisy local
        solve's feedback into its own dual (Glowinski's dual step, kept <= 1).
    start_momentum : float
        beta in [0, 1) of the linearized form's momentum start with restart
        (`flwr_admm.core.start_momentum`): `start_point` is where clients start.
    start_steady : float or None
        tau of the momentum's steady gate (`flwr_admm.core.start_momentum`); None: no gate.

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
    z_average: ZAverage = "cached"
    dual_step: DualStep = 1.0
    start_momentum: float = 0.0
    start_steady: float | None = None
    gamma: float = field(init=False, default=1.0)  # this round's dual step
    sums: RunningSums = field(init=False, repr=False, compare=False)
    _round: OpenRound | None = field(init=False, default=None, repr=False, compare=False)
    momentum: StartMomentum | None = field(init=False, default=None, repr=False, compare=False)

    def __post_init__(self) -> None:
        self.rho = check_rho(self.rho)
        if self.client_rho not in CLIENT_RHO_MODES:
            raise ValueError(
                f"client_rho: must be one of {list(CLIENT_RHO_MODES)}, got {self.client_rho!r}"
            )
        if self.rho == 0 and (self.regularizer is not None or self.client_rho != "uniform"):
            raise ValueError("rho: must be > 0 with a regularizer or client_rho='reported', got 0")
        check_tolerances(self.eps_abs, self.eps_rel)
        self.relaxation = check_relaxation(self.relaxation)
        self.dual_step = check_dual_step_spec(self.dual_step)
        self.gamma = first_gamma(self.dual_step)
        self.z_average = check_z_average(self.z_average)  # R is needed as with alpha != 1:
        self._shares_needed = self.relaxation != 1.0 or self.z_average == "replies"
        beta = check_momentum(self.start_momentum, "start_momentum")
        steady = check_steady(self.start_steady, "start_steady")
        self.momentum = StartMomentum(beta, steady) if beta > 0 else None
        self.z = [np.array(t, dtype=np.float64) for t in self.z]
        if not self.schedule_state:
            self.schedule_state = self.schedule.init()
        self.sums = RunningSums.zeros_like(self.z)
        self.sums.recompute(self.records)

    # ----------------------------------------------------------------- queries
    def rho_for(self, key: str | None) -> float:
        """Return rho_i = rho * s_i (s_i = 1 for an unseen client)."""
        record = self.records.get(key) if key is not None else None
        return self.rho * (record.scale if record is not None else 1.0)

    def center(self, key: str | None, rho_i: float | None = None) -> Arrays:
        """Return v_i = z - y_i / rho_i; z itself (not a copy) for an unseen client.

        rho_i: the current `rho_for(key)` unless given (the one a center was sent with).
        """
        record = self.records.get(key) if key is not None else None
        rho_i = self.rho_for(key) if rho_i is None else rho_i
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
        # the momentum start keeps z_prev: the broadcast comes back rounded to the
        # model's dtype (float32), which must not drop the momentum every round
        self.z = [np.array(t, dtype=np.float64) for t in z]

    def start_point(self) -> Arrays:
        """Return where the clients start: z, or x = z + beta (z - z_prev) with momentum."""
        return self.z if self.momentum is None else self.momentum.start(self.z)

    # ------------------------------------------------------------------ update
    def step(self, replies: Sequence[Reply], server_round: int) -> RoundReport:
        """Run one round on `replies`: `begin`, `absorb_all` in key order, `finish`.

        A non-finite reply raises `NonFiniteReplyError` (the round stays open).
        """
        if not replies:
            raise ValueError("replies: need at least one reply to aggregate")
        self._check_replies(replies)  # refuse the round before touching any state
        self.begin([r.key for r in replies])
        with single_thread_blas():
            refused = self.absorb_all(sorted(replies, key=lambda r: natural_key(r.key)))
        if refused:
            raise NonFiniteReplyError(f"reply {refused[0]!r}: {NON_FINITE}")
        return self.finish(server_round)

    def begin(self, keys: Collection[str]) -> None:
        """Open a round whose replies come from (at most) `keys` (`RunningSums.open_round`)."""
        uniform, relaxed = self.client_rho == "uniform", self._shares_needed
        self._round = self.sums.open_round(keys, self.records, self.z, uniform, relaxed)

    def absorb(self, reply: Reply) -> None:
        """Store w_i, n_i of one replying client and fold it into S_w (`absorb_one`).

        The order of the absorb calls fixes the order of summation; NaN/inf entries
        raise `NonFiniteReplyError` and leave the state as it was.
        """
        rnd = self._open_for([reply])
        absorb_one(self.sums, self.records, rnd, reply)

    def absorb_all(self, replies: Sequence[Reply]) -> list[str]:
        """Absorb `replies` in order, as `absorb` each; return the keys refused as non-finite.

        Bad shapes, n_i or keys raise ValueError before any state changes.
        """
        rnd = self._open_for(replies)
        return absorb_many(self.sums, self.records, rnd, replies)

    def _open_for(self, replies: Sequence[Reply]) -> OpenRound:
        """Return the open round; ValueError for bad shapes, n_i or repeated keys."""
        rnd = self._round
        if rnd is None:
            raise ValueError("absorb: call begin() first")
        self._check_replies(replies, rnd.keys)
        return rnd

    def _check_replies(self, replies: Sequence[Reply], taken: Collection[str] = ()) -> None:
        """Raise ValueError unless keys are unique (and not `taken`), shapes match, n_i > 0."""
        keys = {r.key for r in replies}
        if len(keys) != len(replies) or not keys.isdisjoint(taken):
            raise ValueError("replies: client keys must be unique within a round")
        for reply in replies:
            self.check_shapes(reply.w, f"reply {reply.key!r}")
            if reply.num_examples <= 0:
                raise ValueError(f"reply {reply.key!r}: num_examples must be > 0")
            if self.client_rho == "reported":
                check_scale(reply.scale, f"reply {reply.key!r}: scale")

    def cancel(self) -> None:
        """Close a round in which nothing was absorbed (the state is unchanged)."""
        if self._round is not None and self._round.absorbed:
            raise ValueError("cancel: replies were absorbed; call finish()")
        if self._round is not None and self._round.mode == "full":
            self.sums.recompute(self.records, duals=False)
        self._round = None

    def evict(self, keys: Collection[str]) -> list[str]:
        """Forget clients `keys` between rounds: w_i, y_i, n_i leave S_w, S_s, N and S_y.

        The sums are rebuilt exactly in key order (and the scales s_i with per-client
        rho). Return the keys that were known.
        """
        if self._round is not None:
            raise ValueError("evict: a round is open; call finish() or cancel() first")
        gone = sorted((k for k in set(keys) if k in self.records), key=natural_key)
        for key in gone:
            del self.records[key]
        if gone:
            self.sums.recompute(self.records)
        return gone

    def reset_duals(self, keys: Collection[str]) -> list[str]:
        """Set y_i = 0 for clients `keys` between rounds (`RunningSums.hold`).

        For clients that do not solve the ADMM step (a stock FedProx handler): their
        center v_i is then z, their step FedProx's, and the momentum's steady gate
        closes (such a round is FedProx's). Return the keys that were known.
        """
        if self._round is not None:
            raise ValueError("reset_duals: a round is open; call finish() or cancel() first")
        if keys and self.momentum is not None:
            self.momentum.pause()
        return self.sums.hold(self.records, keys)

    def finish(self, server_round: int) -> RoundReport:
        """Close the round: z-step, dual step, residuals, next rho."""
        rnd, self._round = self._round, None
        if rnd is None or not rnd.absorbed:
            raise ValueError("replies: need at least one reply to aggregate")
        ordered = sorted(rnd.absorbed, key=lambda r: natural_key(r.key))
        rho, z_prev = self.rho, self.z
        adaptive = isinstance(self.dual_step, AdaptiveDualStep) and rho > 0.0  # rho 0: FedAvg
        gamma = self.gamma if adaptive else None
        with single_thread_blas():  # the norms too: a threaded dot sums in its own order
            dz, stats = self._update(rnd, ordered)
            dz_sq = sum_sq_norm(dz)  # ||z - z'||^2: s
            report = round_report(
                ordered,
                self.z,
                dz_sq,
                stats,
                self.sums,
                rho=rho,
                eps_abs=self.eps_abs,
                eps_rel=self.eps_rel,
                regularizer=self.regularizer,
                num_clients_cached=len(self.records),
            )
        self.rho, self.schedule_state = self.schedule.step(
            self.schedule_state, report, server_round
        )
        if self.momentum is not None:  # the restart test and the gate on z_k -> z_{k+1}
            self.momentum.step(z_prev, self.z, every_client=len(ordered) == len(self.records))
        return replace(report, next_rho=self.rho, dual_step=gamma)  # gamma: this round's

    def _update(self, rnd: OpenRound, ordered: list[Reply]) -> tuple[Arrays, DualStats]:
        """Run the z-step and the dual step; return z - z' and the dual sums."""
        z = self.z  # the round's center
        self.sums.complete(rnd, self.records)  # S_w, S_s, N over every cached client
        shares, weight = self.sums.reply_part(rnd, ordered, self.records, z, self._shares_needed)
        # z' = prox_{g/rho_bar}((S_w - (1 - alpha)(R - W z)) / S_s + S_y / (rho S_s)) or replies'
        self.z, dz = averaged_z_step(  # z', z - z'
            self.sums,
            shares,
            weight,
            z,
            z_average=self.z_average if len(ordered) < len(self.records) else "cached",
            rho=self.rho,
            relaxation=self.relaxation,
            regularizer=self.regularizer,
        )
        # y_i += gamma rho_i (alpha (w_i - z') + (1 - alpha)(z - z')), S_y with them
        stats = dual_step(
            ordered,
            self.records,
            self.z,
            dz,
            self.sums,
            shares,
            weight,
            rho=self.rho,
            relaxation=self.relaxation,
            gamma=self.gamma,
            aligned=isinstance(self.dual_step, AdaptiveDualStep),  # c_k in the same pass
        )
        if isinstance(self.dual_step, AdaptiveDualStep):
            self.gamma = self.dual_step.next(self.gamma, stats.c)
        return dz, stats

    # ------------------------------------------------------------- checkpoint
    def state_dict(self) -> tuple[StateArrays, dict[str, Any]]:
        """Return the arrays (live, not copied) and JSON metadata that restore this state.

        Array names: z.j, sum_nsw.j (S_w), sum_ny.j (S_y), w.i.j, y.i.j (clients in
        natural key order); metadata: rho, schedule_state, clients (key, n_i, s_i),
        sum_ns (S_s), sum_n (N), shapes.
        """
        arrays, meta = dump_state(
            SavedState(self.z, self.rho, self.schedule_state, self.records, self.sums)
        )
        if self.momentum is not None:
            extra, meta["start_momentum"] = self.momentum.dump()
            arrays.update(extra)
        if isinstance(self.dual_step, AdaptiveDualStep):
            meta["gamma"] = self.gamma
        return arrays, meta

    def load_state_dict(self, arrays: StateArrays, meta: dict[str, Any]) -> None:
        """Restore what `state_dict` wrote, bit for bit; the model shapes must match."""
        saved = load_state(arrays, meta, [t.shape for t in self.z])
        self.z, self.rho, self.schedule_state = saved.z, saved.rho, saved.schedule_state
        self.records, self.sums = saved.records, saved.sums
        if self.momentum is not None and "start_momentum" in meta:
            self.momentum.load(arrays, meta["start_momentum"], len(self.z))
        if isinstance(self.dual_step, AdaptiveDualStep):
            self.gamma = saved_gamma(meta)
