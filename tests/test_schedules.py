"""Rho schedules produce hand-computed sequences; their state survives JSON."""

from __future__ import annotations

import json

import pytest

from flwr_admm import (
    Constant,
    Geometric,
    ResidualBalancing,
    RhoSchedule,
    RoundResiduals,
    StallIncrease,
    make_schedule,
)


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


def test_geometric_multiplies_on_every_kth_round_and_clips_at_rho_min() -> None:
    schedule = Geometric(factor=0.5, every=2, rho_min=0.3)
    # rounds 1..6: x0.5 on rounds 2, 4, 6; 1 -> 1, 0.5, 0.5, 0.25->0.3, 0.3, 0.15->0.3
    assert _run(schedule, 1.0, [(1.0, 1.0)] * 6) == [1.0, 0.5, 0.5, 0.3, 0.3, 0.3]


def test_geometric_growth_clips_at_rho_max() -> None:
    schedule = Geometric(factor=10.0, rho_max=50.0)
    # 1 -> 10 -> 100 clipped to 50 -> 500 clipped to 50
    assert _run(schedule, 1.0, [(0.0, 0.0)] * 3) == [10.0, 50.0, 50.0]


def test_stall_increase_hand_sequence() -> None:
    schedule = StallIncrease(factor=2.0, window=2, threshold=0.9, rho_max=5.0)
    objectives: list[float | None] = [10.0, 9.0, 8.5, 8.4, 5.0, 4.9, 4.8, None, 4.7, 4.6]
    # history of the last window+1 = 3 objectives; grow when F_k > 0.9 F_{k-2}:
    # k=3: 8.5 > 9.0? no  | k=4: 8.4 > 8.1 yes -> 2 | k=5: 5 > 7.65 no | k=6: 4.9 > 7.56 no
    # k=7: 4.8 > 4.5 yes -> 4 | k=8: no objective, unchanged
    # k=9: 4.7 > 0.9*4.9=4.41 yes -> 8 capped 5 | k=10: 4.6 > 4.32 yes -> capped 5
    expected = [1.0, 1.0, 1.0, 2.0, 2.0, 2.0, 4.0, 4.0, 5.0, 5.0]
    residuals = [(1.0, 1.0)] * len(objectives)
    assert _run(schedule, 1.0, residuals, objectives) == expected
    assert _run(schedule, 1.0, residuals, objectives, via_json=True) == expected


def test_stall_increase_state_after_a_round_is_the_objective_window() -> None:
    schedule = StallIncrease(factor=2.0, window=2)
    state = schedule.init()
    for k, f in enumerate([3.0, 2.0, 1.0, 0.5], start=1):
        _, state = schedule.update(1.0, state, RoundResiduals(k, 0.0, 0.0, f))
    assert json.loads(json.dumps(state)) == {"objectives": [2.0, 1.0, 0.5]}


def test_residual_balancing_hand_sequence() -> None:
    schedule = ResidualBalancing(mu=10.0, tau=2.0)
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
    schedule = ResidualBalancing(mu=3.0, tau=5.0)
    # (4, 1): 4 > 3 -> x5 = 5; (1, 4): /5 = 1; (2, 1): balanced -> 1
    assert _run(schedule, 1.0, [(4.0, 1.0), (1.0, 4.0), (2.0, 1.0)]) == [5.0, 1.0, 1.0]


def test_residual_balancing_clips_to_bounds() -> None:
    schedule = ResidualBalancing(rho_min=0.3, rho_max=3.0)
    up = _run(schedule, 1.0, [(100.0, 1.0)] * 3)
    assert up == [2.0, 3.0, 3.0]
    down = _run(schedule, 1.0, [(1.0, 100.0)] * 3)
    assert down == [0.5, 0.3, 0.3]


@pytest.mark.parametrize(
    "schedule",
    [Constant(), Geometric(0.5), StallIncrease(), ResidualBalancing()],
    ids=["constant", "geometric", "stall", "residual-balancing"],
)
def test_init_state_and_description_are_json(schedule: RhoSchedule) -> None:
    state = schedule.init()
    assert json.loads(json.dumps(state)) == state
    described = json.loads(json.dumps(schedule.describe()))
    assert described["name"] == type(schedule).__name__


@pytest.mark.parametrize(
    ("factory", "field"),
    [
        (lambda: Geometric(factor=0.0), "factor"),
        (lambda: Geometric(factor=-2.0), "factor"),
        (lambda: Geometric(factor=float("nan")), "factor"),
        (lambda: Geometric(factor=2.0, every=0), "every"),
        (lambda: Geometric(factor=2.0, every=1.5), "every"),
        (lambda: Geometric(factor=2.0, rho_min=0.0), "rho_min"),
        (lambda: Geometric(factor=2.0, rho_max=float("inf")), "rho_max"),
        (lambda: Geometric(factor=2.0, rho_min=2.0, rho_max=1.0), "rho_min"),
        (lambda: StallIncrease(factor=1.0), "factor"),
        (lambda: StallIncrease(factor=0.5), "factor"),
        (lambda: StallIncrease(window=0), "window"),
        (lambda: StallIncrease(threshold=-0.1), "threshold"),
        (lambda: StallIncrease(rho_max=0.0), "rho_max"),
        (lambda: ResidualBalancing(mu=1.0), "mu"),
        (lambda: ResidualBalancing(mu=-10.0), "mu"),
        (lambda: ResidualBalancing(tau=1.0), "tau"),
        (lambda: ResidualBalancing(tau=float("inf")), "tau"),
        (lambda: ResidualBalancing(rho_min=-1.0), "rho_min"),
        (lambda: ResidualBalancing(rho_min=10.0, rho_max=1.0), "rho_min"),
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
    assert isinstance(make_schedule("geometric", factor=0.9), Geometric)
    assert isinstance(make_schedule("stall"), StallIncrease)


def test_make_schedule_unknown_name_lists_allowed_names() -> None:
    with pytest.raises(ValueError) as info:
        make_schedule("adaptive")
    message = str(info.value)
    assert message.startswith("rho_schedule:")
    assert "'adaptive'" in message
    for name in ("constant", "geometric", "stall", "residual-balancing"):
        assert f"'{name}'" in message
