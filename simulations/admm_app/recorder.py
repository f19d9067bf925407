"""Per-round records of a run, written as JSON/CSV, and a strategy wrapper that feeds them.

`RecordingStrategy` wraps any legacy Flower strategy. Per round it records the bytes
sent down and up (byte lengths of the serialized `Parameters.tensors`), the wall time
of the fit round, the number of results/failures, the inner strategy's fit metrics
(FedADMM: primal/dual residuals, rho), the client drift sqrt(sum_i p_i ||w_i - z'||^2)
and the centralized evaluation. Results are sorted by partition-id before
aggregation, so every strategy sums in a fixed order and reruns are bit-identical.

Failures are loud: a round with no sampled client, no result, or no aggregate, and
any exception inside the strategy, writes ``<stem>.error.json`` next to the results,
marks the JSON ``"status": "failed"`` and raises, which fails the Flower run. The
marker holds the exception's type (``"error"``: e.g. ``RunDivergedError``, the
strategies' divergence watchdog), its message and the traceback.
"""

from __future__ import annotations

import csv
import json
import math
import time
import traceback
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
from flwr.common import (
    EvaluateIns,
    EvaluateRes,
    FitIns,
    FitRes,
    Parameters,
    Scalar,
    parameters_to_ndarrays,
)
from flwr.server.client_manager import ClientManager
from flwr.server.client_proxy import ClientProxy
from flwr.server.strategy import Strategy

from flwr_admm.server import SCAFFOLD
from flwr_admm.server.client_duals import FedADMMClientDuals

T = TypeVar("T")
STATUS_RUNNING, STATUS_COMPLETE, STATUS_FAILED = "running", "complete", "failed"
FIT_FIELDS = {
    "rho": "rho",
    "primal_residual": "primal_residual",
    "previous_primal_residual": "previous_primal_residual",  # FedADMMClientDuals
    "dual_residual": "dual_residual",
    "num_state_mismatch": "num_state_mismatch",
    "train_loss": "train_loss",
    "tau_eff": "tau_eff",
    "num_rejected": "num_rejected",
    "mean_local_steps": "mean_local_steps",
}


def result_paths(task_dir: Path, stem: str) -> dict[str, Path]:
    """Where a run writes its JSON, CSV and error marker."""
    return {
        "json": task_dir / f"{stem}.json",
        "csv": task_dir / f"{stem}.csv",
        "error": task_dir / f"{stem}.error.json",
    }


class RunRecorder:
    """Collects round records and writes ``<stem>.json`` / ``.csv`` atomically."""

    def __init__(
        self,
        task_dir: Path,
        stem: str,
        header: dict[str, Any],
        num_rounds: int,
        write_every: int = 10,
    ) -> None:
        self.paths = result_paths(task_dir, stem)
        self.header = header
        self.num_rounds = num_rounds
        self.write_every = write_every
        self.rounds: dict[int, dict[str, Any]] = {}
        self.status = STATUS_RUNNING
        # Called with the final document once the last round is written (e.g. plots).
        self.on_complete: Callable[[dict[str, Any]], None] | None = None
        self.started = time.perf_counter()
        # Rounds done before a resume: Flower counts a resumed run's rounds from 1 (its
        # round 0 evaluates the checkpoint's z), recorded here as offset + that round.
        self.offset = 0
        task_dir.mkdir(parents=True, exist_ok=True)
        for path in self.paths.values():
            path.unlink(missing_ok=True)

    def update(self, server_round: int, values: dict[str, Any]) -> None:
        """Merge `values` into the record of `server_round`."""
        server_round += self.offset
        record = self.rounds.setdefault(server_round, {"round": server_round})
        record.update(values)

    def elapsed(self) -> float:
        """Seconds since the recorder was created."""
        return time.perf_counter() - self.started

    def end_of_round(self, server_round: int) -> None:
        """Write periodically, and for good after the last round."""
        server_round += self.offset
        if server_round >= self.num_rounds:
            self.status = STATUS_COMPLETE
            self.write()
            if self.on_complete is not None:
                self.on_complete(_jsonable(self.document()))
        elif server_round % self.write_every == 0:
            self.write()

    def fail(self, message: str, error: BaseException | None = None) -> None:
        """Write the error marker and the partial results (`error`: the exception raised)."""
        self.status = STATUS_FAILED
        raised = {}
        if error is not None:
            message = f"{message}{type(error).__name__}: {error}"
            raised = {"error": type(error).__name__, "traceback": traceback.format_exc()}
        marker = {"message": message, **raised, "stem": self.paths["json"].stem, **self.header}
        _atomic_write(self.paths["error"], json.dumps(marker, indent=2))
        self.write()

    def document(self) -> dict[str, Any]:
        """The JSON document: header, status and round records in order."""
        rounds = [self.rounds[k] for k in sorted(self.rounds)]
        return {
            **self.header,
            "status": self.status,
            "num_rounds": self.num_rounds,
            **({"resumed_after_round": self.offset} if self.offset else {}),
            "rounds_recorded": max(self.rounds, default=0),
            "elapsed_seconds": self.elapsed(),
            "rounds": rounds,
        }

    def write(self) -> None:
        """JSON (nested) and CSV (flat: client AUCs and fit metrics as columns)."""
        document = _jsonable(self.document())
        _atomic_write(self.paths["json"], json.dumps(document, indent=1, allow_nan=False))
        rows = [_flatten(r) for r in document["rounds"]]
        columns: list[str] = []
        for row in rows:
            columns.extend(c for c in row if c not in columns)
        tmp = self.paths["csv"].with_suffix(".csv.tmp")
        with tmp.open("w", newline="") as handle:
            writer = csv.DictWriter(handle, fieldnames=columns)
            writer.writeheader()
            writer.writerows(rows)
        tmp.replace(self.paths["csv"])


