"""The linearized form's momentum start with restart and its steady gate: hand-computed
rounds, the restart test, the gate, checkpoints, and the settings that name them."""

from __future__ import annotations

import numpy as np
import pytest

from flwr_admm.core import ConsensusADMM, Linearized
from flwr_admm.core.linearized import SCAFFNEW, strategy_settings
from flwr_admm.core.start_momentum import STEADY_ROUNDS, StartMomentum
from flwr_admm.core.types import Reply


def test_the_start_is_z_then_z_plus_beta_times_the_last_step() -> None:
    momentum = StartMomentum(0.5)
    z0, z1, z2 = [np.array([0.0, 0.0])], [np.array([1.0, 2.0])], [np.array([1.5, 3.0])]
    assert momentum.start(z0) is z0  # a first round: z itself
    assert momentum.step(z0, z1) is False  # (z1 - z0) . (z1 - z0) >= 0: never a restart
    np.testing.assert_array_equal(momentum.start(z1)[0], [1.5, 3.0])  # z1 + 0.5 (z1 - z0)
    assert momentum.step(z1, z2) is False  # z2 - x = 0: along, no restart
    np.testing.assert_array_equal(momentum.start(z2)[0], [1.75, 3.5])


def test_a_step_against_the_momentum_restarts_it_for_one_round() -> None:
    momentum = StartMomentum(0.5)
    z0, z1 = [np.array([0.0])], [np.array([2.0])]
    momentum.step(z0, z1)  # x_2 = 2 + 0.5 * 2 = 3
    back = [np.array([1.0])]  # (1 - 3) * (1 - 2) = 2 >= 0: still along
    assert momentum.step(z1, back) is False
    x = momentum.start(back)[0]  # 1 + 0.5 (1 - 2) = 0.5
    np.testing.assert_array_equal(x, [0.5])
    overshoot = [np.array([1.2])]  # (1.2 - 0.5) * (1.2 - 1) = 0.14 >= 0
    assert momentum.step(back, overshoot) is False
    x = momentum.start(overshoot)[0]  # 1.2 + 0.5 * 0.2 = 1.3
    against = [np.array([1.25])]  # (1.25 - 1.3) * (1.25 - 1.2) < 0: restart
    assert momentum.step(overshoot, against) is True
    assert momentum.restarts == 1 and momentum.start(against) is against  # x = z next round
    assert momentum.step(against, [np.array([1.0])]) is False  # the round after: momentum again
    np.testing.assert_array_equal(momentum.start([np.array([1.0])])[0], [1.0 - 0.5 * 0.25])


def test_a_non_finite_test_restarts() -> None:
    momentum = StartMomentum(0.5)
    momentum.step([np.array([0.0])], [np.array([1.0])])
    assert momentum.step([np.array([1.0])], [np.array([np.nan])]) is True


def test_the_gate_opens_after_two_steady_rounds_holds_through_a_turn_and_shuts_on_a_restart() -> (
    None
):
    """d_k = z_{k+1} - x_k; the start moves once two rounds in a row had cos >= tau."""
    momentum = StartMomentum(0.5, steady=0.9)
    z = [[np.array([float(k), 0.0])] for k in range(4)]  # steps (1, 0) each round
    momentum.step(z[0], z[1])  # no d_{k-1} yet: not steady
    assert momentum.streak == 0 and momentum.start(z[1]) is z[1]
    momentum.step(z[1], z[2])  # cos 1: one steady round, the gate still shut
    assert momentum.streak == 1 and momentum.start(z[2]) is z[2]
    momentum.step(z[2], z[3])
    assert momentum.streak == STEADY_ROUNDS == 2
    np.testing.assert_array_equal(momentum.start(z[3])[0], [3.5, 0.0])  # 3 + 0.5 (3 - 2)
    # x = (3.5, 0); z' = (4.5, 0.6): d = (1, 0.6), d_prev = (1, 0), cos 0.857 < 0.9
    turn = [np.array([4.5, 0.6])]
    assert momentum.step(z[3], turn) is False  # along the momentum: no restart
    assert momentum.streak == 3 and momentum.open  # the open gate holds
    x = momentum.start(turn)[0]
    np.testing.assert_allclose(x, [5.25, 0.9], rtol=0, atol=1e-15)  # turn + 0.5 (turn - z3)
    # z'' = (4.6, 0.6): (z'' - x) . (z'' - turn) = (-0.65, -0.3) . (0.1, 0) < 0
    back = [np.array([4.6, 0.6])]
    assert momentum.step(turn, back) is True
    assert momentum.streak == 0 and momentum.start(back) is back  # shut: two steady rounds again


