"""The ServerApp: the run config's strategy, central evaluation every round, a JSON record.

The strategy line is the only difference between runs: Flower's ``FedAvg`` /
``FedProx``, or flwr-admm's ``FedADMM()`` (its defaults: the linearized form),
``FedADMM(form="prox")``, ``FedADMMClientDuals()``,
``SCAFFOLD()`` and
``FedDyn(alpha=...)``. Every round the global model is tested on the central test
set and ``<output-dir>/<strategy>[-<handler>]-seed<seed>.json`` is rewritten. A
ClientApp error (or a missing reply) and a non-finite global model or central loss
fail the run: the JSON says so, and the app raises.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Iterable
from logging import INFO
from pathlib import Path
from typing import Any

import torch
from flwr.app import ArrayRecord, Context, Message, MetricRecord, RecordDict
from flwr.common.logger import log
from flwr.serverapp import Grid, ServerApp
from flwr.serverapp.strategy import FedAvg, FedProx, Strategy
from flwr.supercore.run import Run

from flwr_admm import ClientPolicy
from flwr_admm.core.linearized import LINEARIZED_CONVEX, Linearized
from flwr_admm.serverapp import SCAFFOLD, FedADMM, FedADMMClientDuals, FedDyn
from quickstart_admm.task import Net, Settings, central_test_loader, initial_model, test

app = ServerApp()

FRACTION_EVALUATE = 0.2  # 2 of 10 nodes validate locally; the central test set decides


def sampling(settings: Settings) -> dict[str, Any]:
    """Return the sampling keywords every strategy here takes (Flower's FedAvg's)."""
    n = settings.num_partitions
    return {
        "fraction_train": settings.fraction_train,
        "fraction_evaluate": FRACTION_EVALUATE,
        "min_evaluate_nodes": min(2, n),
        # FedAvg sizes its sample before waiting for the nodes: ask for the full sample
        "min_train_nodes": max(1, int(n * settings.fraction_train)),
        "min_available_nodes": n,
    }


def make_strategy(settings: Settings) -> Strategy:
    """Return the run config's strategy; `fraction_train` of the nodes train a round."""
    common = sampling(settings)
    if settings.strategy == "fedavg":
        return FedAvg(**common)
    if settings.strategy == "fedprox":
        return FedProx(proximal_mu=settings.proximal_mu, **common)
    # ours: with identify-nodes the nodes name their partition-id before a partial sample
    common["clients"] = ClientPolicy(identify=settings.identify_nodes)
    # "adaptive": FedADMM's default, AdaptiveDualStep(); a number: a fixed dual step
    dual_step = None if settings.dual_step == "adaptive" else float(settings.dual_step)
    if settings.strategy == "fedadmm":  # the linearized form, or prox if dual_step is set
        return FedADMM(dual_step=dual_step, **common)
    if settings.strategy == "fedadmm-prox":  # the prox form's defaults (rho 0.1, RB)
        return FedADMM(form="prox", dual_step=dual_step, **common)
    if settings.strategy == "fedadmm-linearized":  # Scaffnew: rho_i = 1 / b_i per reply
        form = Linearized() if dual_step is None else Linearized(dual_step=dual_step)
        return FedADMM(form=form, **common)
    if settings.strategy == "fedadmm-linearized-convex":  # momentum start, gamma 1
        return FedADMM(form=LINEARIZED_CONVEX, **common)
    if settings.strategy == "fedadmm-client-duals":  # the linearized form by default
        return FedADMMClientDuals(**common)
    if settings.strategy == "fedadmm-client-duals-prox":  # rho 0.1, gamma 1
        return FedADMMClientDuals(form="prox", **common)
    if settings.strategy == "fedadmm-client-duals-linearized":  # y_i on the nodes
        return FedADMMClientDuals(form="linearized", **common)
    if settings.strategy == "scaffold":
        return SCAFFOLD(**common)
    return FedDyn(alpha=settings.feddyn_alpha, **common)


