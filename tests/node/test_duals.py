"""A node's client-held-dual round (`flwr_admm.node.duals`), run by `ADMMClient`.

The server acknowledges, in every fit config, the round whose contribution S holds
for the client (``admm-ack-round``). The client keeps its committed state next to the
pending one, so a reply the server never used is retried from the committed state,
and a client whose state is gone resynchronizes with a full contribution. Expected
values come from a second client that never saw the unused round, or from the
arithmetic of the protocol (Delta = n (w' + u'), sigma = n c - e), never from the
code under test.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from flower_run import D, seed_data, seed_model
from flwr.common import Context, RecordDict, Scalar

from flwr_admm.client import ADMMClient
from flwr_admm.node.records import load_states
from flwr_admm.uplink import StochasticQuantizer
from flwr_admm.uplink.wire import ndarray_view

BASE: dict[str, Scalar] = {"rho": 0.1, "admm-duals": "client", "local_steps": 5}
EIGHT_BITS = StochasticQuantizer(bits=8).config()


def _context() -> Context:
    return Context(
        run_id=0, node_id=1, node_config={"partition-id": 0}, state=RecordDict(), run_config={}
    )


def _client(context: Context | None) -> ADMMClient:
    data = seed_data()
    return ADMMClient(seed_model(), data.X[0], data.y[0], context=context, learning_rate=0.5)


def _fit(
    context: Context | None, z: float, server_round: int, ack: int | None, **extra: Any
) -> tuple[ADMMClient, list[np.ndarray], dict[str, Scalar]]:
    client = _client(context)
    config = {**BASE, "server_round": server_round, **extra}
    if ack is not None:
        config["admm-ack-round"] = ack
    arrays, _, metrics = client.fit([np.full(D, z)], config)
    return client, arrays, metrics


@pytest.mark.parametrize("uplink", [{}, EIGHT_BITS], ids=["float64", "8-bit"])
def test_an_unused_reply_is_retried_from_the_committed_state(uplink: dict[str, Any]) -> None:
    lossy, steady = _context(), _context()
    for context in (lossy, steady):
        _fit(context, 0.0, 1, ack=0, **uplink)
    _fit(lossy, 0.3, 2, ack=1, **uplink)  # trained, saved, but the server never used it
    retried, arrays, metrics = _fit(lossy, 0.5, 3, ack=1, **uplink)
    expected, arrays_steady, metrics_steady = _fit(steady, 0.5, 3, ack=1, **uplink)
    assert metrics["admm-previous-round"] == 1 and metrics == metrics_steady
    np.testing.assert_array_equal(arrays[0], arrays_steady[0])
    if uplink:  # the same payload: the residual e_i of round 1 was used, not round 2's
        assert retried.uplink_payload is not None and expected.uplink_payload is not None
        assert retried.uplink_payload.tensors == expected.uplink_payload.tensors
    kept = load_states(lossy.state, [(D,)])
    assert kept.committed is not None and kept.committed.server_round == 1
    assert kept.pending is not None and kept.pending.server_round == 3


def test_a_used_reply_is_committed() -> None:
    context = _context()
    _fit(context, 0.0, 1, ack=0)
    _, _, metrics = _fit(context, 0.3, 2, ack=1)
    _, _, metrics = _fit(context, 0.5, 3, ack=2)
    assert metrics["admm-previous-round"] == 2 and metrics["admm-resync"] == 0
    kept = load_states(context.state, [(D,)])
    assert kept.committed is not None and kept.committed.server_round == 2


def test_a_client_without_its_state_resyncs_with_its_full_contribution() -> None:
    _, arrays, metrics = _fit(_context(), 0.5, 7, ack=4)
    _, fresh, fresh_metrics = _fit(_context(), 0.5, 7, ack=0)
    assert metrics["admm-resync"] == 1 and fresh_metrics["admm-resync"] == 0
    assert metrics["admm-previous-round"] == 0 and metrics["admm-examples-change"] == 500
    assert "admm-delayed-sq-residual" not in metrics
    np.testing.assert_array_equal(arrays[0], fresh[0])  # Delta = n w' (u = 0): all of it
    context = _context()
    _fit(context, 0.0, 1, ack=0)
    _, _, metrics = _fit(context, 0.5, 2, ack=0)  # S holds nothing of it: start fresh
    assert metrics["admm-previous-round"] == 0 and metrics["admm-resync"] == 0


@pytest.mark.parametrize("uplink", [{}, EIGHT_BITS], ids=["float64", "8-bit"])
def test_a_rebuild_request_adds_the_full_share(uplink: dict[str, Any]) -> None:
    plain, asked = _context(), _context()
    for context in (plain, asked):
        _fit(context, 0.0, 1, ack=0, **uplink)
    client_plain, arrays, _ = _fit(plain, 0.5, 2, ack=1, **uplink)
    client, both, _ = _fit(asked, 0.5, 2, ack=1, **{**uplink, "admm-rebuild": 1})
    np.testing.assert_array_equal(both[0], arrays[0])  # Delta_i as usual
    pending = load_states(asked.state, [(D,)]).pending
    assert pending is not None
    residual = np.zeros(D) if pending.residual is None else pending.residual[0]
    share = 500 * (pending.w[0] + pending.u[0]) - residual  # sigma' = n' c' - e'
    np.testing.assert_allclose(both[1], share, rtol=1e-15)
    if uplink:  # the change compressed as usual, then the share in full precision
        assert client.uplink_payload is not None and client_plain.uplink_payload is not None
        tensors = client.uplink_payload.tensors
        assert tensors[0] == client_plain.uplink_payload.tensors[0] and len(tensors) == 2
        np.testing.assert_array_equal(ndarray_view(tensors[1]), both[1])
        assert np.abs(residual).max() > 0


def test_the_alignment_terms_go_only_where_asked_and_only_after_a_step() -> None:
    """``admm-align = 1`` (an adaptive gamma on the server): a returning node reports
    the terms of the dual step it took; not asked, or nothing before, it reports none."""
    names = ("admm-align-along", "admm-align-residual", "admm-align-dual")
    asked, plain = _context(), _context()
    for context in (asked, plain):
        _fit(context, 0.0, 1, ack=0)
    _, _, first = _fit(_context(), 0.0, 1, ack=0, **{"admm-align": 1})
    assert not any(name in first for name in names)
    _, _, metrics = _fit(asked, 0.3, 2, ack=1, **{"admm-align": 1})
    _, _, without = _fit(plain, 0.3, 2, ack=1)
    assert not any(name in without for name in names)
    assert metrics["admm-align-residual"] == metrics["admm-delayed-sq-residual"]
    assert metrics["admm-align-dual"] == 0.0  # u_i = 0 before the first step
    kept = load_states(asked.state, [(D,)]).committed
    assert kept is not None  # along = <w_i - z, u_i> with the kept w_i, u_i
    assert metrics["admm-align-along"] == float(np.vdot(kept.w[0] - 0.3, kept.u[0]))


@pytest.mark.parametrize(
    ("extra", "field"),
    [
        ({"admm-ack-round": -1}, "admm-ack-round"),
        ({"admm-ack-round": "3"}, "admm-ack-round"),
        ({"admm-ack-round": True}, "admm-ack-round"),
        ({"admm-rebuild": 2}, "admm-rebuild"),
    ],
)
def test_a_bad_acknowledgement_is_an_error_and_keeps_nothing(
    extra: dict[str, Any], field: str
) -> None:
    context = _context()
    with pytest.raises(ValueError, match=field):
        _client(context).fit([np.zeros(D)], {**BASE, "server_round": 1, **extra})
    assert context.state.array_records == {}


def test_without_a_context_the_object_keeps_both_states() -> None:
    client = _client(None)
    config = {**BASE, "admm-ack-round": 0, "server_round": 1}
    client.fit([np.zeros(D)], config)
    client.fit([np.full(D, 0.3)], {**config, "admm-ack-round": 1, "server_round": 2})
    _, _, metrics = client.fit([np.full(D, 0.5)], {**config, "admm-ack-round": 1})
    assert metrics["admm-previous-round"] == 1  # round 2's reply was not used
