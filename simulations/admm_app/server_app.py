"""ServerApp: the chosen strategy, wrapped in a recorder, on either Flower API.

``app`` is a Message-API ServerApp (``@app.main()``) that dispatches on the run
config's ``api``: ``message`` runs `message_server.run_message_api` (``Strategy.start``);
``legacy`` runs the legacy ``server_fn`` below through Flower's own compat path (a
``ServerApp(server_fn=...)`` called with the same grid and context). Both record the
same JSON/CSV and, after the last round, write PNG plots next to them.

Every strategy gets the same clients, the same fit config (learning rate, local
steps/epochs, batch size), the same initial model and the same centralized evaluation;
they differ only in what the server sends and how it aggregates.
"""

from __future__ import annotations

import json
import math
import platform
import time
import traceback
from collections.abc import Mapping
from logging import WARNING
from pathlib import Path
from typing import Any

import flwr
import numpy as np
from flwr.common import Context, GetPropertiesIns, Metrics, Scalar, ndarrays_to_parameters
from flwr.common.logger import log
from flwr.server import ServerApp, ServerAppComponents, ServerConfig
from flwr.server.client_manager import SimpleClientManager
from flwr.server.client_proxy import ClientProxy
from flwr.server.criterion import Criterion
from flwr.server.strategy import FedAvg, FedProx, Strategy
from flwr.serverapp import Grid

from flwr_admm.data import Task
from flwr_admm.options import ClientPolicy
from flwr_admm.server import SCAFFOLD, FedADMM, FedDyn, FedNova
from flwr_admm.server.client_duals import FedADMMClientDuals
from flwr_admm.server.client_duals_secagg import FedADMMClientDualsSecAgg

from . import form_config as forms
from .checkpoint_config import remaining_rounds
from .evaluation import Evaluator, get_task
from .message_server import run_message_api
from .recorder import RecordingStrategy, RunRecorder, result_paths
from .run_config import (
    DEFAULTS,
    RunSettings,
    api_of,
    fit_config,
    parse_run_config,
    secure_aggregation_of,
)
from .secure_server import run_secure


class PartitionClientManager(SimpleClientManager):
    """Waits at most `wait_seconds` for clients; samples reproducibly by partition-id.

    Node ids are random per run, so sampling among them is not reproducible. When a
    strict subset is to be sampled, each node is asked once for its ``partition-id``
    (``get_properties``); nodes are ordered by it and drawn with
    ``default_rng([seed, draw])``. Full participation needs no query.
    """

    def __init__(self, wait_seconds: float, seed: int) -> None:
        super().__init__()
        self.wait_seconds = wait_seconds
        self.seed = seed
        self._draws = 0
        self._partition_of: dict[str, int] = {}

    def wait_for(self, num_clients: int, timeout: int = 86400) -> bool:
        """Wait for `num_clients` clients, at most `wait_seconds`."""
        return super().wait_for(num_clients, math.ceil(min(timeout, self.wait_seconds)))

    def sample(
        self,
        num_clients: int,
        min_num_clients: int | None = None,
        criterion: Criterion | None = None,
    ) -> list[ClientProxy]:
        """`num_clients` clients: all of them in cid order, or a seeded subset."""
        self.wait_for(num_clients if min_num_clients is None else min_num_clients)
        available = sorted(
            cid
            for cid, proxy in self.clients.items()
            if criterion is None or criterion.select(proxy)
        )
        if num_clients > len(available):
            # A node dropped between the strategy sizing the round and this wait: go on
            # with those present rather than ending the run.
            log(WARNING, "sampling %s clients but only %s available", num_clients, len(available))
            if len(available) < max(min_num_clients or 0, 1):
                return []
            num_clients = len(available)
        self._draws += 1
        if num_clients == len(available):
            return [self.clients[cid] for cid in available]
        order = sorted(available, key=lambda cid: (self._partition(cid), cid))
        rng = np.random.default_rng([self.seed, self._draws])
        picked = np.sort(rng.choice(len(order), size=num_clients, replace=False))
        return [self.clients[order[i]] for i in picked]

    def _partition(self, cid: str) -> int:
        if cid not in self._partition_of:
            res = self.clients[cid].get_properties(
                GetPropertiesIns(config={}), timeout=None, group_id=None
            )
            value = res.properties.get("partition-id")
            self._partition_of[cid] = int(value) if isinstance(value, int) else 1 << 30
        return self._partition_of[cid]


