"""`z_round` of client-held duals: its residuals do not depend on the BLAS threads."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
from threadpoolctl import threadpool_limits

from flwr_admm.protocol import EPS_DUAL, EPS_PRIMAL
from flwr_admm.rounds.client_duals_replies import RoundStats, z_round


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
