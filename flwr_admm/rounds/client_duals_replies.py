"""Server-side arithmetic of client-held duals: reply checks, round statistics, z-step.

A reply must agree with the server's record of its key (n_i and last round,
`ClientEntry`; `protocol_problem`). `RoundStats` sums the accepted replies' reports for
the residuals (`round_residuals`); `z_round` takes the z-step.

The stopping test must not rest on what one client says. Each reply's reported
||w_i'||^2 and ||u_i||^2 count at most as much as the largest report of the *other*
replies (`_screened_sums`; the ``eps_primal`` / ``eps_dual`` metrics stay the reported
ones), and the test also needs the server's own ``checked_primal_residual`` =
sqrt(sum n_i ||Delta_i / n_i||^2 / sum n_i) over the steady replies (took part before,
same n_i): ||c_i' - c_i|| -> 0 as the iterates settle, and a client cannot shrink it
without changing S. Under SecAgg+ the server sees sums only: the test is the reported one.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import numpy as np
from flwr.common import Scalar

from flwr_admm.core.kernels import BLOCK, blocks, single_thread_blas
from flwr_admm.core.linearized import budget_scale
from flwr_admm.core.regularizers import Regularizer
from flwr_admm.core.types import Arrays
from flwr_admm.protocol import (
    ALIGN_ALONG,
    ALIGN_DUAL,
    ALIGN_RESIDUAL,
    CHECKED_PRIMAL_RESIDUAL,
    CONVERGED,
    DELAYED_SQ_RESIDUAL,
    DUAL_RESIDUAL,
    EPS_DUAL,
    EPS_PRIMAL,
    EXAMPLES_CHANGE,
    LOSS,
    NUM_DELAYED_RESIDUALS,
    NUM_REPLIES,
    OBJECTIVE,
    PREVIOUS_PRIMAL_RESIDUAL,
    PREVIOUS_ROUND,
    RESTORED,
    RESYNC,
    RHO,
    SECAGG_EXAMPLES,
    U_SQ_NORM,
    W_SQ_NORM,
)

if TYPE_CHECKING:
    from flwr_admm.rounds.client_duals_state import ClientDualsState, ClientEntry


def protocol_problem(
    entry: ClientEntry | None,
    metrics: Mapping[str, Any],
    num_examples: object,
    *,
    secure: bool = False,
    offered: bool = False,
    linearized: bool = False,
) -> tuple[str, int] | None:
    """Return why a reply's metrics break the protocol (and 1 if it is a state mismatch).

    Consistent: the same previous round as the server's record and
    n_i' = n_i + (its change of n), and d2_i sent exactly when it took part before.
    Previous round 0 is a full contribution (a new key, or a resync of a key S holds).
    `offered`: the server offered this key its share back; only then may a reply say it
    trained from it. `linearized`: replies carry b_i (`budget_scale`). Under SecAgg+
    (`secure`) n_i' is the metric ``admm-num-examples`` (num_examples is SecAgg+'s
    weight) and the squared norms travel inside the masked sum.
    """
    if linearized and (why := budget_scale(metrics)[1]) is not None:
        return why, 0
    names = (SECAGG_EXAMPLES,) if secure else (W_SQ_NORM, U_SQ_NORM)
    for name in (PREVIOUS_ROUND, EXAMPLES_CHANGE, *names):
        if name not in metrics:
            return f"missing metric {name!r} (not a client-held-dual client?)", 0
    if secure:
        num_examples = metrics[SECAGG_EXAMPLES]
    names_sq = (W_SQ_NORM, U_SQ_NORM, DELAYED_SQ_RESIDUAL, ALIGN_RESIDUAL, ALIGN_DUAL)
    numbers = [metrics[n] for n in names_sq if n in metrics]
    if not all(_finite_nonnegative(v) for v in numbers):
        return "squared norms must be finite numbers >= 0", 0
    if ALIGN_ALONG in metrics and not _finite(metrics[ALIGN_ALONG]):
        return f"{ALIGN_ALONG} must be a finite number", 0
    previous, change = metrics[PREVIOUS_ROUND], metrics[EXAMPLES_CHANGE]
    if not (
        isinstance(previous, int)
        and isinstance(change, int)
        and _integer(previous)
        and _integer(change)
        and _integer(num_examples)
    ):
        return f"{PREVIOUS_ROUND}, {EXAMPLES_CHANGE}, num_examples must be integers", 0
    resync = metrics.get(RESYNC, 0)
    if not (_integer(resync) and resync in (0, 1)):
        return f"{RESYNC} must be 0 or 1", 0
    if resync == 1 and previous != 0:
        return f"{RESYNC} = 1 needs {PREVIOUS_ROUND} = 0 (a full contribution)", 0
    restored = metrics.get(RESTORED, 0)
    if not (_integer(restored) and restored in (0, 1)):
        return f"{RESTORED} must be 0 or 1", 0
    if restored == 1 and (previous == 0 or not offered):
        return f"{RESTORED} = 1 without a share offered for its previous round", 0
    held = entry if previous != 0 else None  # a full contribution replaces what S holds
    known_round = held.last_round if held is not None else 0
    known_n = held.num_examples if held is not None else 0
    if previous != known_round or known_n + change != num_examples:
        return (
            f"client state out of sync (client reports its previous round {previous} "
            f"and n change {change} to n={num_examples}; the server recorded round "
            f"{known_round}, n={known_n}); the acknowledgement of its next round "
            "brings it back",
            1,
        )
    if not secure and (DELAYED_SQ_RESIDUAL in metrics) != (known_round > 0 and not restored):
        return (
            f"{DELAYED_SQ_RESIDUAL} must be sent exactly when it took part before "
            f"(and did not train from a restored share, {RESTORED} = 1)",
            0,
        )
    return None


def z_step(
    z: Arrays,
    contribution_sum: Arrays,
    total_weight: float,
    regularizer: Regularizer | None,
    rho: float,
) -> float:
    """Set z <- prox_{g/rho}(S / N) in place, block by block (no temporary); return ||z' - z||^2."""
    largest = max(t.size for t in z)
    new, diff = np.empty(min(BLOCK, largest)), np.empty(min(BLOCK, largest))
    total = 0.0
    for z_t, s_t in zip(z, contribution_sum, strict=True):
        z_flat, s_flat = z_t.reshape(-1), s_t.reshape(-1)
        for block in blocks(z_flat.size):
            size = block.stop - block.start
            np.divide(s_flat[block], float(total_weight), out=new[:size])
            if regularizer is not None:
                regularizer.prox_([new[:size]], rho)
            np.subtract(new[:size], z_flat[block], out=diff[:size])
            total += float(np.dot(diff[:size], diff[:size]))
            z_flat[block] = new[:size]
    return total


