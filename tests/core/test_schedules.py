"""Rho schedules produce hand-computed sequences; their state survives JSON."""

from __future__ import annotations

import json

import pytest

from flwr_admm.core import Constant, ResidualBalancing
from flwr_admm.core.schedules import RhoSchedule, RoundResiduals, ScheduleState, make_schedule


def _run(
    schedule: RhoSchedule,
    rho: float,
    residuals: list[tuple[float, float]],
    objectives: list[float | None] | None = None,
    *,
    via_json: bool = False,
) -> list[float]:
    """rho after each round; with via_json the state is dumped and reloaded every round."""
    state = schedule.init()
    objectives = objectives if objectives is not None else [None] * len(residuals)
    sequence = []
    for k, ((r, s), f) in enumerate(zip(residuals, objectives, strict=True), start=1):
        if via_json:
            state = json.loads(json.dumps(state))
        rho, state = schedule.update(rho, state, RoundResiduals(k, r, s, f))
        json.dumps(state)  # every intermediate state must serialize
        sequence.append(rho)
    return sequence


def test_constant_keeps_rho_whatever_the_residuals() -> None:
    residuals = [(100.0, 1.0), (1.0, 100.0), (0.0, 0.0)]
    assert _run(Constant(), 0.7, residuals) == [0.7, 0.7, 0.7]


BOYD = {"relative": False, "adaptive_tau": False, "max_changes": None}


def test_residual_balancing_boyd_3_13_hand_sequence() -> None:
    """relative=False, adaptive_tau=False, max_changes=None, mu=10: the previous default."""
    schedule = ResidualBalancing(mu=10.0, tau=2.0, **BOYD)
    residuals = [
        (100.0, 1.0),  # r > 10 s: x2 -> 2
        (100.0, 1.0),  # x2 -> 4
        (1.0, 100.0),  # s > 10 r: /2 -> 2
        (5.0, 1.0),  # balanced -> 2
        (10.0, 1.0),  # r = 10 s exactly: not > -> 2
        (1.0, 10.0),  # s = 10 r exactly: not > -> 2
        (0.0, 1e-12),  # s > 0 = 10 r: /2 -> 1
        (1e-12, 0.0),  # r > 0 = 10 s: x2 -> 2
        (0.0, 0.0),  # unchanged -> 2
    ]
    expected = [2.0, 4.0, 2.0, 2.0, 2.0, 2.0, 1.0, 2.0, 2.0]
    assert _run(schedule, 1.0, residuals) == expected
    assert _run(schedule, 1.0, residuals, via_json=True) == expected


def test_residual_balancing_custom_mu_tau() -> None:
    schedule = ResidualBalancing(mu=3.0, tau=5.0, **BOYD)
    # (4, 1): 4 > 3 -> x5 = 5; (1, 4): /5 = 1; (2, 1): balanced -> 1
    assert _run(schedule, 1.0, [(4.0, 1.0), (1.0, 4.0), (2.0, 1.0)]) == [5.0, 1.0, 1.0]


def test_residual_balancing_clips_to_bounds() -> None:
    schedule = ResidualBalancing(rho_min=0.3, rho_max=3.0, **BOYD)
    up = _run(schedule, 1.0, [(100.0, 1.0)] * 3)
    assert up == [2.0, 3.0, 3.0]
    down = _run(schedule, 1.0, [(1.0, 100.0)] * 3)
    assert down == [0.5, 0.3, 0.3]


def _run_scaled(
    schedule: RhoSchedule,
    rho: float,
    rounds: list[tuple[float, float, float, float]],
    *,
    via_json: bool = False,
) -> tuple[list[float], ScheduleState]:
    """rho after each round from (r, s, primal_scale, dual_scale); also the last state."""
    state = schedule.init()
    sequence = []
    for k, (r, s, primal_scale, dual_scale) in enumerate(rounds, start=1):
        if via_json:
            state = json.loads(json.dumps(state))
        residuals = RoundResiduals(k, r, s, None, primal_scale, dual_scale)
        rho, state = schedule.update(rho, state, residuals)
        json.dumps(state)
        sequence.append(rho)
    return sequence, state


def test_relative_adaptive_residual_balancing_hand_sequence() -> None:
    """Wohlberg's rule: q = (r / primal_scale) / (s / dual_scale), t = min(sqrt q, 10)."""
    schedule = ResidualBalancing(mu=10.0, tau_max=10.0, max_changes=None)
    rounds = [
        (2.0, 0.5, 2.0, 50.0),  # r' = 1, s' = 0.01: q = 100 > 10, t = 10 -> 10
        (1.0, 1.0, 1.0, 1.0),  # q = 1: balanced -> 10
        (0.1, 1.6, 1.0, 1.0),  # 1/q = 16 > 10, t = 4 -> 2.5
        (400.0, 0.04, 1.0, 1.0),  # q = 1e4, sqrt = 100 capped at tau_max -> 25
        (1.0, 100.0, 1.0, 1e4),  # absolute s = 100 r, but relative q = 100: x10 -> 250
        (10.0, 1.0, 1.0, 1.0),  # q = mu exactly: not > -> 250
        (0.0, 0.0, 0.0, 0.0),  # 0 / 0 scales: both residuals 0 -> 250
        (0.0, 1e-3, 1.0, 1.0),  # r' = 0 < s' / mu: t = tau_max -> 25
        (3.0, 2.0, 1.0, 0.0),  # s / 0 scale = inf dominates: / 10 -> 2.5
    ]
    expected = [10.0, 10.0, 2.5, 25.0, 250.0, 250.0, 250.0, 25.0, 2.5]
    sequence, state = _run_scaled(schedule, 1.0, rounds)
    assert sequence == pytest.approx(expected, rel=1e-15)
    assert state == {"changes": 6}
    assert _run_scaled(schedule, 1.0, rounds, via_json=True)[0] == sequence