class CheckedGrid(Grid):
    """The run's Grid, failing the run on an error or a missing reply.

    Flower's strategies go on without them (FedADMM keeps z, FedAvg skips the round),
    so a run whose every ClientApp crashed would otherwise end "successfully".
    """

    def __init__(self, grid: Grid) -> None:
        self.grid = grid

    def set_run(self, run: Run) -> None:
        """Set the run (delegated)."""
        self.grid.set_run(run)

    @property
    def run(self) -> Run:
        """Return the run (delegated)."""
        return self.grid.run

    def create_message(
        self,
        content: RecordDict,
        message_type: str,
        dst_node_id: int,
        group_id: str,
        ttl: float | None = None,
    ) -> Message:
        """Create a message (delegated)."""
        return self.grid.create_message(content, message_type, dst_node_id, group_id, ttl)

    def get_node_ids(self) -> Iterable[int]:
        """Return the connected nodes (delegated)."""
        return self.grid.get_node_ids()

    def push_messages(self, messages: Iterable[Message]) -> Iterable[str]:
        """Push messages (delegated)."""
        return self.grid.push_messages(messages)

    def pull_messages(self, message_ids: Iterable[str]) -> Iterable[Message]:
        """Pull replies (delegated)."""
        return self.grid.pull_messages(message_ids)

    def send_and_receive(
        self, messages: Iterable[Message], *, timeout: float | None = None
    ) -> Iterable[Message]:
        """Send, receive, and raise unless every message got a content reply."""
        sent = list(messages)
        replies = list(self.grid.send_and_receive(sent, timeout=timeout))
        errors = [reply.error.reason for reply in replies if reply.has_error()]
        if errors or len(replies) != len(sent):
            kind = sent[0].metadata.message_type if sent else "?"
            raise RuntimeError(
                f"{kind}: {len(errors)} error replies, {len(sent) - len(replies)} missing, "
                f"of {len(sent)} messages; first error: {errors[0] if errors else None}"
            )
        return replies


class CentralEvaluation:
    """An ``evaluate_fn``: test the global model, rewrite the JSON, fail on non-finite."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.path = Path(settings.output_dir) / f"{settings.run_name}.json"
        self.loader = central_test_loader()
        self.rounds: list[dict[str, Any]] = []
        self.started = time.monotonic()

    def __call__(self, server_round: int, arrays: ArrayRecord) -> MetricRecord:
        """Return the central loss and accuracy of round `server_round`'s model."""
        finite = is_finite(arrays)
        loss, accuracy = math.nan, math.nan
        if finite:
            model = Net(self.settings.batch_norm)
            model.load_state_dict(arrays.to_torch_state_dict())
            loss, accuracy = test(model, self.loader)
        seconds = time.monotonic() - self.started
        self.rounds.append(
            {"round": server_round, "accuracy": accuracy, "loss": loss, "seconds": seconds}
        )
        if not (finite and math.isfinite(loss)):
            what = "central loss" if finite else "model"
            reason = f"round {server_round}: the global {what} is not finite (diverged)"
            self.write("failed", reason)
            raise RuntimeError(f"{self.settings.run_name}: {reason}; the run failed")
        self.write("running")
        return MetricRecord({"accuracy": accuracy, "loss": loss})

    def write(self, status: str, reason: str = "") -> None:
        """Write the record so far (non-finite numbers as null)."""
        document = {
            "run": self.settings.run_name,
            "status": status,
            "reason": reason,
            "settings": {k.replace("_", "-"): v for k, v in vars(self.settings).items()},
            "rounds": [{k: _finite_or_none(v) for k, v in r.items()} for r in self.rounds],
        }
        self.path.parent.mkdir(parents=True, exist_ok=True)
        temporary = self.path.with_suffix(".json.tmp")
        temporary.write_text(json.dumps(document, indent=1, allow_nan=False))
        temporary.replace(self.path)


def is_finite(arrays: ArrayRecord) -> bool:
    """Return whether every tensor of `arrays` is finite."""
    return all(bool(torch.isfinite(t).all()) for t in arrays.to_torch_state_dict().values())


def _finite_or_none(value: Any) -> Any:
    return None if isinstance(value, float) and not math.isfinite(value) else value


@app.main()
def main(grid: Grid, context: Context) -> None:
    """Run `num-server-rounds` rounds of the chosen strategy from the seeded model."""
    torch.set_num_threads(1)
    settings = Settings.from_run_config(context.run_config)
    strategy = make_strategy(settings)
    evaluation = CentralEvaluation(settings)
    model = initial_model(settings)
    try:
        result = strategy.start(
            grid=CheckedGrid(grid),
            initial_arrays=ArrayRecord(model.state_dict()),
            num_rounds=settings.num_server_rounds,
            evaluate_fn=evaluation,
        )
    except Exception as error:
        evaluation.write("failed", f"{type(error).__name__}: {error}")
        raise
    rounds = [r["round"] for r in evaluation.rounds]
    problem = ""
    if rounds != list(range(settings.num_server_rounds + 1)):
        problem = f"central evaluation ran for rounds {rounds}"
    elif not is_finite(result.arrays):
        problem = "the final model is not finite"
    if problem:
        evaluation.write("failed", problem)
        raise RuntimeError(f"{settings.run_name}: {problem}; the run failed")
    evaluation.write("completed")
    final = evaluation.rounds[-1]
    log(
        INFO,
        "quickstart-admm %s: central accuracy %.4f, loss %.4f after %d rounds (%.0f s); %s",
        settings.run_name,
        final["accuracy"],
        final["loss"],
        settings.num_server_rounds,
        final["seconds"],
        evaluation.path,
    )
