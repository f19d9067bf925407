"""Divergence watchdog: a diverging or stalled run stops with an error, never "succeeds".

The round layer feeds `RunHealth.observe` once per round (reply counts, z sent, z'
returned, primal residual and objective); it raises `RunDivergedError` naming the
signal, the last rounds and what to try. The signals (thresholds in `HealthCheck`):

- **non-finite**: z' (or the primal residual) holds NaN/inf, or ||z'|| overflows;
- **explosion**: ||z'|| > explosion * max(1, s), s the largest ||z|| among the first
  model sent and the first `warmup` rounds' z' (a round is held to s before it joins
  it, so a blow-up in the first rounds fires at once); |f| likewise against its first
  reports;
- **growth**: ||z' - z|| rose in each of the last `growth_rounds` aggregations, by a
  factor >= `growth` in all, to more than max(1, ||z||) of the model the rise started from;
- **idle**: `idle_rounds` rounds in a row had replies (or lost ones) but accepted none.

Only floating-point tensors count: an integer buffer such as ``num_batches_tracked``
can be neither NaN nor a sign of divergence.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass
from itertools import pairwise, zip_longest
from typing import Any

import numpy as np
from numpy.typing import NDArray

from flwr_admm.core.types import RunDivergedError

__all__ = ["ADMM_ADVICE", "DEFAULT_HEALTH", "PEER_ADVICE", "HealthCheck", "RunHealth"]

ADMM_ADVICE = (
    "lower the clients' learning rate (or their local steps) or rho: a gradient step on "
    "rho/2 ||w - v||^2 alone diverges once learning_rate * rho > 2, and momentum or Adam "
    "make it worse; for the local step, flwr_admm.torch.TorchADMM (its default exact "
    "proximal step is stable for any rho) or flwr_admm.clientapp.ADMMTrainStep"
)
PEER_ADVICE = "lower the clients' learning rate (or their local steps)"


@dataclass(frozen=True)
class HealthCheck:
    """Thresholds of the divergence watchdog (`RunHealth`); ``health=None`` turns it off.

    The signals are the module's. The defaults never fire on a healthy run, even a noisy
    deep-net one, and stop a run that blows up within a few rounds.

    Parameters
    ----------
    explosion : float
        Factor > 1 (default 1e3) over the scale s that ||z'|| (and |f| over its first
        reports) may reach. A healthy weight norm changes by a small factor over
        training; the floor max(1, s) covers a start at z = 0 (weights that
        legitimately exceed 1e3 from a zero start need a larger value).
    warmup : int
        Rounds >= 0 (default 3) whose z' and objective set the scale after the first
        model sent: a model started at zero reaches its own scale in the first rounds.
    growth : float
        Total factor > 1 (default 100) of the rise of ||z' - z|| over `growth_rounds`
        rising rounds: noisy update norms do not rise 100x monotonically.
    growth_rounds : int
        Consecutive aggregations >= 1 (default 3) with a rising update norm.
    idle_rounds : int
        Consecutive rounds >= 1 (default 3) with replies but none accepted. A round
        that sent nothing (converged, ``fraction_train=0``) neither counts nor resets.

    """

    explosion: float = 1e3
    warmup: int = 3
    growth: float = 100.0
    growth_rounds: int = 3
    idle_rounds: int = 3

    def __post_init__(self) -> None:
        for name in ("explosion", "growth"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise ValueError(f"{name}: must be a finite number > 1, got {value!r}")
            if not (math.isfinite(value) and value > 1):
                raise ValueError(f"{name}: must be a finite number > 1, got {value!r}")
        for name, low in (("warmup", 0), ("growth_rounds", 1), ("idle_rounds", 1)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ValueError(f"{name}: must be an integer >= {low}, got {value!r}")


DEFAULT_HEALTH = HealthCheck()  # the strategies' default ``health``


@dataclass(frozen=True)
class _Round:
    """What one round showed: its number, norms, residual, objective and reply counts."""

    number: int
    norm: float | None  # ||z'|| (None: nothing aggregated)
    update: float | None  # ||z' - z||
    primal_residual: float | None
    objective: float | None
    counts: tuple[int, int, int]  # accepted, rejected, failed

    def line(self) -> str:
        values = (self.norm, self.update, self.primal_residual, self.objective)
        shown = ", ".join("-" if v is None else f"{v:.3g}" for v in values)
        return f"  round {self.number}: {shown}; replies {'/'.join(map(str, self.counts))}"


class RunHealth:
    """The watchdog's state for one run: scales, recent rounds, idle streak.

    Parameters
    ----------
    check : HealthCheck
        The thresholds.
    label : str
        The strategy's name, in the error message (``FedADMM``).
    advice : str
        What to try, in the error message (`ADMM_ADVICE`, `PEER_ADVICE`).

    """

    def __init__(self, check: HealthCheck, label: str, advice: str = ADMM_ADVICE) -> None:
        if not isinstance(check, HealthCheck):
            raise ValueError(f"health: must be a HealthCheck or None, got {check!r}")
        self.check, self.label, self.advice = check, label, advice
        self.scale: float | None = None  # max ||z|| of the first model and warmup rounds
        self.objective_scale: float | None = None
        self._scaled = 0  # aggregations that set the scale so far
        self._objectives = 0  # of them, those that reported an objective
        self._steps: deque[tuple[float, float]] = deque(maxlen=check.growth_rounds + 1)
        self._idle = 0
        self.rounds: deque[_Round] = deque(maxlen=max(5, check.growth_rounds + 1))

    @classmethod
    def of(
        cls, check: HealthCheck | None, label: str, advice: str = ADMM_ADVICE
    ) -> RunHealth | None:
        """Return the state for `check`, or None when the watchdog is off (`check` None)."""
        return None if check is None else cls(check, label, advice)

    def observe(
        self,
        server_round: int,
        *,
        accepted: int,
        rejected: int,
        failed: int,
        before: Iterable[NDArray[Any]] | None = None,
        after: Iterable[NDArray[Any]] | None = None,
        primal_residual: float | None = None,
        objective: float | None = None,
    ) -> None:
        """Take one round: z sent (`before`), z' returned (`after`, None if none).

        Both are read once, a tensor of each at a time, so generators keep the peak
        memory at two tensors.

        Raises
        ------
        RunDivergedError
            When a signal fires (module docstring), naming it and the last rounds.

        """
        counts = (int(accepted), int(rejected), int(failed))
        if after is None or accepted == 0:
            self.rounds.append(_Round(server_round, None, None, None, None, counts))
            if accepted == 0 and rejected + failed > 0:
                self._idle += 1
                if self._idle >= self.check.idle_rounds:
                    self._fail(
                        server_round,
                        f"no reply was accepted in {self._idle} rounds in a row (each was "
                        "rejected, e.g. NaN: see the 'rejected reply' warnings above, or "
                        "failed, or never came)",
                    )
            return
        self._idle = 0
        measured = _measure(after, before)
        norm, start, update = measured.norm, measured.start, measured.update
        residual, objective = _number(primal_residual), _number(objective)
        if objective is not None and not math.isfinite(objective):
            objective = None  # one client's inf loss is not the state's
        self.rounds.append(_Round(server_round, norm, update, residual, objective, counts))
        if not math.isfinite(norm):
            what = "||z'|| overflows float64" if measured.finite else "z' holds NaN or inf"
            self._fail(server_round, f"{what} (non-finite state)")
        if residual is not None and not math.isfinite(residual):
            self._fail(server_round, f"the primal residual is {residual} (non-finite state)")
        self._explosion(server_round, norm, start, objective)
        if update is not None and start is not None and math.isfinite(start):
            self._growth(server_round, update, start)

    # ---------------------------------------------------------------- signals
    def _explosion(
        self, server_round: int, norm: float, start: float | None, objective: float | None
    ) -> None:
        """Fire when ||z'|| or |f| passes `explosion` x its scale so far; grow the scale.

        A round is held to the scale before it joins it: a blow-up in a warmup round
        fires at once instead of raising the bound.
        """
        check = self.check
        if self.scale is None:
            self.scale = start if start is not None and math.isfinite(start) else 0.0
        if norm > check.explosion * max(1.0, self.scale):
            self._fail(
                server_round,
                f"||z'|| = {norm:.3g} exceeds {check.explosion:g} x max(1, {self.scale:.3g}), "
                "the largest ||z|| of the first rounds (explosion)",
            )
        if self._scaled < check.warmup:
            self.scale = max(self.scale, norm)
            self._scaled += 1
        if objective is None:
            return
        scale = self.objective_scale
        if scale is not None and abs(objective) > check.explosion * max(1.0, scale):
            self._fail(
                server_round,
                f"the objective {objective:.3g} exceeds {check.explosion:g} x max(1, "
                f"{scale:.3g}), its largest size in the first rounds (explosion)",
            )
        if self._objectives <= check.warmup:  # the first objective, then `warmup` more
            self.objective_scale = max(scale or 0.0, abs(objective))
            self._objectives += 1

    def _growth(self, server_round: int, update: float, start: float) -> None:
        """Fire when ||z' - z|| rose `growth_rounds` times, `growth` x in all, past ||z||."""
        check = self.check
        self._steps.append((update, start))
        if len(self._steps) <= check.growth_rounds:
            return
        steps = [u for u, _ in self._steps]
        rising = all(b > a for a, b in pairwise(steps))
        base, base_norm = self._steps[0]
        if rising and update >= check.growth * base and update > max(1.0, base_norm):
            shown = ", ".join(f"{u:.3g}" for u in steps)
            self._fail(
                server_round,
                f"the update norm ||z' - z|| rose in each of the last {check.growth_rounds} "
                f"rounds ({shown}), {update / base if base > 0 else math.inf:.3g} x in all, "
                f"to more than the model's own size {max(1.0, base_norm):.3g} (growth)",
            )

    def _fail(self, server_round: int, what: str) -> None:
        lines = "\n".join(r.line() for r in self.rounds)
        raise RunDivergedError(
            f"{self.label}: the run diverged or stalled at round {server_round}: {what}.\n"
            "Last rounds (||z'||, ||z' - z||, primal residual, objective; replies "
            f"accepted/rejected/failed):\n{lines}\n"
            f"What to try: {self.advice}. {self.check!r} set these thresholds: pass "
            f"{self.label}(health=flwr_admm.HealthCheck(...)) to loosen them or "
            f"{self.label}(health=None) to turn the check off."
        )


