"""The server's offer of a kept share (``admm-restore``): when it is made, what it holds.

A key's share sigma_i is known to the server after a resync (its full contribution);
the server offers c_i = sigma_i / n_i back with the acknowledgement, only where c_i is
the client's whole state (prox form, gamma = 1, no fast ADMM, no uplink residual), and
accepts ``admm-restored`` = 1 only from a key it made the offer to.
"""

from __future__ import annotations

import io
from typing import Any

import numpy as np
import pytest

from flwr_admm.core.client_duals import (
    DualState,
    acknowledged,
    contribution_change,
    restored_state,
    start_round,
)
from flwr_admm.protocol import (
    ACK_ROUND,
    DELAYED_SQ_RESIDUAL,
    EXAMPLES_CHANGE,
    PREVIOUS_ROUND,
    RESTORE,
    RESTORE_EXAMPLES,
    RESTORED,
    RESYNC,
    U_SQ_NORM,
    W_SQ_NORM,
)
from flwr_admm.rounds.client_duals_state import ClientDualsState

KEY = "partition-id:0"
Z = [np.array([1.0, -2.0]), np.array([0.5])]


def state(**kwargs: Any) -> ClientDualsState:
    made = ClientDualsState(
        rho=0.1,
        regularizer=None,
        eps_abs=1e-6,
        eps_rel=1e-4,
        **kwargs,
    )
    made.adopt([t.copy() for t in Z])
    return made


def metrics(previous: int, change: int) -> dict[str, Any]:
    return {PREVIOUS_ROUND: previous, EXAMPLES_CHANGE: change, W_SQ_NORM: 1.0, U_SQ_NORM: 0.0}


def fold(
    made: ClientDualsState, key: str, change: list[np.ndarray], n: int, k: int, **m: Any
) -> bool:
    reported = {**metrics(m.pop("previous", 0), m.pop("delta_n", n)), **m}
    assert made.problem(key, reported, n) is None, made.problem(key, reported, n)
    return made.fold(key, change, None, n, k, reported, full=reported[PREVIOUS_ROUND] == 0)


def resynced(made: ClientDualsState) -> list[np.ndarray]:
    """Round 1: KEY joins; round 2: KEY resyncs with F = 4 * c, c = (3, 1 | -1)."""
    fold(made, KEY, [np.ones(2), np.ones(1)], 4, 1)
    share = [np.array([12.0, 4.0]), np.array([-4.0])]
    assert fold(made, KEY, share, 4, 2, **{RESYNC: 1})  # a resync: kept in K
    made.end_sweep()  # KEY's full share rebuilt S: the sweep is over
    assert not made.sweep.active
    return share


def decoded(payload: bytes) -> np.ndarray:
    return np.load(io.BytesIO(payload), allow_pickle=False)


def test_a_resynced_key_is_offered_its_share_over_n() -> None:
    made = state()
    resynced(made)
    sent = made.instructions(KEY)
    assert sent[ACK_ROUND] == 2 and sent[RESTORE_EXAMPLES] == 4
    np.testing.assert_array_equal(decoded(sent[RESTORE]), [3.0, 1.0, -1.0])  # type: ignore[arg-type]
    assert RESTORE not in made.instructions("partition-id:9")  # unknown key: nothing
    fold(made, "partition-id:1", [np.ones(2), np.ones(1)], 2, 2)  # a steady key: no offer
    assert RESTORE not in made.instructions("partition-id:1")


@pytest.mark.parametrize(
    "settings",
    [{"dual_step": 0.5}, {"restores": False}],
    ids=["dual_step", "uplink_or_linearized"],
)
def test_no_offer_where_c_i_is_not_the_whole_state(settings: dict[str, Any]) -> None:
    made = state(**settings)
    resynced(made)
    assert made.sweep.known and RESTORE not in made.instructions(KEY)


def test_a_restored_reply_keeps_the_share_exact_and_offered() -> None:
    made = state()
    share = resynced(made)
    change = [np.array([1.0, 1.0]), np.array([2.0])]
    fold(made, KEY, change, 4, 3, previous=2, delta_n=0, **{RESTORED: 1})
    expected = [s + c for s, c in zip(share, change, strict=True)]
    for kept, want in zip(made.sweep.known[KEY], expected, strict=True):
        np.testing.assert_array_equal(kept, want)
    assert made.instructions(KEY)[ACK_ROUND] == 3 and RESTORE in made.instructions(KEY)
    # a steady reply (the node kept its state): the key leaves K, no more offers
    fold(made, KEY, change, 4, 4, previous=3, delta_n=0, **{DELAYED_SQ_RESIDUAL: 0.1})
    assert KEY not in made.sweep.known and RESTORE not in made.instructions(KEY)


def test_restored_claims_the_server_never_offered_are_refused() -> None:
    made = state()
    fold(made, KEY, [np.ones(2), np.ones(1)], 4, 1)  # steady key: no offer
    claims = {
        "never offered": metrics(1, 0) | {RESTORED: 1},
        "full contribution": metrics(0, 4) | {RESTORED: 1},
        "not 0 or 1": metrics(1, 0) | {RESTORED: 2, DELAYED_SQ_RESIDUAL: 0.1},
    }
    for why, claim in claims.items():
        report = made.problem(KEY, claim, 4)
        assert report is not None, why
    resynced(made)
    with_d2 = metrics(2, 0) | {RESTORED: 1, DELAYED_SQ_RESIDUAL: 0.1}
    report = made.problem(KEY, with_d2, 4)
    assert report is not None and DELAYED_SQ_RESIDUAL in report[0]
    assert made.problem(KEY, metrics(2, 0) | {RESTORED: 1}, 4) is None
    assert made.problem(KEY, metrics(2, 0) | {RESTORED: 1}, 4, secure=True) is not None


def test_the_stand_in_state_gives_the_lost_states_dual_and_change() -> None:
    """u + (w - z) = c - z: the stand-in (w = c, u = 0) and the lost state agree."""
    rng = np.random.default_rng(0)
    w, u = [rng.normal(size=3)], [rng.normal(size=3)]
    lost = DualState(w, u, 7, 4)
    buffer = io.BytesIO()
    np.save(buffer, (w[0] + u[0]), allow_pickle=False)
    config = {RESTORE: buffer.getvalue(), RESTORE_EXAMPLES: 7}
    stand_in = restored_state(config, [np.zeros(3)], 4)
    base = acknowledged(None, None, 4, stand_in)
    assert base.restored and not base.resync and base.state is stand_in
    assert acknowledged(lost, None, 4, stand_in).state is lost  # its own state first
    z = [rng.normal(size=3)]
    a, b = start_round(lost, z), start_round(stand_in, z)
    np.testing.assert_allclose(a.dual[0], b.dual[0], rtol=1e-15, atol=1e-15)
    np.testing.assert_allclose(a.center[0], b.center[0], rtol=1e-15, atol=1e-15)
    w2 = [rng.normal(size=3)]
    np.testing.assert_allclose(
        contribution_change(lost, w2, a.dual, 7)[0],
        contribution_change(stand_in, w2, b.dual, 7)[0],
        rtol=1e-13,
        atol=1e-13,
    )
    with pytest.raises(ValueError, match="acknowledged round"):
        restored_state(config, [np.zeros(3)], 0)