def test_relative_fixed_tau_and_absolute_adaptive_variants() -> None:
    rounds = [(2.0, 0.5, 2.0, 50.0), (1.0, 100.0, 1.0, 1e4), (0.1, 1.6, 1.0, 1.0)]
    relative_fixed = ResidualBalancing(mu=10.0, tau=2.0, adaptive_tau=False)
    # q = 100: x2 -> 2 | q = 100: x2 -> 4 | 1/q = 16: /2 -> 2
    assert _run_scaled(relative_fixed, 1.0, rounds)[0] == [2.0, 4.0, 2.0]
    absolute_adaptive = ResidualBalancing(mu=10.0, relative=False)
    # r/s = 4: keep | s/r = 100: / sqrt(100) = 10 -> 0.1 | s/r = 16: / 4 -> 0.025
    assert _run_scaled(absolute_adaptive, 1.0, rounds)[0] == pytest.approx([1.0, 0.1, 0.025])


def test_residual_balancing_freezes_after_max_changes() -> None:
    schedule = ResidualBalancing(mu=10.0, tau_max=10.0, rho_max=50.0, max_changes=2)
    imbalanced = (100.0, 0.01, 1.0, 1.0)  # q = 1e4: x10 every round until frozen
    # 1 -> 10 (1 change) -> 50 clipped (2 changes) -> frozen at 50
    sequence, state = _run_scaled(schedule, 1.0, [imbalanced] * 4)
    assert sequence == [10.0, 50.0, 50.0, 50.0]
    assert state == {"changes": 2}
    # A move the clip cancels (already at rho_max) is not a change.
    sequence, state = _run_scaled(schedule, 50.0, [imbalanced, (0.01, 100.0, 1.0, 1.0)])
    assert sequence == [50.0, 5.0] and state == {"changes": 1}
    # max_changes=0 never moves rho; a checkpointed state from before the counter ({})
    # counts from zero.
    frozen = ResidualBalancing(max_changes=0)
    assert _run_scaled(frozen, 1.0, [imbalanced] * 3)[0] == [1.0, 1.0, 1.0]
    rho, state = schedule.update(1.0, {}, RoundResiduals(1, 100.0, 0.01, None, 1.0, 1.0))
    assert (rho, state) == (10.0, {"changes": 1})


def test_relative_residual_balancing_needs_the_scales() -> None:
    with pytest.raises(ValueError, match=r"^primal_scale: "):
        ResidualBalancing().update(1.0, {}, RoundResiduals(1, 1.0, 1.0))
    with pytest.raises(ValueError, match=r"^dual_scale: "):
        ResidualBalancing().update(1.0, {}, RoundResiduals(1, 1.0, 1.0, None, 1.0))


def test_residual_balancing_defaults() -> None:
    schedule = ResidualBalancing()
    described = schedule.describe()
    assert described == {
        "name": "ResidualBalancing",
        "mu": 15.0,
        "tau": 2.0,
        "rho_min": 1e-6,
        "rho_max": 1e6,
        "relative": True,
        "adaptive_tau": True,
        "tau_max": 10.0,
        "max_changes": 10,
    }
    assert schedule.init() == {"changes": 0}


@pytest.mark.parametrize(
    "schedule",
    [Constant(), ResidualBalancing()],
    ids=["constant", "residual-balancing"],
)
def test_init_state_and_description_are_json(schedule: RhoSchedule) -> None:
    state = schedule.init()
    assert json.loads(json.dumps(state)) == state
    described = json.loads(json.dumps(schedule.describe()))
    assert described["name"] == type(schedule).__name__


@pytest.mark.parametrize(
    ("factory", "field"),
    [
        (lambda: ResidualBalancing(mu=1.0), "mu"),
        (lambda: ResidualBalancing(mu=-10.0), "mu"),
        (lambda: ResidualBalancing(tau=1.0), "tau"),
        (lambda: ResidualBalancing(tau=float("inf")), "tau"),
        (lambda: ResidualBalancing(rho_min=-1.0), "rho_min"),
        (lambda: ResidualBalancing(rho_min=10.0, rho_max=1.0), "rho_min"),
        (lambda: ResidualBalancing(tau_max=1.0), "tau_max"),
        (lambda: ResidualBalancing(tau_max=float("nan")), "tau_max"),
        (lambda: ResidualBalancing(relative=1), "relative"),
        (lambda: ResidualBalancing(adaptive_tau="yes"), "adaptive_tau"),
        (lambda: ResidualBalancing(max_changes=-1), "max_changes"),
        (lambda: ResidualBalancing(max_changes=2.5), "max_changes"),
        (lambda: ResidualBalancing(max_changes=True), "max_changes"),
    ],
)
def test_bad_parameters_name_the_field(factory, field: str) -> None:
    with pytest.raises(ValueError, match=rf"^{field}: "):
        factory()


def test_make_schedule_builds_by_name() -> None:
    schedule = make_schedule("residual-balancing", mu=5.0, tau=3.0)
    assert isinstance(schedule, ResidualBalancing)
    assert (schedule.mu, schedule.tau) == (5.0, 3.0)
    assert isinstance(make_schedule("constant"), Constant)


def test_make_schedule_unknown_name_lists_allowed_names() -> None:
    with pytest.raises(ValueError) as info:
        make_schedule("adaptive")
    message = str(info.value)
    assert message.startswith("rho_schedule:")
    assert "'adaptive'" in message
    for name in ("constant", "residual-balancing"):
        assert f"'{name}'" in message