def fit_metrics(results: list[tuple[int, Metrics]]) -> Metrics:
    """Weighted mean of the clients' local loss f_i(w_i) and mean local steps."""
    total = sum(n for n, _ in results)
    out: dict[str, Scalar] = {}
    losses = [(n, m["loss"]) for n, m in results if isinstance(m.get("loss"), int | float)]
    if losses and total > 0:
        out["train_loss"] = float(sum(n * float(v) for n, v in losses) / total)
    steps = [
        float(m["local_steps"]) for _, m in results if isinstance(m.get("local_steps"), int | float)
    ]
    if steps:
        out["mean_local_steps"] = sum(steps) / len(steps)
    return out


def build_strategy(settings: RunSettings, task: Task, evaluator: Evaluator) -> Strategy:
    """The configured strategy with the shared sampling, fit config and evaluation."""
    num_clients = task.data.num_clients
    model = task.make_model()
    base_config = fit_config(settings)
    common: dict[str, Any] = {
        "fraction_fit": settings.fraction_fit,
        "fraction_evaluate": 0.0,
        "min_fit_clients": min(settings.min_fit_clients, num_clients),
        "min_evaluate_clients": 1,
        "min_available_clients": num_clients,
        "evaluate_fn": evaluator,
        "on_fit_config_fn": lambda server_round: {**base_config, "server_round": server_round},
        "initial_parameters": ndarrays_to_parameters(model.init_params(settings.seed)),
        "fit_metrics_aggregation_fn": fit_metrics,
        "accept_failures": True,
    }
    # The ADMM strategies send server_round (and rho) themselves; a user config may not.
    admm_common = {
        **common,
        "on_fit_config_fn": lambda server_round: dict(base_config),
        "clients": ClientPolicy(key_binding=settings.key_binding),
        "checkpoint": settings.checkpoint.checkpointing(),  # checkpoint-dir, -every, resume
    }
    if settings.strategy == "fedadmm":
        # sampling_seed=None: the client manager samples, the same way for every strategy
        return FedADMM(
            **forms.fedadmm_keywords(settings),
            sampling_seed=None,
            tensor_names=getattr(model, "tensor_names", None),  # framework=torch: state_dict
            **admm_common,
        )
    duals = {**settings.form.strategy_kwargs({"rho": settings.rho}), "sampling_seed": None}
    if settings.strategy == "fedadmm-client-duals" and settings.secure_aggregation:
        return FedADMMClientDualsSecAgg(**duals, **admm_common)
    if settings.strategy == "fedadmm-client-duals":
        return FedADMMClientDuals(**duals, **admm_common)
    if settings.strategy == "fedprox":
        return FedProx(proximal_mu=settings.proximal_mu, **common)
    # The peers sample through the client manager too (sampling_seed=None)
    if settings.strategy == "fednova":
        return FedNova(sampling_seed=None, **common)
    # SCAFFOLD / FedDyn send server_round themselves, like the ADMM strategies
    peer_common = {
        **common,
        "on_fit_config_fn": admm_common["on_fit_config_fn"],
        "clients": admm_common["clients"],
        "sampling_seed": None,
    }
    if settings.strategy == "scaffold":
        return SCAFFOLD(server_learning_rate=settings.server_learning_rate, **peer_common)
    if settings.strategy == "feddyn":
        return FedDyn(alpha=settings.feddyn_alpha, **peer_common)
    return FedAvg(**common)


