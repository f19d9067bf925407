"""The step rules between rounds: the penalty rho and the dual step gamma.

**rho** (`RhoSchedule`): small pure rules ``rho', state' = schedule.update(rho, state,
r)``. The state is a JSON-serializable dict, so that it is checkpointed with the
server. A change of rho needs no dual rescaling: the server stores unscaled duals
y_i = rho u_i (Boyd et al. 2011, sec. 3.4.1).

**gamma** (`AdaptiveDualStep`): the dual step y_i += gamma rho_i (w_i - z') has the
same fixed point for every gamma in (0, 1]. The textbook gamma = 1 is the fastest with
deterministic local solves and blows up a CNN trained by momentum SGD on minibatches; a
damped gamma = 0.2 survives the CNN and costs up to 4.6x the rounds on seed-logreg
(docs/options.md). Which one a run needs shows in the alignment of each reply's
residual with its own dual,

    c_k = sum_i p_i rho_i <w_i - z', y_i> / sqrt(sum_i p_i rho_i^2 ||w_i - z'||^2
                                                 sum_i p_i ||y_i||^2)

over the round's replies, y_i before the step (computed in the dual step's pass,
`flwr_admm.core.steps.dual_step`). A damped step on a deterministic solve leaves most
of each correction for the next round, so the next residual points along the dual
again (c_k of 0.95-1 on seed-logreg and digits at gamma 0.2); with minibatch noise the
residuals are mostly noise (c_k of 0.3-0.6 on the CNN task). The rule

    gamma_{k+1} = clip(gamma_k exp(rate (c_k - threshold)), floor, 1)

moves gamma toward 1 on the first kind of run and keeps it at ``floor`` on the second.
"""

from __future__ import annotations

import inspect
import math
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any

from flwr_admm.core.types import RoundReport, check_dual_step, check_rho

ScheduleState = dict[str, Any]


@dataclass(frozen=True)
class RoundResiduals:
    """What a schedule may look at after round `server_round`'s aggregation.

    `primal_scale` = max(sqrt(sum p_i ||w_i||^2), ||z||) and `dual_scale` =
    sqrt(sum p_i ||y_i||^2) (after the dual step) are the norms Boyd's relative
    tolerances use; r / primal_scale and s / dual_scale are scale-free residuals.
    """

    server_round: int
    primal_residual: float
    dual_residual: float
    objective: float | None = None
    primal_scale: float | None = None
    dual_scale: float | None = None


def _check_positive(value: float, field: str) -> float:
    if not (isinstance(value, int | float) and math.isfinite(value) and value > 0):
        raise ValueError(f"{field}: must be a finite number > 0, got {value!r}")
    return float(value)


def _check_factor(value: float, field: str) -> float:
    value = _check_positive(value, field)
    if value <= 1.0:
        raise ValueError(f"{field}: must be > 1, got {value!r}")
    return value


class RhoSchedule(ABC):
    """A rule that maps (rho, state, residuals of the round) to the next rho."""

    def init(self) -> ScheduleState:
        """Return the initial schedule state (JSON-serializable)."""
        return {}

    @abstractmethod
    def update(
        self, rho: float, state: ScheduleState, residuals: RoundResiduals
    ) -> tuple[float, ScheduleState]:
        """Return the rho for the next round and the new state."""

    def describe(self) -> dict[str, Any]:
        """Name and parameters, for config fingerprints."""
        return {"name": type(self).__name__, **vars(self)}

    def step(
        self, state: ScheduleState, report: RoundReport, server_round: int
    ) -> tuple[float, ScheduleState]:
        """Return the next rho (checked) and state after a round's `report`."""
        residuals = RoundResiduals(
            server_round=server_round,
            primal_residual=report.primal_residual,
            dual_residual=report.dual_residual,
            objective=report.objective,
            primal_scale=report.primal_scale,
            dual_scale=report.dual_scale,
        )
        rho, state = self.update(report.rho, state, residuals)
        return check_rho(rho, "rho_schedule output"), state


class Constant(RhoSchedule):
    """rho_{k+1} = rho_k."""

    def update(
        self, rho: float, state: ScheduleState, residuals: RoundResiduals
    ) -> tuple[float, ScheduleState]:
        """Keep rho."""
        return rho, state