def _atomic_write(path: Path, text: str) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(text)
    tmp.replace(path)


def _jsonable(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def _flatten(record: dict[str, Any]) -> dict[str, Any]:
    flat = {k: v for k, v in record.items() if not isinstance(v, dict)}
    for key, value in record.items():
        if isinstance(value, dict):
            flat.update({f"{key}.{k}": v for k, v in value.items()})
    return flat


def partition_key(proxy: ClientProxy, res: FitRes) -> tuple[int, str]:
    """Sort key of a reply: its reported partition-id, then its cid."""
    pid = res.metrics.get("partition-id")
    return (int(pid) if isinstance(pid, int | float) else 1 << 30, proxy.cid)


def tensor_bytes(parameters: Parameters) -> int:
    """Size of the serialized tensors as they travel."""
    return int(sum(len(t) for t in parameters.tensors))


class RecordingStrategy(Strategy):
    """Delegate to `inner` and record what every round cost and achieved."""

    def __init__(self, inner: Strategy, recorder: RunRecorder) -> None:
        super().__init__()
        self.inner = inner
        self.recorder = recorder
        self._round_start = 0.0
        self._sent: Parameters | None = None

    def __repr__(self) -> str:
        return f"RecordingStrategy({self.inner!r})"

    def _guard(self, what: str, call: Callable[[], T]) -> T:
        try:
            return call()
        except Exception as error:
            if self.recorder.status != STATUS_FAILED:
                self.recorder.fail(f"{what}: ", error)
            raise

    def _fail(self, message: str) -> None:
        self.recorder.fail(message)
        raise RuntimeError(message)

    def initialize_parameters(self, client_manager: ClientManager) -> Parameters | None:
        """Delegate."""
        return self._guard(
            "initialize_parameters", lambda: self.inner.initialize_parameters(client_manager)
        )

    def configure_fit(
        self, server_round: int, parameters: Parameters, client_manager: ClientManager
    ) -> list[tuple[ClientProxy, FitIns]]:
        """Delegate; record bytes sent down. No client sampled is an error."""
        self._round_start = time.perf_counter()
        self._sent = parameters
        instructions = self._guard(
            "configure_fit",
            lambda: self.inner.configure_fit(server_round, parameters, client_manager),
        )
        if not instructions:
            self._fail(
                f"round {server_round}: no client sampled "
                f"({client_manager.num_available()} available)"
            )
        self.recorder.update(
            server_round,
            {
                "num_sampled": len(instructions),
                "bytes_down": sum(tensor_bytes(ins.parameters) for _, ins in instructions),
            },
        )
        return instructions

    def aggregate_fit(
        self,
        server_round: int,
        results: list[tuple[ClientProxy, FitRes]],
        failures: list[tuple[ClientProxy, FitRes] | BaseException],
    ) -> tuple[Parameters | None, dict[str, Scalar]]:
        """Aggregate in partition-id order; record bytes up, drift, time and metrics."""
        ordered = sorted(results, key=lambda item: partition_key(*item))
        if not ordered:
            reasons = "; ".join(_failure_text(f) for f in failures[:3])
            self._fail(f"round {server_round}: all {len(failures)} clients failed: {reasons}")
        parameters, metrics = self._guard(
            "aggregate_fit", lambda: self.inner.aggregate_fit(server_round, ordered, failures)
        )
        if parameters is None:
            self._fail(
                f"round {server_round}: the strategy produced no model "
                f"(metrics {metrics}, failures {len(failures)})"
            )
        assert parameters is not None and self._sent is not None
        record: dict[str, Any] = {
            "num_results": len(ordered),
            "num_failures": len(failures),
            "bytes_up": sum(tensor_bytes(res.parameters) for _, res in ordered),
            "round_seconds": time.perf_counter() - self._round_start,
            # FedADMMClientDuals' replies are contribution changes, not models.
            "client_drift": None
            if isinstance(self.inner, FedADMMClientDuals)
            else client_drift(parameters, ordered, isinstance(self.inner, SCAFFOLD)),
            "model_change": _distance(
                parameters_to_ndarrays(parameters), parameters_to_ndarrays(self._sent)
            ),
            "fit_metrics": dict(metrics),
        }
        if failures:
            record["failure_reasons"] = [_failure_text(f) for f in failures[:5]]
        record.update({name: metrics[key] for key, name in FIT_FIELDS.items() if key in metrics})
        self.recorder.update(server_round, record)
        return parameters, metrics

    def configure_evaluate(
        self,
        server_round: int,
        parameters: Parameters,
        client_manager: ClientManager,
    ) -> list[tuple[ClientProxy, EvaluateIns]]:
        """Delegate."""
        return self._guard(
            "configure_evaluate",
            lambda: self.inner.configure_evaluate(server_round, parameters, client_manager),
        )

    def aggregate_evaluate(
        self,
        server_round: int,
        results: list[tuple[ClientProxy, EvaluateRes]],
        failures: list[tuple[ClientProxy, EvaluateRes] | BaseException],
    ) -> tuple[float | None, dict[str, Scalar]]:
        """Delegate."""
        return self._guard(
            "aggregate_evaluate",
            lambda: self.inner.aggregate_evaluate(server_round, results, failures),
        )

    def evaluate(
        self, server_round: int, parameters: Parameters
    ) -> tuple[float, dict[str, Scalar]] | None:
        """Centralized evaluation of z (round 0 = initial model); writes the files."""
        start = time.perf_counter()
        result = self._guard("evaluate", lambda: self.inner.evaluate(server_round, parameters))
        if result is None:
            self._fail(f"round {server_round}: centralized evaluation returned nothing")
        assert result is not None
        loss, metrics = result
        record_evaluation(self.recorder, server_round, metrics, time.perf_counter() - start)
        return loss, metrics


def record_evaluation(
    recorder: RunRecorder, server_round: int, metrics: Mapping[str, Any], seconds: float
) -> None:
    """Record a centralized evaluation (client AUCs nested) and end the round."""
    client_auc = {
        k.removeprefix("client_auc_"): v for k, v in metrics.items() if k.startswith("client_auc_")
    }
    values: dict[str, Any] = {k: v for k, v in metrics.items() if not k.startswith("client_auc_")}
    if client_auc:
        values["client_auc"] = client_auc
    values.update({"eval_seconds": seconds, "elapsed_seconds": recorder.elapsed()})
    recorder.update(server_round, values)
    recorder.end_of_round(server_round)


def client_drift(
    parameters: Parameters, results: list[tuple[ClientProxy, FitRes]], leading: bool = False
) -> float:
    """sqrt(sum_i p_i ||w_i - z'||^2) over the replies (consensus disagreement).

    With `leading`, w_i is the reply's first len(z') arrays (SCAFFOLD's y_i before its
    control-variate change).
    """
    z = parameters_to_ndarrays(parameters)
    replies = [(res.num_examples, parameters_to_ndarrays(res.parameters)) for _, res in results]
    if leading:
        replies = [(n, w[: len(z)]) for n, w in replies]
    return weighted_drift(z, replies)


def weighted_drift(z: list[Any], replies: list[tuple[int, list[Any]]]) -> float:
    """sqrt(sum_i p_i ||w_i - z||^2) for replies (n_i, w_i); misshapen w_i are skipped."""
    total = float(sum(n for n, _ in replies))
    value = 0.0
    for n, w in replies:
        if len(w) != len(z) or any(np.shape(a) != np.shape(b) for a, b in zip(w, z, strict=True)):
            continue  # rejected by the strategy anyway
        value += n / total * _distance(w, z) ** 2
    return math.sqrt(value)


def distance(a: list[Any], b: list[Any]) -> float:
    """Euclidean distance between two lists of arrays."""
    return _distance(a, b)


def _distance(a: list[Any], b: list[Any]) -> float:
    return math.sqrt(
        sum(
            float(np.sum((np.asarray(x, dtype=np.float64) - np.asarray(y, dtype=np.float64)) ** 2))
            for x, y in zip(a, b, strict=True)
        )
    )


def _failure_text(failure: tuple[ClientProxy, FitRes] | BaseException) -> str:
    if isinstance(failure, BaseException):
        return repr(failure)
    proxy, res = failure
    return f"cid {proxy.cid}: {res.status.code.name} {res.status.message}"
