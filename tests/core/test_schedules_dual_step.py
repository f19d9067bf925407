"""The adaptive dual step (flwr_admm.core.schedules) against a plain numpy loop.

The reference below is written from the module's equations, not from its code: the
z-step z' = sum_i p_i (rho_i w_i + y_i) / sum_i p_i rho_i over every client, the
alignment c_k of the replies' residuals with their duals before the step, the dual
step with this round's gamma, then gamma_{k+1} = clip(gamma_k exp(rate (c_k -
threshold)), floor, 1).
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from flwr_admm.core.consensus import ConsensusADMM
from flwr_admm.core.schedules import AdaptiveDualStep, check_dual_step_spec
from flwr_admm.core.settings import ConsensusSettings
from flwr_admm.core.steps import dual_step
from flwr_admm.core.sums import RunningSums
from flwr_admm.core.types import ClientRecord, Reply

D, CLIENTS, ROUNDS = 3, 4, 8


def replies_of(round_index: int) -> list[tuple[str, np.ndarray, int, float]]:
    """Seeded w_i, n_i and s_i: keys, models, sizes, per-client rho scale.

    The same replies for four rounds at a time: the residuals keep their direction, so
    the rule moves gamma, until the replies change.
    """
    rng = np.random.default_rng(round_index // 4)
    return [(str(i), rng.normal(size=D) + i, 10 + 5 * i, 0.5 + 0.25 * i) for i in range(CLIENTS)]


def reference(rule: AdaptiveDualStep, rho: float) -> tuple[list[np.ndarray], list[float]]:
    """Return the z and the gamma of every round, by the module's equations."""
    y = {str(i): np.zeros(D) for i in range(CLIENTS)}
    gamma, zs, gammas = rule.floor, [], []
    for k in range(ROUNDS):
        got = replies_of(k)
        total = sum(n for _, _, n, _ in got)
        p = {key: n / total for key, _, n, _ in got}
        rho_i = {key: rho * s for key, _, _, s in got}
        w = {key: w_i for key, w_i, _, _ in got}
        z = sum(p[i] * (rho_i[i] * w[i] + y[i]) for i in w) / sum(p[i] * rho_i[i] for i in w)
        along = sum(p[i] * rho_i[i] * (w[i] - z) @ y[i] for i in w)
        res = sum(p[i] * rho_i[i] ** 2 * (w[i] - z) @ (w[i] - z) for i in w)
        dual = sum(p[i] * y[i] @ y[i] for i in w)
        c = None if res == 0 or dual == 0 else along / math.sqrt(res * dual)
        for i in w:
            y[i] = y[i] + gamma * rho_i[i] * (w[i] - z)
        gammas.append(gamma)
        if c is not None:
            gamma = min(1.0, max(rule.floor, gamma * math.exp(rule.rate * (c - rule.threshold))))
        zs.append(z)
    return zs, gammas


@pytest.mark.parametrize(
    "rule", [AdaptiveDualStep(), AdaptiveDualStep(floor=0.1, threshold=-0.5, rate=3.0)]
)
def test_the_core_follows_the_reference_loop(rule: AdaptiveDualStep) -> None:
    """Eight rounds with per-client rho_i: z and the gamma each round used, to 1e-12."""
    rho = 2.0
    admm = ConsensusADMM([np.zeros(D)], rho, client_rho="reported", dual_step=rule)
    zs, gammas = reference(rule, rho)
    for k in range(ROUNDS):
        assert admm.gamma == pytest.approx(gammas[k], rel=1e-12, abs=0)
        replies = [Reply(key, [w], n, scale=s) for key, w, n, s in replies_of(k)]
        report = admm.step(replies, k + 1)
        assert report.dual_step == pytest.approx(gammas[k], rel=1e-12, abs=0)  # this round's
        np.testing.assert_allclose(admm.z[0], zs[k], rtol=1e-12, atol=1e-13)
    assert max(gammas) > rule.floor  # the rule moved gamma (not a constant run)


def test_a_number_is_the_fixed_step_and_gamma_is_it() -> None:
    admm = ConsensusADMM([np.zeros(D)], 1.0, dual_step=0.5)
    for k in range(3):
        admm.step([Reply(key, [w], n) for key, w, n, _ in replies_of(k)], k + 1)
        assert admm.gamma == 0.5


def test_next_by_hand() -> None:
    rule = AdaptiveDualStep()  # floor 0.2, threshold 0.7, rate 1
    assert rule.next(0.2, 0.9) == pytest.approx(0.2 * math.exp(0.2))
    assert rule.next(0.2, 0.1) == 0.2  # held at the floor
    assert rule.next(0.9, 1.0) == 1.0  # held at 1
    assert rule.next(0.5, None) == 0.5  # no alignment (first round): unchanged


def alignment(
    replies: list[Reply], records: dict[str, ClientRecord], z: list[np.ndarray], rho: float
) -> float | None:
    """c_k as the dual step's pass returns it (on copies: the step updates y_i)."""
    copies = {
        k: ClientRecord(r.w, [y.copy() for y in r.y], r.num_examples, r.scale)
        for k, r in records.items()
    }
    sums = RunningSums([np.zeros_like(t) for t in z], [np.zeros_like(t) for t in z])
    shares = [np.zeros_like(t) for t in z]
    stats = dual_step(
        replies,
        copies,
        z,
        None,
        sums,
        shares,
        1.0,
        rho=rho,
        relaxation=1.0,
        gamma=0.5,
        aligned=True,
    )
    return stats.c


