"""The divergence watchdog (`flwr_admm.core.health`): each signal fires, healthy runs never.

Rounds are fed as the round layers feed them: the model sent z, the model returned z'
(arrays), the reply counts, the primal residual and the objective.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from flwr_admm.core import HealthCheck, RunDivergedError
from flwr_admm.core.health import DEFAULT_HEALTH, RunHealth


def feed(health: RunHealth, models: list[np.ndarray], **extra: object) -> int:
    """Feed z^0 -> z^1 -> ... as rounds 1, 2, ...; return the rounds taken."""
    for k in range(1, len(models)):
        health.observe(
            k, accepted=10, rejected=0, failed=0, before=[models[k - 1]], after=[models[k]], **extra
        )
    return len(models) - 1


def fired_at(health: RunHealth, models: list[np.ndarray]) -> tuple[int, str]:
    with pytest.raises(RunDivergedError) as caught:
        feed(health, models)
    number = int(str(caught.value).split("at round ")[1].split(":")[0])
    return number, str(caught.value)


def watchdog(**kwargs: object) -> RunHealth:
    return RunHealth(HealthCheck(**kwargs), "FedADMM")  # type: ignore[arg-type]


# ------------------------------------------------------------------ signals fire
@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_a_non_finite_z_fires_at_once(bad: float) -> None:
    z = [np.ones(4) * 0.1 * k for k in range(4)]
    z[3][2] = bad
    number, message = fired_at(watchdog(), z)
    assert number == 3
    assert "z' holds NaN or inf (non-finite state)" in message


def test_a_norm_that_overflows_float64_fires() -> None:
    z = [np.ones(4), np.full(4, 1e200)]  # finite entries, ||z||^2 = inf
    number, message = fired_at(watchdog(), z)
    assert number == 1 and "||z'|| overflows float64" in message


def test_a_non_finite_primal_residual_fires() -> None:
    health = watchdog()
    with pytest.raises(RunDivergedError, match="primal residual is nan"):
        health.observe(
            1, accepted=2, rejected=0, failed=0, after=[np.ones(3)], primal_residual=math.nan
        )


def test_z_growing_past_its_first_rounds_scale_fires() -> None:
    # Scale from z^0 and the first 3 rounds: ||z|| <= 2; bound 1e3 * 2.
    norms = [1.0, 2.0, 1.5, 1.8, 10.0, 100.0, 1500.0, 2500.0]
    z = [np.array([n, 0.0]) for n in norms]
    number, message = fired_at(watchdog(growth_rounds=10), z)  # growth off the path
    assert number == 7
    assert "||z'|| = 2.5e+03 exceeds 1000 x max(1, 2), the largest ||z|| of the first rounds" in (
        message
    )
    assert "(explosion)" in message


def test_the_floor_of_one_covers_a_start_at_zero() -> None:
    z = [np.zeros(2), *[np.array([n, 0.0]) for n in (0.01, 0.02, 0.03, 5.0, 999.0)]]
    assert feed(watchdog(growth_rounds=10), z) == 5  # 999 <= 1e3 * max(1, 0.03)
    with pytest.raises(RunDivergedError, match="explosion"):
        feed(watchdog(growth_rounds=10), [*z, np.array([1001.0, 0.0])])


def test_an_exploding_objective_fires() -> None:
    health = watchdog()
    z = np.ones(2)
    for k, f in enumerate([2.3, 2.0, 1.9, 1.5, 3.0, 2400.0], start=1):
        if f > 2300:
            with pytest.raises(RunDivergedError, match=r"the objective 2.4e\+03 exceeds 1000"):
                health.observe(k, accepted=3, rejected=0, failed=0, after=[z], objective=f)
        else:
            health.observe(k, accepted=3, rejected=0, failed=0, after=[z], objective=f)


def test_a_non_finite_objective_alone_is_not_the_state() -> None:
    # One client's loss of inf (log 0) with a healthy model: not a divergence signal.
    health = watchdog()
    for k, f in enumerate([2.0, math.inf, 2.1, math.nan, 1.9], start=1):
        health.observe(k, accepted=3, rejected=0, failed=0, after=[np.ones(2)], objective=f)
    assert [r.objective for r in health.rounds] == [2.0, None, 2.1, None, 1.9]


def test_a_rising_update_norm_fires_within_a_few_rounds() -> None:
    # x5 a round from a model of norm 10: the explosion bound is far, growth is not.
    z = [np.array([10.0, 0.0])]
    step = 0.5
    for _ in range(8):
        z.append(z[-1] + np.array([0.0, step]))
        step *= 5
    number, message = fired_at(watchdog(), z)
    assert number == 4  # steps 0.5, 2.5, 12.5, 62.5: 3 rises, 125x, 62.5 > ||z^0|| = 10
    assert "rose in each of the last 3 rounds (0.5, 2.5, 12.5, 62.5), 125 x in all" in message
    assert "(growth)" in message


def test_every_reply_rejected_for_k_rounds_fires() -> None:
    health = watchdog()
    z = [np.ones(3)]
    health.observe(1, accepted=4, rejected=0, failed=0, before=z, after=z)
    health.observe(2, accepted=0, rejected=4, failed=0)
    health.observe(3, accepted=0, rejected=0, failed=0)  # nothing sent: neither counts nor resets
    health.observe(4, accepted=0, rejected=2, failed=2)
    with pytest.raises(RunDivergedError) as caught:
        health.observe(5, accepted=0, rejected=0, failed=4)
    message = str(caught.value)
    assert "at round 5: no reply was accepted in 3 rounds in a row" in message
    assert "round 4: -, -, -, -; replies 0/2/2" in message


def test_an_accepted_reply_resets_the_idle_streak() -> None:
    health = watchdog()
    z = [np.ones(3)]
    for k in range(1, 13):
        if k % 3 == 0:
            health.observe(k, accepted=1, rejected=3, failed=0, before=z, after=z)
        else:
            health.observe(k, accepted=0, rejected=4, failed=0)


def test_the_message_says_what_happened_and_what_to_try() -> None:
    health = RunHealth(HealthCheck(), "FedADMMClientDuals")
    z0, z1 = np.ones(2), np.ones(2)
    health.observe(1, accepted=3, rejected=1, failed=0, before=[z0], after=[z1], objective=0.7)
    with pytest.raises(RunDivergedError) as caught:
        health.observe(2, accepted=3, rejected=0, failed=1, before=[z1], after=[z1 * np.nan])
    message = str(caught.value)
    assert isinstance(caught.value, RuntimeError)
    assert message.startswith("FedADMMClientDuals: the run diverged or stalled at round 2")
    assert "round 1: 1.41, 0, -, 0.7; replies 3/1/0" in message
    assert "learning_rate * rho > 2" in message
    assert "flwr_admm.torch.TorchADMM" in message and "ADMMTrainStep" in message
    assert "FedADMMClientDuals(health=None) to turn the check off" in message


def test_integer_tensors_do_not_count() -> None:
    health = watchdog()
    ints = np.array(10**12, dtype=np.int64)  # a num_batches_tracked-like buffer
    before, after = [np.ones(2), np.array(0, dtype=np.int64)], [np.ones(2), ints]
    health.observe(1, accepted=1, rejected=0, failed=0, before=before, after=after)
    assert health.rounds[-1].norm == pytest.approx(math.sqrt(2))
    assert health.rounds[-1].update == 0.0


def test_tensors_are_read_once_each_from_lazy_readers() -> None:
    before = [np.ones(3), np.full((2, 2), 2.0, dtype=np.float32)]
    after = [np.zeros(3), np.full((2, 2), 2.0, dtype=np.float32)]
    health = watchdog()
    health.observe(1, accepted=1, rejected=0, failed=0, before=iter(before), after=iter(after))
    assert health.rounds[-1].norm == pytest.approx(4.0)
    assert health.rounds[-1].update == pytest.approx(math.sqrt(3))
    health.observe(2, accepted=1, rejected=0, failed=0, before=[np.ones(3)], after=after)
    assert health.rounds[-1].update is None  # another layout: no update norm


# ------------------------------------------------------------- healthy runs pass
def noisy_deep_net(rounds: int, seed: int) -> list[np.ndarray]:
    """A CNN-like run: ||z|| grows 3x over training, steps vary 10x round to round."""
    rng = np.random.default_rng(seed)
    z = [rng.standard_normal(500) * 0.5]  # ||z^0|| ~ 11
    for k in range(rounds):
        size = 10 ** rng.uniform(-1.0, 0.0) * 2.0 / (1 + k / 50)  # 10x spread, decaying
        direction = rng.standard_normal(500)
        drift = 0.004 * z[-1]  # the weight norm grows ~3x over 300 rounds
        z.append(z[-1] + drift + size * direction / np.linalg.norm(direction))
    return z


@pytest.mark.parametrize("seed", range(5))
def test_a_noisy_deep_net_run_never_fires(seed: int) -> None:
    z = noisy_deep_net(300, seed)
    assert np.linalg.norm(z[-1]) / np.linalg.norm(z[0]) > 2
    rng = np.random.default_rng(seed)
    health = watchdog()
    for k in range(1, len(z)):
        accuracy_noise = rng.uniform(0.5, 2.5)  # the objective goes up and down
        health.observe(
            k,
            accepted=int(rng.integers(0, 11)) or 1,
            rejected=int(rng.integers(0, 3)),
            failed=int(rng.integers(0, 2)),
            before=[z[k - 1]],
            after=[z[k]],
            primal_residual=float(rng.uniform(0.1, 5.0)),
            objective=accuracy_noise,
        )


def test_a_converged_run_with_round_off_steps_never_fires() -> None:
    z_star = np.linspace(-3.0, 3.0, 50)
    z = [z_star.copy()]
    for e in (0.0, 1e-17, 1e-16, 1e-15, 1e-14, 1e-13, 0.0, 1e-12, 1e-11):  # rising noise
        z.append(z_star + e)
    assert feed(watchdog(), z) == len(z) - 1


def test_warmups_and_rho_schedules_never_fire() -> None:
    # A learning-rate warmup: steps 100x larger over 10 rounds, small next to ||z||.
    z = [np.full(100, 0.3)]
    for k in range(10):
        z.append(z[-1] + 1e-3 * 1.6**k * np.ones(100) / 10)
    assert feed(watchdog(), z) == 10
    # A rho halved every round (ResidualBalancing's largest move): steps double.
    z = [np.full(10, 1.0)]
    for k in range(8):
        z.append(z[-1] * (-1) ** k + 0.01 * 2**k)
    assert feed(watchdog(), z) == 8


def test_a_start_at_zero_reaching_its_scale_never_fires() -> None:
    # Logistic regression from z = 0: ||z|| climbs to ~50 over the first rounds.
    z = [np.zeros(20)] + [np.full(20, 11.0 * (1 - 0.7**k)) for k in range(1, 60)]
    assert feed(watchdog(), z) == 59


# ----------------------------------------------------------------------- settings
@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("explosion", 1.0),
        ("explosion", math.inf),
        ("explosion", True),
        ("growth", 0.5),
        ("growth", "10"),
        ("warmup", -1),
        ("warmup", 1.5),
        ("growth_rounds", 0),
        ("idle_rounds", 0),
        ("idle_rounds", True),
    ],
)
def test_bad_settings_are_refused_naming_the_field(field: str, value: object) -> None:
    with pytest.raises(ValueError, match=f"^{field}: must be"):
        HealthCheck(**{field: value})  # type: ignore[arg-type]


def test_the_state_takes_a_health_check_or_none() -> None:
    assert RunHealth.of(None, "FedADMM") is None
    assert isinstance(RunHealth.of(DEFAULT_HEALTH, "FedADMM"), RunHealth)
    with pytest.raises(ValueError, match="health: must be a HealthCheck or None"):
        RunHealth.of({"explosion": 10}, "FedADMM")  # type: ignore[arg-type]


def test_a_blown_up_first_round_fires_at_once() -> None:
    # A CNN-sized start (||z^0|| = 20) and replies of 1e10 after one round: the warmup
    # must not absorb the blow-up into the scale.
    z0 = np.full(100, 2.0)
    number, message = fired_at(watchdog(), [z0, np.full(100, 1e9), np.full(100, 1e24)])
    assert number == 1 and "exceeds 1000 x max(1, 20)" in message
