"""SecAgg+ for the app: the legacy strategy under Flower's ``SecAggPlusWorkflow``.

Flower 1.42 has SecAgg+ only for legacy strategies: an ``@app.main()`` drives it through
``DefaultWorkflow(fit_workflow=SecAggPlusWorkflow(...))`` with a `LegacyContext`, and
the ClientApp wraps the legacy ``client_fn`` in ``secaggplus_mod``
(`simulations.admm_app.client_app`). With ``secure-aggregation = true`` the run config's
strategy must be ``fedadmm-client-duals`` (`FedADMMClientDualsSecAgg`: it needs only
the sum of the replies).

Each node's key shares go to ``NUM_SHARES`` = 3 nodes (itself and its two
neighbours in SecAgg+'s ring) and ``RECONSTRUCTION_THRESHOLD`` = 2 of them rebuild a
dropped node's mask (Flower's own example values; ``num_shares = 4`` with 10 nodes
crashed every client in ``secaggplus_mod._share_keys`` on flwr 1.42 here).
"""

from __future__ import annotations

from logging import INFO

from flwr.common import Context
from flwr.common.logger import log
from flwr.server import ServerAppComponents
from flwr.server.compat import LegacyContext
from flwr.server.workflow import DefaultWorkflow
from flwr.serverapp import Grid

from flwr_admm.server.client_duals_secagg import FedADMMClientDualsSecAgg

NUM_SHARES = 3
RECONSTRUCTION_THRESHOLD = 2


def run_secure(grid: Grid, context: Context, components: ServerAppComponents) -> None:
    """Run `components` (a recorded `FedADMMClientDualsSecAgg`) under SecAgg+."""
    strategy = components.strategy
    inner = getattr(strategy, "inner", strategy)  # the RecordingStrategy's strategy
    if not isinstance(inner, FedADMMClientDualsSecAgg) or components.config is None:
        raise ValueError(
            f"secure-aggregation: needs FedADMMClientDualsSecAgg and a ServerConfig, got {inner!r}"
        )
    timeout = components.config.round_timeout
    log(
        INFO,
        "secure-aggregation: %r under SecAgg+ (legacy API: flwr 1.42 has no Message-API SecAgg+)",
        inner,
    )
    legacy = LegacyContext(
        context,
        config=components.config,
        strategy=strategy,
        client_manager=components.client_manager,
    )
    workflow = inner.workflow(NUM_SHARES, RECONSTRUCTION_THRESHOLD, timeout)
    DefaultWorkflow(fit_workflow=workflow)(grid, legacy)
