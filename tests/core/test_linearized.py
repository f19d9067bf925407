"""The core of the linearized form: rho_i = rho s_i from each reply (client_rho="reported")."""

from __future__ import annotations

import numpy as np
import pytest

from flwr_admm.core import ConsensusADMM
from flwr_admm.core.linearized import budget_scale, check_form
from flwr_admm.core.types import Reply


def test_a_hand_computed_round_with_reported_scales():
    # z = 0; A: n=1, b=0.5 (rho 2), w=[1, 0]; B: n=3, b=2 (rho 0.5), w=[0, 2]
    admm = ConsensusADMM([np.zeros(2)], rho=1.0, client_rho="reported")
    replies = [
        Reply("a", [np.array([1.0, 0.0])], 1, scale=2.0),
        Reply("b", [np.array([0.0, 2.0])], 3, scale=0.5),
    ]
    admm.step(replies, 1)
    # z' = (1*2*[1,0] + 3*0.5*[0,2]) / (2 + 1.5) = [2, 3] / 3.5
    z = np.array([2.0, 3.0]) / 3.5
    np.testing.assert_allclose(admm.z[0], z, rtol=1e-15)
    np.testing.assert_allclose(admm.records["a"].y[0], 2.0 * (replies[0].w[0] - z), rtol=1e-15)
    np.testing.assert_allclose(admm.records["b"].y[0], 0.5 * (replies[1].w[0] - z), rtol=1e-15)
    total = admm.records["a"].y[0] + 3 * admm.records["b"].y[0]
    np.testing.assert_allclose(total, 0.0, atol=1e-15)  # sum_i n_i y_i stays 0
    assert admm.rho_for("a") == 2.0 and admm.rho_for("b") == 0.5


def test_a_reply_without_its_scale_is_refused_naming_it_and_changes_nothing():
    admm = ConsensusADMM([np.zeros(2)], rho=1.0, client_rho="reported")
    with pytest.raises(ValueError, match=r"^reply 'a': scale: must be a finite number > 0"):
        admm.step([Reply("a", [np.ones(2)], 1)], 1)
    assert admm.records == {}


@pytest.mark.parametrize("value", [0.0, -1.0, float("nan"), float("inf"), True, "1", 1e-320])
def test_a_bad_budget_is_a_problem_naming_the_metric(value):
    scale, problem = budget_scale({"admm-step-budget": value})
    assert scale is None and problem.startswith("admm-step-budget: must be a finite number > 0")
    assert budget_scale({})[1].startswith("no 'admm-step-budget'")
    assert budget_scale({"admm-step-budget": 4})[0] == 0.25


def test_check_form():
    assert check_form("prox") == "prox" and check_form("linearized") == "linearized"
    with pytest.raises(ValueError, match=r"^form: must be one of \['prox', 'linearized'\]"):
        check_form("scaffnew")