def test_alignment_by_hand() -> None:
    """Two clients, p = (1/4, 3/4), rho_i = (1, 2): c from the formula written out."""
    records = {
        "a": ClientRecord([np.array([1.0, 0.0])], [np.array([1.0, 1.0])], 1, 1.0),
        "b": ClientRecord([np.array([0.0, 2.0])], [np.array([0.0, -1.0])], 3, 2.0),
    }
    z = [np.array([0.0, 1.0])]
    # d_a = (1, -1), d_b = (0, 1); along = 1/4*1*0 + 3/4*2*(-1) = -1.5
    # res = 1/4*1*2 + 3/4*4*1 = 3.5; dual = 1/4*2 + 3/4*1 = 1.25 (y_i before the step)
    got = alignment([Reply("a", [], 1), Reply("b", [], 3)], records, z, rho=1.0)
    assert got == pytest.approx(-1.5 / math.sqrt(3.5 * 1.25))
    zero_duals = {
        k: ClientRecord(r.w, [np.zeros(2)], r.num_examples, r.scale) for k, r in records.items()
    }
    assert alignment([Reply("a", [], 1)], zero_duals, z, rho=1.0) is None
    assert alignment([Reply("a", [], 1)], records, z, rho=0.0) is None


def test_no_alignment_unless_asked() -> None:
    record = ClientRecord([np.ones(2)], [np.ones(2)], 1, 1.0)
    sums = RunningSums([np.zeros(2)], [np.zeros(2)])
    stats = dual_step(
        [Reply("a", [], 1)],
        {"a": record},
        [np.zeros(2)],
        None,
        sums,
        [np.zeros(2)],
        1.0,
        rho=1.0,
        relaxation=1.0,
    )
    assert stats.c is None


def test_checkpoints_hold_gamma() -> None:
    rule = AdaptiveDualStep(threshold=-0.9)  # grows every round
    admm = ConsensusADMM([np.zeros(D)], 1.0, dual_step=rule)
    for k in range(4):
        admm.step([Reply(key, [w], n) for key, w, n, _ in replies_of(k)], k + 1)
    assert admm.gamma > rule.floor
    arrays, meta = admm.state_dict()
    restored = ConsensusADMM([np.zeros(D)], 1.0, dual_step=rule)
    restored.load_state_dict({k: np.array(v) for k, v in arrays.items()}, dict(meta))
    assert restored.gamma == admm.gamma
    replies = [Reply(key, [w], n) for key, w, n, _ in replies_of(9)]
    admm.step(replies, 5)
    restored.step(replies, 5)
    np.testing.assert_array_equal(restored.z[0], admm.z[0])
    del meta["gamma"]
    with pytest.raises(ValueError, match="gamma"):
        ConsensusADMM([np.zeros(D)], 1.0, dual_step=rule).load_state_dict(arrays, meta)


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"floor": 0.0}, "floor"),
        ({"floor": 1.5}, "floor"),
        ({"threshold": 1.0}, "threshold"),
        ({"threshold": "high"}, "threshold"),
        ({"rate": 0.0}, "rate"),
        ({"rate": float("inf")}, "rate"),
    ],
)
def test_bad_rules_name_the_field(kwargs: dict[str, object], field: str) -> None:
    with pytest.raises(ValueError, match=field):
        AdaptiveDualStep(**kwargs)  # type: ignore[arg-type]


@pytest.mark.parametrize("value", [0, 1.5, True, "adaptive", None])
def test_bad_dual_steps_name_the_keyword(value: object) -> None:
    with pytest.raises(ValueError, match=r"dual_step.*AdaptiveDualStep"):
        check_dual_step_spec(value)


def test_settings_fingerprint_the_rule() -> None:
    described = ConsensusSettings(dual_step=AdaptiveDualStep()).describe()
    assert described["dual_step"] == {"adaptive": {"floor": 0.2, "threshold": 0.7, "rate": 1.0}}
    assert "dual_step" not in ConsensusSettings().describe()  # gamma = 1: as before


def test_noisy_replies_keep_the_floor_and_steady_ones_reach_one() -> None:
    """Replies that are fresh noise each round (a minibatch solve around consensus) hold
    gamma at 0.2; replies that pull the same way every round (a deterministic solve
    away from consensus) raise it to 1. A model of 1,000 parameters."""
    rng, dim = np.random.default_rng(0), 1000
    noisy = ConsensusADMM([np.zeros(dim)], 1.0, dual_step=AdaptiveDualStep())
    steady = ConsensusADMM([np.zeros(dim)], 1.0, dual_step=AdaptiveDualStep())
    pulls = [rng.normal(size=dim) for _ in range(CLIENTS)]
    for k in range(20):
        noisy.step([Reply(str(i), [rng.normal(size=dim)], 10) for i in range(CLIENTS)], k + 1)
        steady.step([Reply(str(i), [pulls[i]], 10) for i in range(CLIENTS)], k + 1)
        assert noisy.gamma == 0.2
    assert steady.gamma == 1.0
