"""The CNN task: Flower's PyTorch quickstart on offline digits, every strategy, in process.

The workload most Flower users run: the quickstart's CNN trained by the user's own
optimizer (SGD lr 0.1 with momentum 0.9, minibatches of 32, one local epoch; or Adam
lr 1e-3; or a BatchNorm layer), 10 nodes with a Dirichlet(0.1) label split, 30
rounds; every node trains every round, or 3 of the 10 for 60 rounds
(``cnn-sgd-partial``, momentum SGD). It runs the app of ``examples/quickstart-pytorch``
itself (its `make_strategy`, its ClientApp, its data) on
`flwr_admm.serverapp.testing.InProcessGrid` instead of Flower's engine, so each run is
deterministic (Python's `random`, which Flower's FedAvg samples with, is seeded per
run) and takes seconds. ``flwr run examples/quickstart-pytorch`` runs the same app in
Flower's engine (``examples/quickstart-pytorch/compare.py``).

Rows: Flower's FedAvg and FedProx(0.1); FedADMM with its defaults (the linearized form,
``Linearized()``) and with the prox form's (``form="prox"``), each with `TorchADMM` and
with a stock FedProx handler; FedADMM's linearized form with `TorchADMM`
(``Linearized()``, and the convex recipe `LINEARIZED_CONVEX`); `FedADMMClientDuals` in
both forms; SCAFFOLD and FedDyn(0.1).
Columns: final central accuracy per seed, the round it first reaches 90 % (- = never),
and the mean.

    python -m benchmarks.cnn [--quick] [--tasks cnn-sgd,cnn-sgd-partial,cnn-adam,cnn-bn]
        [--seeds 0,1,2]
        [--rows "FedAvg;FedADMM linearized, TorchADMM"]   # row labels, ";"-separated
"""

from __future__ import annotations

import functools
import random
import sys
import tempfile
import time
import tomllib
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks.common import base_parser, format_table, quiet_flower, write_json

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "quickstart-pytorch"
# task -> run-config overrides of the example's pyproject.toml
TASKS: dict[str, dict[str, Any]] = {
    "cnn-sgd": {},
    "cnn-sgd-partial": {"fraction-train": 0.3},  # 3 of the 10 nodes train a round
    "cnn-adam": {"optimizer": "adam"},
    "cnn-bn": {"batch-norm": True},
}
ROUNDS_FACTOR = {"cnn-sgd-partial": 2}  # a third of the nodes a round: twice the rounds
# row label -> run-config overrides
ROWS: dict[str, dict[str, Any]] = {
    "FedAvg": {"strategy": "fedavg"},
    "FedProx (mu 0.1)": {"strategy": "fedprox"},
    "FedADMM (defaults), TorchADMM": {"strategy": "fedadmm", "handler": "torchadmm"},
    "FedADMM (defaults), stock FedProx handler": {"strategy": "fedadmm", "handler": "fedprox"},
    "FedADMM prox form, TorchADMM": {"strategy": "fedadmm-prox", "handler": "torchadmm"},
    "FedADMM prox form, stock FedProx handler": {"strategy": "fedadmm-prox", "handler": "fedprox"},
    "FedADMM prox form (dual step 0.2), TorchADMM": {"strategy": "fedadmm-prox", "dual-step": 0.2},
    "FedADMM linearized, TorchADMM": {"strategy": "fedadmm-linearized", "handler": "torchadmm"},
    "FedADMM linearized (dual step 0.2), TorchADMM": {
        "strategy": "fedadmm-linearized",
        "dual-step": 0.2,
    },
    "FedADMM linearized (convex recipe), TorchADMM": {"strategy": "fedadmm-linearized-convex"},
    "FedADMMClientDuals (defaults), TorchADMM": {"strategy": "fedadmm-client-duals"},
    "FedADMMClientDuals prox form, TorchADMM": {"strategy": "fedadmm-client-duals-prox"},
    "FedADMMClientDuals linearized, TorchADMM": {"strategy": "fedadmm-client-duals-linearized"},
    "SCAFFOLD": {"strategy": "scaffold"},
    "FedDyn (alpha 0.1)": {"strategy": "feddyn"},
}
TARGET = 0.9


def run_config(overrides: dict[str, Any]) -> dict[str, Any]:
    """Return the example's run config (pyproject.toml) with `overrides`."""
    project = tomllib.loads((EXAMPLE / "pyproject.toml").read_text())
    return {**project["tool"]["flwr"]["app"]["config"], **overrides}


def example_on_path() -> None:
    """Put the example's package (``quickstart_admm``) on ``sys.path``."""
    if str(EXAMPLE) not in sys.path:
        sys.path.insert(0, str(EXAMPLE))


def run_one(config: dict[str, Any]) -> tuple[list[float], list[int]]:
    """Run the example's strategy on its ClientApp in process.

    Returns the accuracies and the rounds whose start a momentum start moved
    (FedADMM's ``start_momentum`` round metric > 0; none for the other strategies).
    """
    example_on_path()
    import torch
    from flwr.app import ArrayRecord
    from quickstart_admm.client_app import app as client_app
    from quickstart_admm.server_app import CentralEvaluation, make_strategy
    from quickstart_admm.task import Settings, initial_model

    from flwr_admm.serverapp.testing import InProcessGrid, run_strategy

    torch.set_num_threads(1)
    settings = Settings.from_run_config(config)
    random.seed(settings.seed)  # Flower's FedAvg samples with Python's random
    grid = InProcessGrid(client_app, settings.num_partitions)
    for context in grid.contexts.values():
        context.run_config = dict(config)
    evaluation = CentralEvaluation(settings)
    model = initial_model(settings)
    strategy = make_strategy(settings)
    try:
        run_strategy(
            strategy,
            grid,
            ArrayRecord(model.state_dict()),
            settings.num_server_rounds,
            evaluate_fn=evaluation,
        )
    except Exception as error:  # a diverged run: its rounds so far, then it failed
        print(f"  {settings.run_name}: {type(error).__name__}: {error}")
    history = getattr(strategy, "history", [])
    moved = [k for k, h in enumerate(history, 1) if float(h.get("start_momentum", 0.0)) > 0]
    return [float(r["accuracy"]) for r in evaluation.rounds], moved