class ResidualBalancing(RhoSchedule):
    """Residual balancing (Boyd et al. 2011, eq. 3.13) with Wohlberg's (2017) refinements.

    With r', s' the residuals of the round and q = r' / s',

        rho <- rho * t   if q > mu,    rho <- rho / t   if q < 1 / mu,    else unchanged,

    clipped to [rho_min, rho_max].

    - `relative=True` (Wohlberg, sec. IV.B): r' = r / primal_scale, s' = s / dual_scale,
      scale-free, so the rule does not depend on the units of the model (default);
      `relative=False`: r' = r, s' = s.
    - `adaptive_tau=True` (sec. IV.C): t = min(sqrt(q), tau_max) (or min(sqrt(1/q),
      tau_max)), halfway to balance on a log scale (default); otherwise t = tau.
    - `max_changes`: after that many changes rho stays fixed, so every run ends as
      constant-rho ADMM and its convergence theory applies (Boyd et al. 2011, 3.4.1);
      None lets rho change forever.

    The defaults (mu = 15, tau_max = 10, max_changes = 10) were chosen with
    `benchmarks.convergence`. ``ResidualBalancing(mu=10, relative=False,
    adaptive_tau=False, max_changes=None)`` is Boyd's eq. 3.13 with tau = 2.
    """

    def __init__(
        self,
        mu: float = 15.0,
        tau: float = 2.0,
        rho_min: float = 1e-6,
        rho_max: float = 1e6,
        *,
        relative: bool = True,
        adaptive_tau: bool = True,
        tau_max: float = 10.0,
        max_changes: int | None = 10,
    ) -> None:
        self.mu = _check_factor(mu, "mu")
        self.tau = _check_factor(tau, "tau")
        self.rho_min = _check_positive(rho_min, "rho_min")
        self.rho_max = _check_positive(rho_max, "rho_max")
        if self.rho_min > self.rho_max:
            raise ValueError(f"rho_min: must be <= rho_max ({rho_max}), got {rho_min}")
        for name, flag in (("relative", relative), ("adaptive_tau", adaptive_tau)):
            if not isinstance(flag, bool):
                raise ValueError(f"{name}: must be True or False, got {flag!r}")
        self.relative = relative
        self.adaptive_tau = adaptive_tau
        self.tau_max = _check_factor(tau_max, "tau_max")
        if max_changes is not None and (
            isinstance(max_changes, bool) or int(max_changes) != max_changes or max_changes < 0
        ):
            raise ValueError(f"max_changes: must be None or an integer >= 0, got {max_changes!r}")
        self.max_changes = None if max_changes is None else int(max_changes)

    def init(self) -> ScheduleState:
        """Return the number of times rho has changed so far."""
        return {"changes": 0}

    def update(
        self, rho: float, state: ScheduleState, residuals: RoundResiduals
    ) -> tuple[float, ScheduleState]:
        """Balance the primal residual r against the dual residual s."""
        changes = int(state.get("changes", 0))
        if self.max_changes is not None and changes >= self.max_changes:
            return rho, {"changes": changes}
        r, s = residuals.primal_residual, residuals.dual_residual
        if self.relative:
            r = _relative(r, residuals.primal_scale, "primal_scale")
            s = _relative(s, residuals.dual_scale, "dual_scale")
        if r > self.mu * s:
            new_rho = rho * self._multiplier(r, s)
        elif s > self.mu * r:
            new_rho = rho / self._multiplier(s, r)
        else:
            return rho, {"changes": changes}
        new_rho = min(max(new_rho, self.rho_min), self.rho_max)
        return new_rho, {"changes": changes + (new_rho != rho)}

    def _multiplier(self, larger: float, smaller: float) -> float:
        """Multiplier t = tau, or sqrt(larger / smaller) capped at tau_max (> sqrt(mu) > 1 here)."""
        if not self.adaptive_tau:
            return self.tau
        if smaller == 0.0:
            return self.tau_max
        return min(math.sqrt(larger / smaller), self.tau_max)


