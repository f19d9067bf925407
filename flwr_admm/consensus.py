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

Residuals (Boyd et al. 2011, 3.3, in the p-weighted norm over the replying clients):
r = sqrt(sum p_i ||w_i - z'||^2), s = rho_bar ||z' - z||,
eps_pri = sqrt(n) eps_abs + eps_rel max(sqrt(sum p_i ||w_i||^2), ||z'||),
eps_dual = sqrt(n) eps_abs + eps_rel sqrt(sum p_i ||y_i||^2), n = number of parameters.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
from numpy.typing import NDArray

from flwr_admm.regularizers import Regularizer
from flwr_admm.schedules import Constant, RhoSchedule, RoundResiduals, ScheduleState

Arrays = list[NDArray[np.float64]]
ClientRho = Literal["uniform", "data_size"]
CLIENT_RHO_MODES = ("uniform", "data_size")


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

    @property
    def converged(self) -> bool:
        """Boyd's stopping rule: r <= eps_pri and s <= eps_dual."""
        return self.primal_residual <= self.eps_primal and self.dual_residual <= self.eps_dual


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

    """

    z: Arrays
    rho: float
    schedule: RhoSchedule = field(default_factory=Constant)
    regularizer: Regularizer | None = None
    client_rho: ClientRho = "uniform"
    eps_abs: float = 1e-6
    eps_rel: float = 1e-4
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
        self.z = [np.array(t, dtype=np.float64) for t in self.z]
        if not self.schedule_state:
            self.schedule_state = self.schedule.init()
        self._sum_nsw: Arrays = [np.zeros_like(t) for t in self.z]
        self._sum_ny: Arrays = [np.zeros_like(t) for t in self.z]
        self._sum_ns = 0.0
        self._sum_n = 0
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
        """Run the z-step and the dual step on the accepted replies of one round."""
        if not replies:
            raise ValueError("replies: need at least one reply to aggregate")
        ordered = sorted(replies, key=lambda r: natural_key(r.key))
        if len({r.key for r in ordered}) != len(ordered):
            raise ValueError("replies: client keys must be unique within a round")
        for reply in ordered:
            self.check_shapes(reply.w, f"reply {reply.key!r}")
            if reply.num_examples <= 0:
                raise ValueError(f"reply {reply.key!r}: num_examples must be > 0")
        rho, z_prev = self.rho, self.z
        scales_changed = self._store_replies(ordered)
        # When every cached client replied (or all weights moved) an exact sum in
        # sorted order costs the same as the incremental update and has no drift.
        full = scales_changed or len(ordered) == len(self.records)
        if full:
            self._recompute_sums()
        else:
            for reply in ordered:
                self._accumulate(self.records[reply.key], +1.0)
        self.z = self._z_step()
        self._dual_step(ordered, exact_sum=full)
        report = self._report(ordered, z_prev, rho)
        next_rho, self.schedule_state = self.schedule.update(
            rho,
            self.schedule_state,
            RoundResiduals(
                server_round=server_round,
                primal_residual=report.primal_residual,
                dual_residual=report.dual_residual,
                objective=report.objective,
            ),
        )
        self.rho = _check_rho(next_rho, "rho_schedule output")
        return RoundReport(**{**report.__dict__, "next_rho": self.rho})

    def _store_replies(self, ordered: Sequence[Reply]) -> bool:
        """Replace w_i, n_i of the replying clients (their old share leaves the sums).

        Returns True when the multipliers s_i of clients that did not reply changed.
        """
        for reply in ordered:
            w = [np.array(t, dtype=np.float64) for t in reply.w]
            record = self.records.get(reply.key)
            if record is None:
                zeros = [np.zeros_like(t) for t in w]
                self.records[reply.key] = ClientRecord(w, zeros, int(reply.num_examples))
            else:
                self._accumulate(record, -1.0)
                record.w, record.num_examples = w, int(reply.num_examples)
        if self.client_rho == "uniform":
            return False
        replied = {r.key for r in ordered}
        max_n = max(r.num_examples for r in self.records.values())
        changed = False
        for key, record in self.records.items():
            scale = record.num_examples / max_n
            changed |= key not in replied and scale != record.scale
            record.scale = scale
        return changed

    def _accumulate(self, record: ClientRecord, sign: float) -> None:
        """Add (sign=+1) or remove (sign=-1) one client's share of the running sums."""
        ns = record.num_examples * record.scale
        for acc, w in zip(self._sum_nsw, record.w, strict=True):
            acc += (sign * ns) * w
        for acc, y in zip(self._sum_ny, record.y, strict=True):
            acc += (sign * record.num_examples) * y
        self._sum_ns += sign * ns
        self._sum_n += int(sign) * record.num_examples

    def _recompute_sums(self, duals_only: bool = False) -> None:
        """Exact sums over all cached clients in sorted key order."""
        if not duals_only:
            for acc in self._sum_nsw:
                acc.fill(0.0)
            self._sum_ns, self._sum_n = 0.0, 0
        for acc in self._sum_ny:
            acc.fill(0.0)
        for key in sorted(self.records, key=natural_key):
            record = self.records[key]
            if not duals_only:
                ns = record.num_examples * record.scale
                for acc, w in zip(self._sum_nsw, record.w, strict=True):
                    acc += ns * w
                self._sum_ns += ns
                self._sum_n += record.num_examples
            for acc, y in zip(self._sum_ny, record.y, strict=True):
                acc += record.num_examples * y

    def _z_step(self) -> Arrays:
        """Z = prox_{g/rho_bar}((rho S_w + S_y) / (rho S_s)), S_w = sum n_i s_i w_i."""
        rho = self.rho
        if rho == 0.0:
            z = [acc / self._sum_ns for acc in self._sum_nsw]
        else:
            denom = rho * self._sum_ns
            z = [(rho * a + b) / denom for a, b in zip(self._sum_nsw, self._sum_ny, strict=True)]
        if self.regularizer is not None:
            self.regularizer.prox_(z, rho * self._sum_ns / self._sum_n)
        return z

    def _dual_step(self, ordered: Sequence[Reply], exact_sum: bool) -> None:
        """y_i += rho_i (w_i - z) for the clients that replied."""
        for reply in ordered:
            record = self.records[reply.key]
            rho_i = self.rho * record.scale
            for y, w, z, acc in zip(record.y, record.w, self.z, self._sum_ny, strict=True):
                delta = w - z
                delta *= rho_i
                y += delta
                if not exact_sum:
                    acc += record.num_examples * delta
        if exact_sum:
            self._recompute_sums(duals_only=True)

    def _report(self, ordered: Sequence[Reply], z_prev: Arrays, rho: float) -> RoundReport:
        total = float(sum(r.num_examples for r in ordered))
        r_sq = w_sq = y_sq = 0.0
        for reply in ordered:
            record = self.records[reply.key]
            p = record.num_examples / total
            r_sq += p * _sq_norm(w - z for w, z in zip(record.w, self.z, strict=True))
            w_sq += p * _sq_norm(record.w)
            y_sq += p * _sq_norm(record.y)
        rho_bar = rho * self._sum_ns / self._sum_n
        dual = rho_bar * math.sqrt(_sq_norm(a - b for a, b in zip(self.z, z_prev, strict=True)))
        root_n = math.sqrt(self.num_parameters)
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
            eps_primal=root_n * self.eps_abs
            + self.eps_rel * max(math.sqrt(w_sq), math.sqrt(_sq_norm(self.z))),
            eps_dual=root_n * self.eps_abs + self.eps_rel * math.sqrt(y_sq),
            objective=objective,
            num_replies=len(ordered),
            num_clients_cached=len(self.records),
        )
