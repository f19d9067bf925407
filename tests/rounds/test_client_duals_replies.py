"""Client-held duals' round sums: residuals independent of the BLAS threads, the alignment."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
from threadpoolctl import threadpool_limits

from flwr_admm.protocol import (
    ALIGN_ALONG,
    ALIGN_DUAL,
    ALIGN_RESIDUAL,
    DELAYED_SQ_RESIDUAL,
    EPS_DUAL,
    EPS_PRIMAL,
    EXAMPLES_CHANGE,
    PREVIOUS_ROUND,
    U_SQ_NORM,
    W_SQ_NORM,
)
from flwr_admm.rounds.client_duals_replies import RoundStats, protocol_problem, z_round
from flwr_admm.rounds.client_duals_state import ClientDualsState, ClientEntry


def test_z_round_metrics_do_not_depend_on_the_blas_thread_count() -> None:
    """||z'|| (eps_pri) is summed single-threaded, in a fixed order.

    A threaded BLAS dot over a tensor this large sums in its own order per thread
    count: eps_pri changed in the last bits with the caller's BLAS threads.
    """
    rng = np.random.default_rng(4)
    z0, total = rng.normal(size=300_000), rng.normal(size=300_000) * 40.0

    def metrics(threads: int) -> dict[str, object]:
        state = SimpleNamespace(
            z=[z0.copy()],
            contribution_sum=[total.copy()],
            total_examples=40,
            regularizer=None,
            rho=0.5,
            eps_abs=1e-8,
            eps_rel=1e-6,
        )
        stats = RoundStats()
        stats.num_replies, stats.n, stats.w_sq, stats.u_sq = 4, 40.0, 1e-6, 1e-6
        with threadpool_limits(threads):
            _, out, _ = z_round(state, stats, 40)  # type: ignore[arg-type]
        return out

    one, two = metrics(1), metrics(2)
    assert one[EPS_PRIMAL] == two[EPS_PRIMAL] and one[EPS_DUAL] == two[EPS_DUAL]
    assert one == two


def reply(along: float, residual: float, dual: float, **more: float) -> dict[str, float]:
    """A returning node's metrics with its alignment terms."""
    return {
        PREVIOUS_ROUND: 2,
        EXAMPLES_CHANGE: 0,
        W_SQ_NORM: 1.0,
        U_SQ_NORM: 1.0,
        DELAYED_SQ_RESIDUAL: residual,
        ALIGN_ALONG: along,
        ALIGN_RESIDUAL: residual,
        ALIGN_DUAL: dual,
        **more,
    }


def test_the_alignment_is_the_n_weighted_c_k_of_the_replies_that_report_it() -> None:
    """c_k = sum n_i a_i / sqrt(sum n_i r_i sum n_i q_i), as `ConsensusADMM` computes it
    from the duals it holds; a reply without the terms (a new node, a stock or older
    client) adds nothing, and with no dual yet c_k is undefined."""
    stats = RoundStats()
    stats.add(10, reply(2.0, 4.0, 1.0))
    stats.add(30, reply(-1.0, 1.0, 4.0))
    stats.add(20, {PREVIOUS_ROUND: 0, EXAMPLES_CHANGE: 20, W_SQ_NORM: 1.0, U_SQ_NORM: 0.0})
    expected = (10 * 2.0 - 30 * 1.0) / np.sqrt((10 * 4.0 + 30 * 1.0) * (10 * 1.0 + 30 * 4.0))
    assert stats.alignment == expected
    first = RoundStats()
    first.add(10, reply(0.0, 4.0, 0.0))  # u_i = 0 before the first step
    assert first.alignment is None


def test_malformed_alignment_terms_are_a_protocol_problem() -> None:
    entry = ClientEntry(num_examples=10, last_round=2, weight=10.0)
    assert protocol_problem(entry, reply(-3.0, 4.0, 1.0), 10) is None  # along may be < 0
    for bad in (
        reply(float("nan"), 4.0, 1.0),
        reply(1.0, 4.0, -1.0),
        reply(1.0, float("inf"), 1.0),
    ):
        problem = protocol_problem(entry, bad, 10)
        assert problem is not None and problem[1] == 0


def test_the_weights_omega_i_are_checkpointed_and_an_older_linearized_checkpoint_refused() -> None:
    """The linearized form weighs c_i by omega_i = n_i / b_i: kept per key and summed
    into N. A checkpoint without them weighed every share by n_i: the prox form's
    weights, but shares a linearized run could not take out of S again."""

    def state(linearized: bool) -> ClientDualsState:
        return ClientDualsState(
            rho=1.0, regularizer=None, eps_abs=0.0, eps_rel=0.0, linearized=linearized
        )

    linear = state(True)
    linear.adopt([np.zeros(3)])
    linear.record("a", 30, 1, full=True, weight=30 / 7.0)
    linear.record("b", 20, 1, full=True, weight=20 / 3.0)
    assert linear.total_examples == 30 / 7.0 + 20 / 3.0
    arrays, manifest = linear.state_dict()
    resumed = state(True)
    resumed.load_state_dict(arrays, manifest)
    assert resumed.clients == linear.clients and resumed.total_examples == linear.total_examples
    older = {k: v for k, v in arrays.items() if k != "entry_weights"}
    prox = state(False)
    prox.load_state_dict(older, manifest)
    assert [e.weight for e in prox.clients.values()] == [30.0, 20.0]
    refused = state(True)
    with pytest.raises(ValueError, match=r"^entry_weights: a linearized-form checkpoint"):
        refused.load_state_dict(older, manifest)
    assert refused.z is None and refused.clients == {}  # nothing changed
