"""The round metrics of one FedADMM aggregation, under the wire names of `protocol`.

Both FedADMMs (legacy `flwr_admm.server.fedadmm`, Message-API
`flwr_admm.serverapp.fedadmm`) report a `RoundReport` of the numpy core through
`report_metrics`, so their metric names and values cannot drift apart. Every strategy
of the package, on both APIs, passes what a metrics-aggregation function returns
through `without_reply_keys`, and hands its round to the divergence watchdog through
`watch_round`, which reads the residual and objective under the same names.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from logging import WARNING
from typing import Any, TypeVar

from flwr.common import Scalar
from flwr.common.logger import log
from numpy.typing import NDArray

from flwr_admm.core.health import RunHealth
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
    PREVIOUS_PRIMAL_RESIDUAL,
    PRIMAL_RESIDUAL,
    REPLY_ONLY_METRICS,
    REPLY_ONLY_PREFIX,
    RHO,
)

__all__ = ["MAX_REPLY_METRICS", "report_metrics", "watch_round", "without_reply_keys"]

V = TypeVar("V")

# The aggregated reply metrics kept per round (in name order): the history and the
# returned round metrics stay bounded whatever names the clients invent.
MAX_REPLY_METRICS = 64


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
    produced `aggregated` saw the replies unchanged. At most `MAX_REPLY_METRICS` names
    are kept, the first in sorted order (a warning counts the others).
    """
    names = sorted(
        name
        for name in aggregated
        if name not in REPLY_ONLY_METRICS and not name.startswith(REPLY_ONLY_PREFIX)
    )
    if len(names) > MAX_REPLY_METRICS:
        log(
            WARNING,
            "round metrics: %d reply metric names, kept the first %d (sorted)",
            len(names),
            MAX_REPLY_METRICS,
        )
        names = names[:MAX_REPLY_METRICS]
    return {name: aggregated[name] for name in names}


def watch_round(
    health: RunHealth | None,
    server_round: int,
    counts: tuple[int, int, int],
    before: Iterable[NDArray[Any]] | None = None,
    after: Iterable[NDArray[Any]] | None = None,
    metrics: Mapping[str, Any] | None = None,
) -> None:
    """Feed one round to the divergence watchdog (`flwr_admm.core.health`; None: off).

    `counts` are the replies accepted, rejected and failed (or lost); `before` and
    `after` the model sent and the one returned, tensor by tensor (read once; None:
    nothing aggregated); the primal residual (client-held duals: the delayed one) and
    the objective come from the round's `metrics`. Raises `RunDivergedError` when the
    run diverged or stalled.
    """
    if health is None:
        return
    metrics = metrics or {}
    residual = metrics.get(PRIMAL_RESIDUAL, metrics.get(PREVIOUS_PRIMAL_RESIDUAL))
    accepted, rejected, failed = counts
    health.observe(
        server_round,
        accepted=accepted,
        rejected=rejected,
        failed=failed,
        before=before,
        after=after,
        primal_residual=residual,
        objective=metrics.get(OBJECTIVE),
    )
