"""The app's Message-API server side (``api = "message"``): Flower's ``Strategy.start``.

`run_message_api` builds `flwr_admm.serverapp.FedADMM` (``fedadmm``),
`flwr_admm.serverapp.FedADMMClientDuals` (``fedadmm-client-duals``), Flower's
Message-API `FedAvg` / `FedProx` (``fedavg`` / ``fedprox``) or
`flwr_admm.serverapp.FedNova` (``fednova``), `flwr_admm.serverapp.SCAFFOLD`
(``scaffold``) or `flwr_admm.serverapp.FedDyn` (``feddyn``), all drawing their train nodes
with `message_sampling.PartitionSampler` (the legacy path's clients, by partition-id,
seeded), with the same sampling sizes, fit config, initial model and centralized
evaluation as the legacy path, and records the same per-round JSON/CSV through
`RunRecorder`: the strategy class is extended by `RecordingMixin` (bytes, time,
results/failures, drift, fit metrics per round), and the evaluation goes through
``evaluate_fn`` (round 0 = initial model). Replies are sorted by partition-id
before aggregation, as on the legacy path.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Strategy

from flwr_admm.data import Task
from flwr_admm.options import ClientPolicy
from flwr_admm.serverapp import SCAFFOLD, FedADMM, FedADMMClientDuals, FedDyn, FedNova

from . import form_config as forms
from .checkpoint_config import remaining_rounds
from .evaluation import Evaluator
from .message_sampling import PartitionSampler, SeededFedAvg, SeededFedProx
from .recorder import (
    FIT_FIELDS,
    STATUS_FAILED,
    RunRecorder,
    distance,
    record_evaluation,
    weighted_drift,
)
from .run_config import RunSettings, fit_config

NUM_EXAMPLES = "num-examples"
NO_LIMIT = 1e7  # seconds a round may wait for replies when round-timeout is 0


def _metrics_of(content: RecordDict) -> dict[str, Any]:
    merged: dict[str, Any] = {}
    for record in content.metric_records.values():
        merged.update(record)
    return merged


def _arrays_of(content: RecordDict) -> list[Any]:
    for record in content.array_records.values():
        return list(record.to_numpy_ndarrays())
    return []


def _record_bytes(content: RecordDict) -> int:
    return int(sum(len(a.data) for r in content.array_records.values() for a in r.values()))


def train_metrics(contents: list[RecordDict], weighting_key: str) -> MetricRecord:
    """Return the legacy app's fit metrics: weighted train_loss and mean_local_steps."""
    total = 0.0
    losses, steps = [], []
    for content in contents:
        metrics = _metrics_of(content)
        n = float(metrics.get(weighting_key, 0))
        total += n
        if isinstance(metrics.get("loss"), int | float):
            losses.append((n, float(metrics["loss"])))
        if isinstance(metrics.get("local_steps"), int | float):
            steps.append(float(metrics["local_steps"]))
    out: dict[str, int | float | list[int] | list[float]] = {}
    if losses and total > 0:
        out["train_loss"] = float(sum(n * v for n, v in losses) / total)
    if steps:
        out["mean_local_steps"] = sum(steps) / len(steps)
    return MetricRecord(out)


def _partition_key(message: Message) -> tuple[int, int]:
    pid = _metrics_of(message.content).get("partition-id")
    return (int(pid) if isinstance(pid, int | float) else 1 << 30, message.metadata.src_node_id)


