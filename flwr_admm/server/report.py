"""The round metrics of one FedADMM aggregation, under the wire names of `protocol`.

Both FedADMMs (legacy `flwr_admm.server.fedadmm`, Message-API
`flwr_admm.serverapp.fedadmm`) report a `RoundReport` of the numpy core through
`report_metrics`, so their metric names and values cannot drift apart. Every strategy
of the package, on both APIs, passes what a metrics-aggregation function returns
through `without_reply_keys`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TypeVar

from flwr.common import Scalar

from flwr_admm.core.types import RoundReport
from flwr_admm.protocol import (
    CONVERGED,
    DUAL_RESIDUAL,
    EPS_DUAL,
    EPS_PRIMAL,
    NEXT_RHO,
    NUM_CLIENTS_CACHED,
    NUM_REPLIES,
    OBJECTIVE,
    PRIMAL_RESIDUAL,
    REPLY_ONLY_METRICS,
    REPLY_ONLY_PREFIX,
    RHO,
)

__all__ = ["report_metrics", "without_reply_keys"]

V = TypeVar("V")


def report_metrics(report: RoundReport) -> dict[str, Scalar]:
    """Return one aggregation's round metrics: rho, residuals, thresholds, counts, f."""
    metrics: dict[str, Scalar] = {
        RHO: report.rho,
        NEXT_RHO: report.next_rho,
        PRIMAL_RESIDUAL: report.primal_residual,
        DUAL_RESIDUAL: report.dual_residual,
        EPS_PRIMAL: report.eps_primal,
        EPS_DUAL: report.eps_dual,
        CONVERGED: int(report.converged),
        NUM_REPLIES: report.num_replies,
        NUM_CLIENTS_CACHED: report.num_clients_cached,
    }
    if report.objective is not None:
        metrics[OBJECTIVE] = report.objective  # sum_i p_i f_i(w_i) (+ g(z'))
    return metrics


def without_reply_keys(aggregated: Mapping[str, V]) -> dict[str, V]:
    """Return aggregated reply metrics without the replies' identity and protocol keys.

    Dropped: ``client-key``, ``partition-id``, ``num-examples`` and every ``admm-*``
    key (`flwr_admm.protocol.REPLY_ONLY_METRICS`): Flower's default
    ``train_metrics_aggr_fn`` weight-averages every numeric reply metric, ids included,
    and an average of ids or protocol counters is no round metric. The function that
    produced `aggregated` saw the replies unchanged.
    """
    return {
        name: value
        for name, value in aggregated.items()
        if name not in REPLY_ONLY_METRICS and not name.startswith(REPLY_ONLY_PREFIX)
    }
