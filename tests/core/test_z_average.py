"""`z_average="replies"`: the z-step averages this round's replies only.

By hand in one dimension, against the textbook step when every client replies, and
at the pooled optimum (closed-form ridge) under partial participation, with
over-relaxation, per-client rho, a server regularizer and the strategy defaults.
"""

from __future__ import annotations

import numpy as np
import pytest
from consensus_reference import clients, pooled_ridge, rel, ridge_round

from flwr_admm import serverapp as message_api
from flwr_admm.core import ConsensusADMM, ResidualBalancing
from flwr_admm.core.regularizers import L2
from flwr_admm.core.settings import ConsensusSettings
from flwr_admm.core.types import Reply
from flwr_admm.server import FedADMM


def test_one_partial_round_by_hand() -> None:
    # rho = 2, alpha = 1.5. Round 1 from z = 0, a (n = 1) and b (n = 3) reply w = 1, 5:
    # w^ = (1.5, 7.5), z1 = (1.5 + 3 * 7.5) / 4 = 6, y_a = 2 (1.5 - 6) = -9, y_b = 3.
    admm = ConsensusADMM(z=[np.array([0.0])], rho=2.0, relaxation=1.5, z_average="replies")
    admm.step([Reply("a", [np.array([1.0])], 1), Reply("b", [np.array([5.0])], 3)], 1)
    assert admm.z[0][0] == 6.0
    # Round 2: a (w = 3) and the new c (n = 2, w = 0) reply; b does not. Around z1 = 6:
    # w^_a = 4.5 - 3 = 1.5, w^_c = -3; S_y = -9 + 3 * 3 + 0 = 0, so
    # z2 = (1 * 1.5 + 2 * (-3)) / 3 = -1.5 (the textbook step, with b's stale w_b = 5,
    # would give (18 - (1 - 1.5)(3 - 3 * 6)) / 6 = 1.75).
    admm.step([Reply("a", [np.array([3.0])], 1), Reply("c", [np.array([0.0])], 2)], 2)
    assert admm.z[0][0] == pytest.approx(-1.5, rel=1e-15)
    # y_a = -9 + 2 (1.5 + 1.5) = -3, y_c = 2 (-3 + 1.5) = -3, y_b unchanged at 3
    assert admm.records["a"].y[0][0] == pytest.approx(-3.0, rel=1e-15)
    assert admm.records["c"].y[0][0] == pytest.approx(-3.0, rel=1e-15)
    assert admm.records["b"].y[0][0] == 3.0
    assert admm.sums.ny[0][0] == pytest.approx(0.0, abs=1e-15)  # S_y = sum n_i y_i


def test_with_every_client_replying_it_is_the_textbook_step() -> None:
    data = clients([20, 35, 50], d=3, seed=4)
    runs = []
    for z_average in ("cached", "replies"):
        admm = ConsensusADMM(z=[np.zeros(3)], rho=0.7, relaxation=1.6, z_average=z_average)
        for k in range(1, 6):
            ridge_round(admm, data, 0.05, ["c0", "c1", "c2"], k)
        runs.append(admm.z[0])
    np.testing.assert_array_equal(runs[0], runs[1])


@pytest.mark.parametrize(
    ("alpha", "strength"),
    [(1.0, 0.0), (1.7, 0.0), (1.0, 0.3)],
    ids=["plain", "relaxed", "server-L2"],
)
def test_partial_participation_reaches_the_pooled_ridge(alpha: float, strength: float) -> None:
    lam, sizes = 0.05, [15, 40, 25, 60]
    data = clients(sizes, d=3, seed=2)
    # g = strength/2 ||z||^2 adds to the local ridge lam: the pooled ridge at lam + strength
    optimum = pooled_ridge(data, lam + strength)
    regularizer = L2(strength) if strength else None
    admm = ConsensusADMM(
        z=[np.zeros(3)],
        rho=5.0,
        relaxation=alpha,
        regularizer=regularizer,
        z_average="replies",
    )
    rng = np.random.default_rng(3)
    ridge_round(admm, data, lam, ["c0", "c1", "c2", "c3"], 1)
    for k in range(2, 800):
        keys = [f"c{i}" for i in sorted(rng.choice(4, size=2, replace=False))]
        ridge_round(admm, data, lam, keys, k)
        if rel(admm.z[0], optimum) < 1e-10:
            break
    assert rel(admm.z[0], optimum) < 1e-9
    s_y = sum(r.num_examples * r.y[0] for r in admm.records.values())
    np.testing.assert_allclose(admm.sums.ny[0], s_y, rtol=1e-9, atol=1e-9)


def test_rb_relaxed_with_replies_reaches_the_pooled_ridge() -> None:
    lam = 0.05
    data = clients([15, 40, 25, 60, 30], d=3, seed=5)
    optimum = pooled_ridge(data, lam)
    settings = ConsensusSettings(
        rho=1.0,
        rho_schedule=ResidualBalancing(),
        relaxation=1.6,
        z_average="replies",
    )
    admm = settings.new_admm([np.zeros(3)])
    rng = np.random.default_rng(7)
    ridge_round(admm, data, lam, [f"c{i}" for i in range(5)], 1)
    for k in range(2, 1500):
        keys = [f"c{i}" for i in sorted(rng.choice(5, size=2, replace=False))]
        ridge_round(admm, data, lam, keys, k)
        if rel(admm.z[0], optimum) < 1e-10:
            break
    assert rel(admm.z[0], optimum) < 1e-9


@pytest.mark.parametrize("value", ["all", "", None, 1])
def test_other_values_are_refused_naming_the_field(value: object) -> None:
    message = r"^z_average: must be one of \['cached', 'replies'\]"
    with pytest.raises(ValueError, match=message):
        ConsensusADMM(z=[np.zeros(2)], rho=1.0, z_average=value)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=message):
        ConsensusSettings(z_average=value)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=message):
        FedADMM(z_average=value)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=message):
        message_api.FedADMM(z_average=value)  # type: ignore[arg-type]


def test_the_option_is_fingerprinted_only_when_set() -> None:
    assert "z_average" not in FedADMM().configuration()  # old checkpoints keep loading
    legacy, message = FedADMM(z_average="replies"), message_api.FedADMM(z_average="replies")
    assert legacy.configuration()["z_average"] == "replies"
    assert message.configuration()["z_average"] == "replies"
    assert legacy.fingerprint() != FedADMM().fingerprint()
    assert legacy.admm_settings.new_admm([np.zeros(1)]).z_average == "replies"
