"""Run the simulations app in process, without Ray, on either Flower API.

`run_legacy` drives the legacy ``server_fn`` with in-process client proxies
(`flwr_admm.testing.run_rounds`); `run_message` drives the ``@app.main()`` ServerApp
on `flwr_admm.serverapp.testing.InProcessGrid` with the app's own ClientApp. Node ids
are given explicitly: they are random per run in Flower, and sampling must not
depend on them.
"""

from __future__ import annotations

from typing import Any

from flwr.common import Context, RecordDict

from flwr_admm.serverapp.testing import InProcessGrid, flower_task_identity
from flwr_admm.testing import make_proxies, run_rounds
from simulations.admm_app import client_app
from simulations.admm_app.server_app import main, server_fn


def run_legacy(
    run_config: dict[str, Any],
    num_clients: int = 10,
    *,
    fail: bool = False,
    node_ids: list[int] | None = None,
) -> Any:
    """Run the legacy path (``api=legacy`` is set here) with in-process proxies."""
    run_config = {**run_config, "api": "legacy"}
    context = Context(
        run_id=0, node_id=0, node_config={}, state=RecordDict(), run_config=run_config
    )
    components = server_fn(context)

    def node_client_fn(node_context: Context) -> Any:
        if fail:
            raise RuntimeError("client exploded")
        node_context.run_config = run_config
        return client_app.client_fn(node_context)

    proxies = make_proxies(node_client_fn, num_clients, node_ids=node_ids)
    return run_rounds(
        components.strategy,
        proxies,
        components.config.num_rounds,
        client_manager=components.client_manager,
    )


def run_message(
    run_config: dict[str, Any], num_clients: int = 10, *, node_ids: list[int] | None = None
) -> InProcessGrid:
    """Run the Message-API path (``api=message`` is set here) on an in-process grid."""
    run_config = {**run_config, "api": "message"}
    grid = InProcessGrid(client_app.app, num_clients, node_ids=node_ids)
    for context in grid.contexts.values():
        context.run_config = run_config
    context = Context(
        run_id=1, node_id=0, node_config={}, state=RecordDict(), run_config=run_config
    )
    with flower_task_identity(grid.run.run_id):
        main(grid, context)
    return grid