def round_residuals(
    stats: RoundStats,
    z: Arrays,
    dz_sq: float,
    rho: float,
    eps_abs: float,
    eps_rel: float,
    regularizer: Regularizer | None,
) -> tuple[dict[str, Scalar], bool]:
    """Return s = rho ||z' - z||, the delayed r, eps_pri, eps_dual, and whether converged.

    eps_pri = sqrt(P) eps_abs + eps_rel max(sqrt(sum p_i ||w_i'||^2), ||z'||),
    eps_dual = sqrt(P) eps_abs + eps_rel rho sqrt(sum p_i ||u_i||^2).
    """
    root_p = math.sqrt(sum(t.size for t in z))
    z_norm = math.sqrt(sum(float(np.vdot(t, t)) for t in z))
    eps_primal = root_p * eps_abs + eps_rel * max(stats.w_norm, z_norm)
    eps_dual = root_p * eps_abs + eps_rel * rho * stats.u_norm
    dual = rho * math.sqrt(dz_sq)
    metrics: dict[str, Scalar] = {
        RHO: rho,
        DUAL_RESIDUAL: dual,
        EPS_PRIMAL: eps_primal,
        EPS_DUAL: eps_dual,
        NUM_REPLIES: stats.num_replies,
        NUM_DELAYED_RESIDUALS: stats.num_delayed,
    }
    previous, checked = stats.previous_primal, stats.checked_primal
    if previous is not None:
        metrics[PREVIOUS_PRIMAL_RESIDUAL] = previous
    if checked is not None:
        metrics[CHECKED_PRIMAL_RESIDUAL] = checked
    # The decision: thresholds from the screened reports (<= the reported ones), and
    # the server's own primal residual too (module docstring).
    w_screened, u_screened = stats.screened_norms()
    strict_primal = root_p * eps_abs + eps_rel * max(w_screened, z_norm)
    strict_dual = root_p * eps_abs + eps_rel * rho * u_screened
    server_side = not stats.screened or (checked is not None and checked <= strict_primal)
    converged = previous is not None and previous <= strict_primal and dual <= strict_dual
    converged = converged and server_side
    metrics[CONVERGED] = int(converged)
    if stats.objective is not None:
        objective = stats.objective
        if regularizer is not None:
            objective += regularizer.value(z)
        metrics[OBJECTIVE] = objective
    return metrics, converged