def test_a_round_without_every_client_or_with_a_stock_reply_closes_the_gate() -> None:
    momentum = StartMomentum(0.5, steady=0.9)
    z = [[np.array([float(k)])] for k in range(6)]
    for k in range(3):
        momentum.step(z[k], z[k + 1])
    assert momentum.open
    momentum.step(z[3], z[4], every_client=False)  # 3 of 10 replied: not counted
    assert momentum.streak == 0 and momentum.start(z[4]) is z[4]
    momentum.step(z[4], z[5])  # cos 1 against the partial round's step: one round again
    assert momentum.streak == 1
    momentum.streak = STEADY_ROUNDS
    momentum.pause()  # a stock FedProx handler replied (ConsensusADMM.reset_duals)
    assert not momentum.open and momentum.start(z[5]) is z[5]


def test_without_a_gate_it_is_the_restart_test_alone() -> None:
    momentum = StartMomentum(0.5, steady=None)
    z0, z1 = [np.array([0.0])], [np.array([2.0])]
    momentum.step(z0, z1, every_client=False)
    np.testing.assert_array_equal(momentum.start(z1)[0], [3.0])  # at once, partial or not
    assert momentum.last_step is None and momentum.streak == 0  # nothing kept for a gate


def two_client_core(beta: float, steady: float | None = 0.9) -> ConsensusADMM:
    settings = strategy_settings(
        Linearized(momentum=beta, steady=steady),
        {"rho": None, "proximal_mu": None, "rho_schedule": None},
        regularizer=None,
        eps_abs=1e-6,
        eps_rel=1e-4,
        relaxation=None,
        z_average="cached",
        dual_step=None,
        channel={},
    )
    return settings.new_admm([np.zeros(2)])


def run_quadratic(admm: ConsensusADMM, rounds: int) -> list[np.ndarray]:
    """Two clients, f_i = 1/2 ||w - c_i||^2, K = 4 gradient steps of lr 0.25 from the start."""
    centers = {"a": np.array([1.0, -1.0]), "b": np.array([3.0, 1.0])}
    zs = []
    for server_round in range(1, rounds + 1):
        x = admm.start_point()[0]
        replies = []
        for key, c in centers.items():
            record = admm.records.get(key)
            y = np.zeros(2) if record is None else record.y[0]
            w = x.copy()
            for _ in range(4):
                w = w - 0.25 * ((w - c) + y)
            replies.append(Reply(key, [w], 1, None, None, 1.0 / (4 * 0.25)))
        admm.step(replies, server_round)
        zs.append(admm.z[0].copy())
    return zs


def test_the_fixed_point_is_the_pooled_optimum_with_and_without_momentum() -> None:
    for beta in (0.0, 0.7):
        zs = run_quadratic(two_client_core(beta), 60)
        np.testing.assert_allclose(zs[-1], [2.0, 0.0], atol=1e-10)  # the mean of the c_i


@pytest.mark.parametrize("steady", [None, 0.9])
def test_a_checkpoint_restores_the_momentum_bit_for_bit(steady: float | None) -> None:
    expected = run_quadratic(two_client_core(0.7, steady), 10)
    held, streaks = [], []
    for split in range(1, 8):  # rounds right after a restart (no z_prev) and others
        first = two_client_core(0.7, steady)
        run_quadratic(first, split)
        arrays, meta = first.state_dict()
        assert meta["start_momentum"]["beta"] == 0.7
        held.append("momentum.previous.0" in arrays)
        streaks.append(meta["start_momentum"]["streak"])
        resumed = two_client_core(0.7, steady)
        resumed.load_state_dict({k: np.array(v) for k, v in arrays.items()}, meta)
        np.testing.assert_array_equal(resumed.start_point()[0], first.start_point()[0])
        rest = run_quadratic(resumed, 10 - split)
        np.testing.assert_array_equal(np.array(rest), np.array(expected[split:]))
    assert any(held) and not all(held)  # both cases were checkpointed
    if steady is not None:  # a shut gate and an open one were checkpointed
        assert min(streaks) < STEADY_ROUNDS <= max(streaks)
    assert two_client_core(0.7, steady).momentum is not None


def test_settings_name_the_field() -> None:
    with pytest.raises(ValueError, match=r"^momentum: must be a number in \[0, 1\), got 1"):
        Linearized(momentum=1)
    with pytest.raises(ValueError, match=r"^dual_step: "):
        Linearized(dual_step=0.0)
    with pytest.raises(ValueError, match=r"^start_momentum: "):
        ConsensusADMM([np.zeros(1)], 1.0, start_momentum=-0.1)
    with pytest.raises(ValueError, match=r"^steady: must be None or a number in \(-1, 1\), got 1"):
        Linearized(steady=1)
    with pytest.raises(ValueError, match=r"^start_steady: "):
        ConsensusADMM([np.zeros(1)], 1.0, start_momentum=0.5, start_steady=True)
    assert Linearized().momentum is None and Linearized().steady == 0.9  # the strategy's beta
    assert SCAFFNEW == Linearized(momentum=0.0, dual_step=1.0)
    described = two_client_core(0.7)
    assert described.momentum is not None and described.momentum.beta == 0.7
