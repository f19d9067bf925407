"""The client's half of client-held duals (`flwr_admm.core.client_duals`), by hand."""

from __future__ import annotations

import numpy as np
import pytest

from flwr_admm.core.client_duals import (
    DualState,
    acknowledged,
    dual_step_of,
    start_round,
)
from flwr_admm.protocol import DUAL_STEP

W = [np.array([1.0, -2.0]), np.array(3.0)]
U = [np.array([0.5, 0.5]), np.array(-1.0)]
Z = [np.array([0.0, 1.0]), np.array(2.0)]


def test_the_dual_step_scales_the_update_and_the_center_follows() -> None:
    state = DualState(W, U, num_examples=4, server_round=3)
    start = start_round(state, Z, dual_step=0.25)
    # u_i + gamma (w_i - z): [0.5 + 0.25, 0.5 - 0.75], -1 + 0.25
    np.testing.assert_array_equal(start.dual[0], [0.75, -0.25])
    np.testing.assert_array_equal(start.dual[1], -0.75)
    np.testing.assert_array_equal(start.center[0], [-0.75, 1.25])  # z - u_i
    assert start.delayed_sq_residual == 1.0 + 9.0 + 1.0  # ||w_i - z||^2, not damped


def test_the_textbook_step_is_the_plain_sum() -> None:
    state = DualState(W, U, num_examples=4, server_round=3)
    start = start_round(state, Z)
    for got, u, w, z in zip(start.dual, U, W, Z, strict=True):
        np.testing.assert_array_equal(got, u + (w - z))


def test_the_alignment_terms_are_those_of_the_step_before_it_is_taken() -> None:
    """<w_i - z, u_i>, ||w_i - z||^2, ||u_i||^2 with u_i before the step; under the
    linearized form (a kept budget b_i) each times rho_i^2 = 1 / b_i^2."""
    # w - z = [1, -3], 1; u = [0.5, 0.5], -1
    along, residual, dual = 0.5 - 1.5 - 1.0, 1.0 + 9.0 + 1.0, 0.25 + 0.25 + 1.0
    prox = start_round(DualState(W, U, num_examples=4, server_round=3), Z, dual_step=0.25)
    assert prox.alignment == (along, residual, dual)
    linear = start_round(DualState(W, U, 4, 3, budget=2.0), Z, dual_step=0.25)
    assert linear.alignment == (along / 4, residual / 4, dual / 4)
    assert start_round(None, Z).alignment is None  # nothing before: no step


def test_a_new_client_starts_at_z_with_a_zero_dual() -> None:
    start = start_round(None, Z, dual_step=0.2)
    assert all(not t.any() for t in start.dual)
    assert start.delayed_sq_residual is None


@pytest.mark.parametrize(
    ("config", "gamma"), [({}, 1.0), ({DUAL_STEP: 0.2}, 0.2), ({DUAL_STEP: 1}, 1.0)]
)
def test_the_dual_step_is_read_from_the_config(config: dict[str, object], gamma: float) -> None:
    assert dual_step_of(config) == gamma


@pytest.mark.parametrize("value", [0.0, -0.1, 1.5, True, "0.2", float("nan")])
def test_a_bad_dual_step_names_the_key(value: object) -> None:
    with pytest.raises(ValueError, match=DUAL_STEP):
        dual_step_of({DUAL_STEP: value})


def _state(server_round: int) -> DualState:
    return DualState([np.zeros(2)], [np.zeros(2)], 10, server_round)


def test_the_acknowledgement_picks_the_state_s_holds() -> None:
    committed, pending = _state(2), _state(3)
    assert acknowledged(committed, pending, 3).state is pending  # used: commit
    assert acknowledged(committed, pending, 2).state is committed  # not used: retry
    for ack, resync in ((0, False), (5, True)):  # S holds none / a state it lost
        chosen = acknowledged(committed, pending, ack)
        assert chosen.state is None and chosen.resync is resync
    assert acknowledged(None, None, 4).resync
    assert acknowledged(committed, pending, None).state is pending  # no ack: as before
    assert acknowledged(committed, None, None).state is committed