def _relative(residual: float, scale: float | None, field: str) -> float:
    """Return residual / scale; 0 / 0 = 0 and x / 0 = inf (the other residual then dominates)."""
    if scale is None:
        raise ValueError(f"{field}: relative residual balancing needs it, got None")
    if scale > 0.0:
        return residual / scale
    return 0.0 if residual == 0.0 else math.inf


SCHEDULES: dict[str, type[RhoSchedule]] = {
    "constant": Constant,
    "residual-balancing": ResidualBalancing,
}


def make_schedule(name: str, **kwargs: Any) -> RhoSchedule:
    """Build a schedule from its name (`constant`, `residual-balancing`)."""
    if name not in SCHEDULES:
        raise ValueError(f"rho_schedule: must be one of {sorted(SCHEDULES)}, got {name!r}")
    schedule = SCHEDULES[name]
    try:
        inspect.signature(schedule).bind(**kwargs)
    except TypeError as error:  # e.g. an argument the schedule does not take
        raise ValueError(
            f"rho_schedule: {name!r} cannot be built from {sorted(kwargs)} ({error}); "
            f"pass {schedule.__name__}(...) itself"
        ) from error
    return schedule(**kwargs)


@dataclass(frozen=True)
class AdaptiveDualStep:
    """The adaptive dual step rule (module docstring), for ``dual_step=``.

    Parameters
    ----------
    floor : float
        The first and the smallest gamma, in (0, 1].
    threshold : float
        The alignment c_k in (-1, 1) above which gamma grows and below which it shrinks.
    rate : float
        How fast: gamma changes by the factor exp(rate (c_k - threshold)) a round, rate > 0.

    """

    floor: float = 0.2
    threshold: float = 0.7
    rate: float = 1.0

    def __post_init__(self) -> None:
        object.__setattr__(self, "floor", check_dual_step(self.floor, "floor"))
        if isinstance(self.threshold, bool) or not (
            isinstance(self.threshold, int | float) and -1.0 < self.threshold < 1.0
        ):
            raise ValueError(f"threshold: must be a number in (-1, 1), got {self.threshold!r}")
        if isinstance(self.rate, bool) or not (
            isinstance(self.rate, int | float) and math.isfinite(self.rate) and self.rate > 0
        ):
            raise ValueError(f"rate: must be a finite number > 0, got {self.rate!r}")
        object.__setattr__(self, "threshold", float(self.threshold))
        object.__setattr__(self, "rate", float(self.rate))

    def next(self, gamma: float, c: float | None) -> float:
        """Return gamma_{k+1} from gamma_k and the round's alignment (None: unchanged)."""
        if c is None:
            return gamma
        return min(1.0, max(self.floor, gamma * math.exp(self.rate * (c - self.threshold))))

    def describe(self) -> dict[str, Any]:
        """Return the rule as JSON (for settings fingerprints)."""
        return {"adaptive": {"floor": self.floor, "threshold": self.threshold, "rate": self.rate}}


DualStep = float | AdaptiveDualStep  # what ``dual_step`` takes


def check_dual_step_spec(value: object) -> DualStep:
    """Return a dual step: a number in (0, 1] as a float, or an `AdaptiveDualStep`.

    Raises
    ------
    ValueError
        Naming ``dual_step`` and its allowed values.

    """
    if isinstance(value, AdaptiveDualStep):
        return value
    if isinstance(value, bool) or not (isinstance(value, int | float) and 0 < value <= 1):
        raise ValueError(
            f"dual_step: must be a number in (0, 1] or an AdaptiveDualStep(...), got {value!r}"
        )
    return float(value)


def first_gamma(step: DualStep) -> float:
    """Return gamma of the first round: the number itself, or the rule's floor."""
    return step.floor if isinstance(step, AdaptiveDualStep) else step


def saved_gamma(meta: dict[str, Any]) -> float:
    """Return the gamma a checkpoint's metadata holds; ValueError naming ``gamma`` if none."""
    gamma = meta.get("gamma")
    if isinstance(gamma, bool) or not isinstance(gamma, int | float):
        raise ValueError(f"gamma: the checkpoint holds no dual step, got {gamma!r}")
    return check_dual_step(gamma, "gamma")
