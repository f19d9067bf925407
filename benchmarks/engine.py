"""Seconds per round in Flower's Ray simulation engine, FedADMM vs FedAvg.

Each run is its own subprocess (``python -m benchmarks.engine --worker NAME``) so every
Ray instance starts clean; runs alternate FedAvg, FedADMM, FedADMM, FedAvg, ...
(--quick starts both at once to stay within a minute: its ratio is a smoke value). The
task is seed-logreg (10 clients, `ADMMClient`, 20 full-batch local steps of lr 1.0,
every client every round, no federated evaluation); FedADMM runs with rho = 0.1.
A round's time is the gap between consecutive ``evaluate_fn`` calls, which the
legacy server makes once per round after aggregation; round 1 (Ray start, actor
warm-up) is dropped and each run contributes the mean of the rest. The mean, not the
median: the engine moves messages by polling every 0.1 s (`InMemoryGrid`'s
``pull_interval`` and the fleet's message pickup), so a round takes 0.2, 0.3 or 0.4 s
and only the average over many rounds resolves a difference below one tick.

    python -m benchmarks.engine [--quick] [--pairs 3] [--rounds 41]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.common import base_parser, format_table, median, write_json

STRATEGIES = ("FedAvg", "FedADMM")
NUM_CLIENTS = 10
RHO = 0.1
FIT_CONFIG = {"learning_rate": 1.0, "local_steps": 20}
BACKEND_CONFIG = {
    "client_resources": {"num_cpus": 1, "num_gpus": 0.0},
    "init_args": {"num_cpus": 2, "include_dashboard": False},
}


def timed_run_simulation(
    strategy: Any, client_fn: Any, num_supernodes: int, rounds: int, stamps: list[float]
) -> tuple[list[float], float]:
    """Run `strategy` in Flower's Ray engine; return the round wall times and the total.

    `stamps` is filled by the strategy's ``evaluate_fn`` (one `time.perf_counter()` per
    call): stamps[0] at the initial parameters (round 0), stamps[k] after round k, so
    the k-th round takes stamps[k] - stamps[k-1]. Raises RuntimeError unless every
    round was timed.
    """
    import numpy as np
    from flwr.client import ClientApp
    from flwr.common import Context
    from flwr.server import ServerApp, ServerAppComponents, ServerConfig
    from flwr.simulation import run_simulation

    def server_fn(context: Context) -> ServerAppComponents:
        return ServerAppComponents(strategy=strategy, config=ServerConfig(num_rounds=rounds))

    started = time.perf_counter()
    run_simulation(
        server_app=ServerApp(server_fn=server_fn),
        client_app=ClientApp(client_fn=client_fn),
        num_supernodes=num_supernodes,
        backend_config=BACKEND_CONFIG,  # type: ignore[arg-type]
    )
    total = time.perf_counter() - started
    durations = np.diff(stamps).tolist()
    if len(durations) != rounds:
        raise RuntimeError(f"expected {rounds} timed rounds, got {len(durations)}")
    return durations, total


def run_worker(strategy_name: str, rounds: int) -> dict[str, Any]:
    """One `run_simulation` of `rounds` rounds; returns per-round wall times."""
    from flwr.client import Client
    from flwr.common import Context, NDArrays, Scalar, ndarrays_to_parameters
    from flwr.server.strategy import FedAvg

    from flwr_admm.client import ADMMClient
    from flwr_admm.data import load_task
    from flwr_admm.server.fedadmm import textbook

    task = load_task("seed-logreg")
    stamps: list[float] = []

    def evaluate_fn(server_round: int, parameters: NDArrays, config: dict[str, Scalar]) -> None:
        stamps.append(time.perf_counter())

    kwargs: dict[str, Any] = {
        "initial_parameters": ndarrays_to_parameters(task.make_model().init_params(0)),
        "evaluate_fn": evaluate_fn,
        "on_fit_config_fn": lambda server_round: dict(FIT_CONFIG),
        "fraction_evaluate": 0.0,
        "min_fit_clients": NUM_CLIENTS,
        "min_available_clients": NUM_CLIENTS,
    }
    strategy = (
        textbook(rho=RHO, **kwargs)  # the measured setting (docs/benchmarks.md)
        if strategy_name == "FedADMM"
        else FedAvg(**kwargs)
    )

    def client_fn(context: Context) -> Client:
        i = int(context.node_config["partition-id"])
        model = task.make_model()
        return ADMMClient(model, task.data.X[i], task.data.y[i], context=context).to_client()

    durations, total = timed_run_simulation(strategy, client_fn, NUM_CLIENTS, rounds, stamps)
    return {"strategy": strategy_name, "round_seconds": durations, "total_seconds": total}


def worker_env() -> dict[str, str]:
    """Environment of a worker: no telemetry, one BLAS thread per process."""
    return {
        **os.environ,
        "FLWR_TELEMETRY_ENABLED": "0",
        # one BLAS thread per Ray actor: 2 actors already fill the 2 cores
        "OPENBLAS_NUM_THREADS": "1",
        "OMP_NUM_THREADS": "1",
        "MKL_NUM_THREADS": "1",
    }


def spawn(names: list[str], rounds: int, *, concurrent: bool) -> list[dict[str, Any]]:
    """Run one worker subprocess per strategy, one after the other or all at once."""
    root = Path(__file__).resolve().parent.parent
    with tempfile.TemporaryDirectory() as tmp:
        jobs = []
        for name in names:
            out = Path(tmp) / f"{name}.json"
            command = [sys.executable, "-m", "benchmarks.engine", "--worker", name]
            command += ["--rounds", str(rounds), "--result-file", str(out)]
            jobs.append((name, out, command))
        started: dict[str, float] = {}
        processes: dict[str, subprocess.Popen[str]] = {}
        results = []
        for name, out, command in jobs:
            started[name] = time.perf_counter()
            processes[name] = subprocess.Popen(
                command,
                cwd=root,
                env=worker_env(),
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
            if not concurrent:
                results.append(_collect(name, out, processes[name], started[name]))
        if concurrent:
            for name, out, _ in jobs:
                results.append(_collect(name, out, processes[name], started[name]))
    return results


def _collect(
    name: str, out: Path, process: subprocess.Popen[str], started: float
) -> dict[str, Any]:
    """Wait for a worker; its JSON result plus the process's wall time."""
    try:
        log, _ = process.communicate(timeout=600)
    except subprocess.TimeoutExpired:
        process.kill()
        raise
    if process.returncode != 0 or not out.exists():
        raise RuntimeError(f"engine worker {name} failed ({process.returncode}):\n{log[-3000:]}")
    result: dict[str, Any] = json.loads(out.read_text())
    result["process_seconds"] = time.perf_counter() - started
    return result