class RecordingMixin:
    """Record every train round of a Message-API strategy it is mixed into."""

    recorder: RunRecorder
    _round_start: float
    _sent_model: list[Any]  # not `_sent`: the RoundStrategy translator has its own

    def _fail(self, message: str) -> None:
        if self.recorder.status != STATUS_FAILED:
            self.recorder.fail(message)
        raise RuntimeError(message)

    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> list[Message]:
        """Delegate; record what is sent down. No node sampled is an error."""
        self._round_start = time.perf_counter()
        self._sent_model = list(arrays.to_numpy_ndarrays())
        messages = list(super().configure_train(server_round, arrays, config, grid))  # type: ignore[misc]
        if not messages:
            self._fail(f"round {server_round}: no node sampled")
        self.recorder.update(
            server_round,
            {
                "num_sampled": len(messages),
                "bytes_down": sum(_record_bytes(m.content) for m in messages),
            },
        )
        return messages

    def aggregate_train(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """Aggregate the content replies in partition-id order; record the round."""
        replies = list(replies)
        failures = [m for m in replies if m.has_error()]
        ordered = sorted((m for m in replies if not m.has_error()), key=_partition_key)
        reasons = [f"node {m.metadata.src_node_id}: {m.error.reason}" for m in failures[:5]]
        if not ordered:
            self._fail(
                f"round {server_round}: all {len(failures)} clients failed: {'; '.join(reasons)}"
            )
        arrays, metrics = super().aggregate_train(server_round, ordered)  # type: ignore[misc]
        if arrays is None:
            self._fail(f"round {server_round}: the strategy produced no model (metrics {metrics})")
        z = list(arrays.to_numpy_ndarrays())
        fit = dict(metrics or {})
        record: dict[str, Any] = {
            "num_results": len(ordered),
            "num_failures": len(failures),
            "bytes_up": sum(_record_bytes(m.content) for m in ordered),
            "round_seconds": time.perf_counter() - self._round_start,
            # FedADMMClientDuals' replies are contribution changes, not models.
            "client_drift": None
            if isinstance(self, FedADMMClientDuals)
            else weighted_drift(
                z,
                [
                    (int(_metrics_of(m.content).get(NUM_EXAMPLES, 0)), _arrays_of(m.content))
                    for m in ordered
                ],
            ),
            "model_change": distance(z, self._sent_model),
            "fit_metrics": fit,
        }
        if failures:
            record["failure_reasons"] = reasons
        record.update({name: fit[key] for key, name in FIT_FIELDS.items() if key in fit})
        self.recorder.update(server_round, record)
        return arrays, metrics


class PartitionSampled(RecordingMixin):
    """Strategies (the Message-API translator) drawing train nodes with `PartitionSampler`."""

    sampler: PartitionSampler

    def _sample(
        self, grid: Grid, server_round: int, fraction: float, minimum: int, train: bool = False
    ) -> list[int]:
        """Draw the train sample as the legacy path does (evaluation samples as FedADMM)."""
        if not train:
            return super()._sample(grid, server_round, fraction, minimum, train)  # type: ignore[misc,no-any-return]
        sampled = self.sampler.sample(
            grid,
            server_round,
            fraction,
            minimum,
            self.min_available_nodes,  # type: ignore[attr-defined]
        )
        self.round.connect(list(self.sampler.connected))  # type: ignore[attr-defined]
        return sampled


class RecordingFedADMM(PartitionSampled, FedADMM):
    """`flwr_admm.serverapp.FedADMM`, recorded; train nodes drawn by `PartitionSampler`."""


class RecordingFedADMMClientDuals(PartitionSampled, FedADMMClientDuals):
    """`flwr_admm.serverapp.FedADMMClientDuals`, recorded; sampled as `RecordingFedADMM`."""


class RecordingFedAvg(RecordingMixin, SeededFedAvg):
    """Flower's Message-API `FedAvg` (seeded sample), recorded."""


class RecordingFedProx(RecordingMixin, SeededFedProx):
    """Flower's Message-API `FedProx` (seeded sample), recorded."""


class RecordingFedNova(PartitionSampled, FedNova):
    """`flwr_admm.serverapp.FedNova`, recorded; sampled as `RecordingFedADMM`."""


class RecordingSCAFFOLD(PartitionSampled, SCAFFOLD):
    """`flwr_admm.serverapp.SCAFFOLD`, recorded (drift: y_i, the first record)."""


class RecordingFedDyn(PartitionSampled, FedDyn):
    """`flwr_admm.serverapp.FedDyn`, recorded; sampled as `RecordingFedADMM`."""


def build_message_strategy(settings: RunSettings, task: Task, recorder: RunRecorder) -> Strategy:
    """Return the configured Message-API strategy, sampling as many nodes as legacy."""
    n = task.data.num_clients
    # Flower's FedAvg sizes its sample from the nodes connected before it waits; a
    # min_train_nodes of the intended count avoids sampling fewer in round 1.
    count = min(n, max(settings.min_fit_clients, int(n * settings.fraction_fit)))
    common: dict[str, Any] = {
        "fraction_train": settings.fraction_fit,
        "fraction_evaluate": 0.0,
        "min_train_nodes": count,
        "min_evaluate_nodes": 1,
        "min_available_nodes": n,
        "train_metrics_aggr_fn": train_metrics,
    }
    clients = ClientPolicy(key_binding=settings.key_binding)
    strategy: (
        RecordingFedADMM
        | RecordingFedADMMClientDuals
        | RecordingFedAvg
        | RecordingFedProx
        | RecordingFedNova
        | RecordingSCAFFOLD
        | RecordingFedDyn
    )
    if settings.strategy == "fedadmm":
        strategy = RecordingFedADMM(
            **forms.fedadmm_keywords(settings),
            sampling_seed=settings.seed,
            clients=clients,
            checkpoint=settings.checkpoint.checkpointing(),  # checkpoint-dir, -every, resume
            **common,
        )
    elif settings.strategy == "fedadmm-client-duals":
        strategy = RecordingFedADMMClientDuals(
            **settings.form.strategy_kwargs({"rho": settings.rho}),
            sampling_seed=settings.seed,
            clients=clients,
            checkpoint=settings.checkpoint.checkpointing(),
            **common,
        )
    elif settings.strategy == "fedprox":
        strategy = RecordingFedProx(proximal_mu=settings.proximal_mu, **common)
    elif settings.strategy == "fedavg":
        strategy = RecordingFedAvg(**common)
    elif settings.strategy == "fednova":
        strategy = RecordingFedNova(**common)
    elif settings.strategy == "scaffold":
        strategy = RecordingSCAFFOLD(
            server_learning_rate=settings.server_learning_rate, clients=clients, **common
        )
    elif settings.strategy == "feddyn":
        strategy = RecordingFedDyn(alpha=settings.feddyn_alpha, clients=clients, **common)
    else:
        raise ValueError(
            f"run config 'strategy': {settings.strategy!r} has no Message-API strategy"
        )
    strategy.recorder = recorder
    strategy.sampler = PartitionSampler(settings.seed, settings.client_wait_seconds)
    assert isinstance(strategy, Strategy)
    return strategy


def make_evaluate_fn(
    evaluator: Evaluator, recorder: RunRecorder
) -> Callable[[int, ArrayRecord], MetricRecord | None]:
    """Return ``evaluate_fn(round, arrays)``: centralized evaluation, recorded."""

    def evaluate_fn(server_round: int, arrays: ArrayRecord) -> MetricRecord | None:
        start = time.perf_counter()
        _, metrics = evaluator(server_round, list(arrays.to_numpy_ndarrays()), {})
        record_evaluation(recorder, server_round, metrics, time.perf_counter() - start)
        return MetricRecord(
            {
                k: float(v)
                for k, v in metrics.items()
                if isinstance(v, int | float) and not k.startswith("client_auc_")
            }
        )

    return evaluate_fn


def wait_for_nodes(grid: Grid, num_nodes: int, wait_seconds: float) -> None:
    """Wait until `num_nodes` nodes are connected; raise after `wait_seconds`."""
    deadline = time.monotonic() + wait_seconds
    connected = len(list(grid.get_node_ids()))
    while connected < num_nodes:
        if time.monotonic() > deadline:
            raise RuntimeError(
                f"only {connected} of {num_nodes} nodes connected within "
                f"client-wait-seconds={wait_seconds:g}"
            )
        time.sleep(0.5)
        connected = len(list(grid.get_node_ids()))


def run_message_api(
    grid: Grid, settings: RunSettings, task: Task, evaluator: Evaluator, recorder: RunRecorder
) -> None:
    """Run `settings.num_server_rounds` rounds with ``Strategy.start``; fail loudly."""
    model = task.make_model()
    initial = [np.asarray(a) for a in model.init_params(settings.seed)]
    names = getattr(model, "tensor_names", None)  # framework=torch: the state_dict's names
    arrays = (
        ArrayRecord(initial)
        if names is None
        else ArrayRecord({n: Array(a) for n, a in zip(names, initial, strict=True)})
    )
    try:
        strategy = build_message_strategy(settings, task, recorder)  # resume: loads
        # resume: the checkpoint's rounds are done; round 0 evaluates its z (recorded
        # as the checkpoint's round) and the run ends at num-server-rounds
        recorder.offset = int(getattr(strategy, "last_round", 0))
        num_rounds = remaining_rounds(settings.num_server_rounds, recorder.offset)
        if recorder.offset:
            assert isinstance(strategy, FedADMM | FedADMMClientDuals)
            arrays = strategy.resumed_arrays()  # the checkpoint's z, as it sends it
        wait_for_nodes(grid, task.data.num_clients, settings.client_wait_seconds)
        strategy.start(
            grid=grid,
            initial_arrays=arrays,
            num_rounds=num_rounds,
            timeout=settings.round_timeout or NO_LIMIT,
            train_config=ConfigRecord(fit_config(settings)),
            evaluate_config=ConfigRecord(),
            evaluate_fn=make_evaluate_fn(evaluator, recorder),
        )
    except Exception as error:
        if recorder.status != STATUS_FAILED:
            recorder.fail("", error)
        raise