@dataclass(frozen=True)
class _Norms:
    """||z'||, ||z|| and ||z' - z|| over the floating tensors; whether z' is finite."""

    norm: float
    start: float | None
    update: float | None
    finite: bool


def _measure(after: Iterable[NDArray[Any]], before: Iterable[NDArray[Any]] | None) -> _Norms:
    """Measure z' against z in one pass, a tensor of each at a time (lazy inputs welcome).

    Non-floating tensors are skipped; an overflowing square sums to inf, NaN to nan;
    ``update`` is None without `before` or when the tensors' shapes differ.
    """
    norm_sq, start_sq, update_sq = 0.0, 0.0, 0.0
    finite, comparable = True, before is not None
    pairs = zip_longest(after, () if before is None else before)
    with np.errstate(over="ignore", invalid="ignore"):
        for new, old in pairs:
            a = None if new is None else np.asarray(new)
            b = None if old is None else np.asarray(old)
            if a is not None and a.dtype.kind in "fc":
                flat = np.ravel(a).astype(np.float64, copy=False)
                sq = float(np.dot(flat, flat))
                norm_sq += sq
                finite = finite and (math.isfinite(sq) or bool(np.isfinite(a).all()))
            if b is not None and b.dtype.kind in "fc":
                old_flat = np.ravel(b).astype(np.float64, copy=False)
                start_sq += float(np.dot(old_flat, old_flat))
            if a is None or b is None or a.shape != b.shape or a.dtype.kind != b.dtype.kind:
                comparable = False
            elif comparable and a.dtype.kind in "fc" and math.isfinite(norm_sq):
                d = np.subtract(a, b, dtype=np.float64).ravel()
                update_sq += float(np.dot(d, d))
    update = math.sqrt(update_sq) if comparable and math.isfinite(norm_sq) else None
    start = None if before is None else math.sqrt(start_sq)
    return _Norms(math.sqrt(norm_sq), start, update, finite)


def _number(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float | np.floating | np.integer):
        return None
    return float(value)