def summarize(runs: list[dict[str, Any]], pairs: int) -> dict[str, Any]:
    """Per-run means (round 1 dropped), per-strategy means and the ratios."""
    per_run: dict[str, list[float]] = {name: [] for name in STRATEGIES}
    for run in runs:
        timed = run["round_seconds"][1:]
        run["mean_round_seconds"] = sum(timed) / len(timed)
        run["median_round_seconds"] = median(timed)
        per_run[run["strategy"]].append(run["mean_round_seconds"])
    means = {name: sum(values) / len(values) for name, values in per_run.items()}
    pair_ratios = []
    for k in range(pairs):
        pair = {r["strategy"]: r["mean_round_seconds"] for r in runs[2 * k : 2 * k + 2]}
        pair_ratios.append(pair["FedADMM"] / pair["FedAvg"])
    return {
        "mean_round_seconds": means,
        "ratio": means["FedADMM"] / means["FedAvg"],
        "pair_ratios": pair_ratios,
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Alternate FedAvg / FedADMM subprocess runs, print the table, write JSON."""
    parser = base_parser(__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=None, help="FedAvg/FedADMM run pairs")
    parser.add_argument("--rounds", type=int, default=None, help="rounds per run")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--result-file", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker is not None:
        rounds = args.rounds or 41
        if args.worker not in STRATEGIES:
            parser.error(f"--worker: must be one of {STRATEGIES}, got {args.worker!r}")
        args.result_file.write_text(json.dumps(run_worker(args.worker, rounds)))
        return {}
    pairs = args.pairs or (1 if args.quick else 3)
    rounds = args.rounds or (3 if args.quick else 41)
    started = time.perf_counter()
    runs: list[dict[str, Any]] = []
    for k in range(pairs):
        order = list(STRATEGIES) if k % 2 == 0 else list(reversed(STRATEGIES))
        runs += spawn(order, rounds, concurrent=args.quick)
        for run in runs[-2:]:
            timed = run["round_seconds"][1:]
            print(
                f"pair {k + 1}: {run['strategy']} {sum(timed) / len(timed):.3f} s/round "
                f"(process {run['process_seconds']:.1f} s)",
                flush=True,
            )
    summary = summarize(runs, pairs)
    if args.quick:
        print("(--quick: both runs overlapped in time, so the ratio is only a smoke value)")
    rows = [
        [
            name,
            len([r for r in runs if r["strategy"] == name]),
            rounds - 1,
            f"{summary['mean_round_seconds'][name]:.3f}",
            f"{median([r['process_seconds'] for r in runs if r['strategy'] == name]):.1f}",
        ]
        for name in STRATEGIES
    ]
    print(
        "\n"
        + format_table(
            ["strategy", "runs", "rounds timed/run", "s/round (mean)", "process s (median)"],
            rows,
        )
    )
    print(
        f"FedADMM / FedAvg seconds per round: {summary['ratio']:.3f} (goal <= 1.05); "
        f"per pair: {', '.join(f'{r:.3f}' for r in summary['pair_ratios'])}"
    )
    payload = {
        "quick": args.quick,
        "concurrent_runs": args.quick,
        "pairs": pairs,
        "rounds": rounds,
        "num_clients": NUM_CLIENTS,
        "fit_config": FIT_CONFIG,
        "rho": RHO,
        "backend_config": BACKEND_CONFIG,
        "seconds": time.perf_counter() - started,
        **summary,
        "runs": runs,
    }
    path = write_json("engine", payload, args.output)
    print(f"wrote {path} ({payload['seconds']:.0f} s)")
    return payload


if __name__ == "__main__":
    main()