def first_round(accuracies: list[float], target: float) -> int | None:
    """Return the first round whose accuracy is >= `target` (None: never)."""
    return next((k for k, a in enumerate(accuracies) if a >= target), None)


def run_record(
    seed: int,
    accuracies: list[float],
    rounds: int,
    started: float,
    momentum_rounds: list[int] | None = None,
) -> dict[str, Any]:
    """Return one run's record: its final accuracy (NaN if it stopped early) and curve.

    `momentum_rounds`: the rounds a momentum start moved (kept when there were any).
    """
    return {
        "seed": seed,
        "final": accuracies[-1] if len(accuracies) == rounds + 1 else float("nan"),
        "round_to_target": first_round(accuracies, TARGET),
        "accuracies": accuracies,
        "seconds": time.perf_counter() - started,
        **({"momentum_rounds": momentum_rounds} if momentum_rounds else {}),
    }


def summary(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Return a row: its runs and their mean final accuracy."""
    finals = [float(r["final"]) for r in runs]
    return {"runs": runs, "mean_final": sum(finals) / len(finals)}


def print_table(title: str, rows: dict[str, Any], seeds: list[int]) -> None:
    """Print the rows' final accuracies per seed, their mean and rounds to the target."""
    headers = ["strategy", *(f"seed {s}" for s in seeds), "mean", f"round to {TARGET:g}"]
    table = [
        [
            label,
            *(f"{r['final']:.3f}" for r in row["runs"]),
            f"{row['mean_final']:.3f}",
            " / ".join(str(r["round_to_target"] or "-") for r in row["runs"]),
        ]
        for label, row in rows.items()
    ]
    print(f"\n## {title}")
    print(format_table(headers, table))


def run_task(
    task: str, seeds: list[int], rounds: int, labels: list[str] | None = None
) -> dict[str, Any]:
    """Run every row (or those `labels` name) on `task` over `seeds`; print the table."""
    example_on_path()
    from quickstart_admm.task import REFUSE_BATCH_NORM

    rounds *= ROUNDS_FACTOR.get(task, 1)
    rows: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as out:
        for label, row in ROWS.items():
            if labels is not None and label not in labels:
                continue
            if TASKS[task].get("batch-norm") and row["strategy"] in REFUSE_BATCH_NORM:
                continue  # the example refuses BatchNorm statistics as their weights
            runs: list[dict[str, Any]] = []
            for seed in seeds:
                started = time.perf_counter()
                overrides = {**TASKS[task], **row, "seed": seed, "output-dir": out}
                config = run_config({**overrides, "num-server-rounds": rounds})
                accuracies, moved = run_one(config)
                runs.append(run_record(seed, accuracies, rounds, started, moved))
            rows[label] = summary(runs)
    print_table(f"{task}: final central accuracy after {rounds} rounds", rows, seeds)
    return {"task": task, "rounds": rounds, "seeds": seeds, "rows": rows}


def run_cli(
    argv: list[str] | None,
    doc: str,
    name: str,
    default_tasks: str,
    task_runner: Callable[..., dict[str, Any]],
    rows: tuple[str, ...] = (),
) -> dict[str, Any]:
    """Parse the options, run `task_runner` per task, write JSON.

    ``--tasks --seeds --quick --output``, and ``--rows`` (passed as ``labels=``) when
    `rows` are named.
    """
    parser = base_parser(doc.splitlines()[0])
    parser.add_argument("--tasks", default=default_tasks)
    parser.add_argument("--seeds", default="0,1,2")
    if rows:
        parser.add_argument("--rows", default=None, help="row labels, ';'-separated")
    args = parser.parse_args(argv)
    chosen = getattr(args, "rows", None)
    if chosen is not None:
        labels = chosen.split(";")
        unknown_rows = [label for label in labels if label not in rows]
        if unknown_rows:
            raise ValueError(f"--rows: {unknown_rows} not among {list(rows)}")
        task_runner = functools.partial(task_runner, labels=labels)
    quiet_flower()
    tasks = args.tasks.split(",")
    unknown = [t for t in tasks if t not in TASKS]
    if unknown:
        raise ValueError(f"--tasks: {unknown} not among {list(TASKS)}")
    seeds = [0] if args.quick else [int(s) for s in args.seeds.split(",")]
    rounds = 2 if args.quick else 30
    started = time.perf_counter()
    results = [task_runner(task, seeds, rounds) for task in (tasks[:1] if args.quick else tasks)]
    payload = {"quick": args.quick, "seconds": time.perf_counter() - started, "tasks": results}
    path = write_json(name, payload, args.output)
    print(f"\nwrote {path} ({payload['seconds']:.0f} s)")
    return payload


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Run the CNN tasks, print the tables, write JSON."""
    return run_cli(argv, __doc__, "cnn", ",".join(TASKS), run_task, tuple(ROWS))


if __name__ == "__main__":
    main()