def _header(
    settings: RunSettings, task: Task, evaluator: Evaluator, run_config: Mapping[str, Any]
) -> dict[str, Any]:
    optimum = evaluator.optimum
    return {
        "task": settings.task,
        "strategy": settings.strategy,
        "stem": settings.stem,
        "settings": settings.to_dict(),
        "run_config": dict(run_config),
        "num_clients": task.data.num_clients,
        "evaluation_data": "test split"
        if task.data.X_test is not None
        else "training data (the task has no test split)",
        "convex": task.convex,
        "optimum": None
        if optimum is None
        else {"objective": optimum.objective, "grad_norm": optimum.grad_norm},
        "flwr_version": flwr.__version__,
        "python": platform.python_version(),
        "started_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }


def _mark_setup_failure(run_config: Mapping[str, Any], error: BaseException) -> None:
    """Best effort: write the error marker where the results would have gone."""
    config = {**DEFAULTS, **run_config}
    stem = str(config["strategy"]) + (f"-{config['run-tag']}" if config["run-tag"] else "")
    try:
        task_dir = Path(str(config["output-dir"])).expanduser().resolve() / str(config["task"])
        task_dir.mkdir(parents=True, exist_ok=True)
        path = result_paths(task_dir, stem)["error"]
        path.write_text(
            json.dumps(
                {
                    "message": f"setup failed: {error!r}",
                    "traceback": traceback.format_exc(),
                    "stem": stem,
                }
            )
        )
    except Exception:  # the original error is what matters
        pass


def plot_run(task_dir: Path, stem: str, document: dict[str, Any]) -> list[Path]:
    """Write this run's PNG plots (``<stem>-objective.png`` ...) next to its JSON/CSV."""
    from .plots import RunResult, plot_all  # matplotlib, Agg backend

    return plot_all([RunResult(stem, document)], task_dir, prefix=f"{stem}-")


def _plot_safely(task_dir: Path, stem: str, document: dict[str, Any]) -> None:
    try:
        plot_run(task_dir, stem, document)
    except Exception as error:  # the results are written; a plot failure only warns
        log(WARNING, "plotting %s failed: %r", stem, error)


def setup(context: Context) -> tuple[RunSettings, Task, Evaluator, RunRecorder]:
    """Validate the run config, load the task, find F*, open the recorder."""
    settings = parse_run_config(context.run_config)
    task = get_task(settings.task, settings.seed, settings.task_options())
    settings = parse_run_config(context.run_config, task.defaults)
    if settings.framework == "torch":
        from .torch_task import torch_task  # imports torch

        task = torch_task(task, settings.model, settings.seed)
    evaluator = Evaluator.build(task, cache_dir=settings.task_dir)
    recorder = RunRecorder(
        settings.task_dir,
        settings.stem,
        _header(settings, task, evaluator, context.run_config),
        settings.num_server_rounds,
    )
    task_dir, stem = settings.task_dir, settings.stem
    recorder.on_complete = lambda document: _plot_safely(task_dir, stem, document)
    return settings, task, evaluator, recorder


def server_fn(context: Context) -> ServerAppComponents:
    """Validate the run config, load the task, find F*, wrap the (legacy) strategy."""
    try:
        settings, task, evaluator, recorder = setup(context)
        inner = build_strategy(settings, task, evaluator)
        # resume: the checkpoint's rounds are done; the run ends at num-server-rounds
        recorder.offset = int(getattr(inner, "last_round", 0))
        num_rounds = remaining_rounds(settings.num_server_rounds, recorder.offset)
        strategy = RecordingStrategy(inner, recorder)
    except Exception as error:
        _mark_setup_failure(context.run_config, error)
        raise
    return ServerAppComponents(
        strategy=strategy,
        config=ServerConfig(num_rounds=num_rounds, round_timeout=settings.round_timeout),
        client_manager=PartitionClientManager(settings.client_wait_seconds, settings.seed),
    )


legacy_app = ServerApp(server_fn=server_fn)
app = ServerApp()


@app.main()
def main(grid: Grid, context: Context) -> None:
    """Run the configured strategy on the run config's ``api``."""
    try:
        api = api_of(context.run_config)
        secure = secure_aggregation_of(context.run_config)
    except ValueError as error:
        _mark_setup_failure(context.run_config, error)
        raise
    if secure:  # SecAgg+ exists for legacy strategies only (whatever api says)
        run_secure(grid, context, server_fn(context))
        return
    if api == "legacy":
        legacy_app(grid, context)
        return
    try:
        settings, task, evaluator, recorder = setup(context)
    except Exception as error:
        _mark_setup_failure(context.run_config, error)
        raise
    run_message_api(grid, settings, task, evaluator, recorder)