class RoundStats:
    """n-weighted sums over one round's accepted replies.

    Filled reply by reply (`add`, both APIs), the norm reports are screened and the
    server-side primal residual is kept (module docstring); filled from SecAgg+'s sums
    (`flwr_admm.server.client_duals_secagg`), ``screened`` stays False.
    """

    def __init__(self) -> None:
        self.num_replies = self.num_delayed = 0
        self.n = self.n_delayed = 0.0
        self.d2 = self.w_sq = self.u_sq = self.loss = 0.0
        self.losses_finite = True
        self.screened = False  # filled by `add`: reports screened, checked residual kept
        self.reports: list[tuple[float, float, float]] = []  # (n_i, ||w_i'||^2, ||u_i||^2)
        self.change_sq = self.n_steady = 0.0  # sum ||Delta_i||^2 / n_i, sum n_i (steady)
        self.align = [0.0, 0.0, 0.0]  # sum n_i of ALIGN_ALONG, ALIGN_RESIDUAL, ALIGN_DUAL

    def add(
        self,
        num_examples: int,
        metrics: Mapping[str, Any],
        change_sq: float | None = 0.0,
        weight: float | None = None,
    ) -> None:
        """Count one accepted reply (its n_i, protocol metrics and ||Delta_i||^2).

        `weight` is omega_i when it is not n_i (the linearized form): Delta_i = omega_i
        (c_i' - c_i), and the server's own residual is ||c_i' - c_i||, n_i-weighted.
        `change_sq` None: omega_i changed (a new b_i), Delta_i is no such difference.
        """
        n = float(num_examples)
        self.num_replies += 1
        self.n += n
        self.screened = True
        self.reports.append((n, float(metrics[W_SQ_NORM]), float(metrics[U_SQ_NORM])))
        self.w_sq += n * self.reports[-1][1]
        self.u_sq += n * self.reports[-1][2]
        full = metrics.get(PREVIOUS_ROUND, 0) == 0 or metrics.get(RESYNC, 0) == 1
        steady = not full and metrics.get(EXAMPLES_CHANGE, 0) == 0 and change_sq is not None
        if steady:  # Delta_i = omega_i (c_i' - c_i)
            assert change_sq is not None
            if weight is None:
                self.change_sq += float(change_sq) / n
            else:
                self.change_sq += n * float(change_sq) / (weight * weight)
            self.n_steady += n
        if DELAYED_SQ_RESIDUAL in metrics:
            self.num_delayed += 1
            self.n_delayed += n
            self.d2 += n * float(metrics[DELAYED_SQ_RESIDUAL])  # type: ignore[arg-type]
            if all(name in metrics for name in (ALIGN_ALONG, ALIGN_RESIDUAL, ALIGN_DUAL)):
                for j, name in enumerate((ALIGN_ALONG, ALIGN_RESIDUAL, ALIGN_DUAL)):
                    self.align[j] += n * float(metrics[name])
        loss = metrics.get(LOSS)
        if isinstance(loss, int | float) and math.isfinite(loss):
            self.loss += n * float(loss)
        else:
            self.losses_finite = False

    @property
    def w_norm(self) -> float:
        """Sqrt(sum p_i ||w_i'||^2), as reported."""
        return math.sqrt(self.w_sq / self.n)

    @property
    def u_norm(self) -> float:
        """Sqrt(sum p_i ||u_i||^2), as reported."""
        return math.sqrt(self.u_sq / self.n)

    def screened_norms(self) -> tuple[float, float]:
        """`w_norm` and `u_norm` with each report capped by the others' (`_screened_sums`)."""
        if not self.screened:
            return self.w_norm, self.u_norm
        w_sq, u_sq = _screened_sums(self.reports)
        return math.sqrt(w_sq / self.n), math.sqrt(u_sq / self.n)

    @property
    def checked_primal(self) -> float | None:
        """Sqrt(sum n_i ||Delta_i / n_i||^2 / sum n_i) over the steady replies; None if none."""
        return math.sqrt(self.change_sq / self.n_steady) if self.n_steady > 0 else None

    @property
    def previous_primal(self) -> float | None:
        """Sqrt(sum n_i d2_i / sum n_i) over the replies with d2_i; None if none."""
        return math.sqrt(self.d2 / self.n_delayed) if self.num_delayed else None

    @property
    def alignment(self) -> float | None:
        """Return c_k of the replies' dual steps (`flwr_admm.core.schedules`); None if undefined."""
        along, residual, dual = self.align
        if residual <= 0.0 or dual <= 0.0:
            return None
        return along / math.sqrt(residual * dual)

    @property
    def objective(self) -> float | None:
        """Sum p_i f_i(w_i'), or None if a loss is missing or not finite."""
        return self.loss / self.n if self.losses_finite else None


def z_round(
    state: ClientDualsState, stats: RoundStats, weight: float
) -> tuple[Arrays, dict[str, Scalar], bool]:
    """Take round k's z-step (`weight` = N + N_stale); return (z, metrics, converged)."""
    z, contribution_sum = state.z, state.contribution_sum
    assert z is not None and contribution_sum is not None
    with single_thread_blas():  # the norms too: a threaded dot sums in its own order
        dz_sq = z_step(z, contribution_sum, weight, state.regularizer, state.rho)
        metrics, converged = round_residuals(
            stats, z, dz_sq, state.rho, state.eps_abs, state.eps_rel, state.regularizer
        )
    return z, metrics, converged


def _screened_sums(reports: list[tuple[float, float, float]]) -> tuple[float, float]:
    """Return sum n_i ||w_i'||^2 and sum n_i ||u_i||^2, each report capped by the others'.

    Reply j's value counts at most as the largest value of the other replies (0 when
    it is alone): one forged report cannot lift eps_pri or eps_dual, and honest
    reports, close to each other near the fixed point, are barely touched.
    """
    sums = []
    for column in (1, 2):
        values = [r[column] for r in reports]
        order = sorted(range(len(values)), key=values.__getitem__, reverse=True)
        top, second = order[0], (values[order[1]] if len(order) > 1 else 0.0)
        capped = [min(v, second) if j == top else v for j, v in enumerate(values)]
        sums.append(sum(r[0] * v for r, v in zip(reports, capped, strict=True)))
    return sums[0], sums[1]


def _integer(value: object) -> bool:
    return isinstance(value, int | np.integer) and not isinstance(value, bool)


def _finite(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _finite_nonnegative(value: object) -> bool:
    return (
        isinstance(value, int | float)
        and not isinstance(value, bool)
        and math.isfinite(value)
        and value >= 0
    )
