"""Scale, engine part: 1,000 virtual SuperNodes in Flower's Ray simulation engine.

Each (strategy, fraction) run is its own subprocess
(``python -m benchmarks.scale_engine --worker NAME --fraction F``), so every Ray
instance starts clean and is shut down when the process exits; runs go FedAvg,
FedADMM, FedADMMClientDuals for f = 1%, then for f = 10%. The task and clients are
`benchmarks.scale`'s. A round's time is the gap between consecutive ``evaluate_fn``
calls (the legacy server makes one per round after aggregation); round 1 (Ray start,
actor warm-up) is dropped. Ratios are against FedAvg's run of the same f.

    python -m benchmarks.scale_engine [--quick]   (also run by benchmarks.scale)
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.common import format_table
from benchmarks.engine import BACKEND_CONFIG, timed_run_simulation, worker_env

NUM_SUPERNODES = 1000


def run_worker(name: str, fraction: float, rounds: int, supernodes: int) -> dict[str, Any]:
    """One `run_simulation`; per-round wall times and the server process's max RSS."""
    import resource

    from flwr.client import Client
    from flwr.common import Context, NDArrays, Scalar

    from benchmarks.scale import client_fn, make_strategy

    stamps: list[float] = []

    def evaluate_fn(server_round: int, parameters: NDArrays, config: dict[str, Scalar]) -> None:
        stamps.append(time.perf_counter())

    strategy = make_strategy(name, supernodes, fraction, evaluate_fn=evaluate_fn)

    def client_app_fn(context: Context) -> Client:
        return client_fn(context).to_client()

    durations, total = timed_run_simulation(strategy, client_app_fn, supernodes, rounds, stamps)
    return {
        "strategy": name,
        "fraction": fraction,
        "round_seconds": durations,
        "total_seconds": total,
        "server_max_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }


def spawn(name: str, fraction: float, rounds: int, supernodes: int) -> dict[str, Any]:
    """Run one worker subprocess and return its JSON result."""
    root = Path(__file__).resolve().parent.parent
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "result.json"
        command = [sys.executable, "-m", "benchmarks.scale_engine", "--worker", name]
        command += ["--fraction", str(fraction), "--rounds", str(rounds)]
        command += ["--supernodes", str(supernodes), "--result-file", str(out)]
        started = time.perf_counter()
        done = subprocess.run(
            command, cwd=root, env=worker_env(), capture_output=True, text=True, timeout=1800
        )
        if done.returncode != 0 or not out.exists():
            log = done.stdout[-2000:] + done.stderr[-3000:]
            raise RuntimeError(f"scale engine worker {name} f={fraction} failed:\n{log}")
        result: dict[str, Any] = json.loads(out.read_text())
    result["process_seconds"] = time.perf_counter() - started
    timed = result["round_seconds"][1:]
    result["mean_round_seconds"] = sum(timed) / len(timed)
    return result


def engine_part(*, quick: bool) -> dict[str, Any]:
    """All (f, strategy) runs, the table and ratios against FedAvg of the same f."""
    from benchmarks.scale import FRACTIONS, STRATEGIES

    supernodes = 50 if quick else NUM_SUPERNODES
    rounds = 3 if quick else 6
    fractions = FRACTIONS[-1:] if quick else FRACTIONS
    runs = []
    for fraction in fractions:
        for name in STRATEGIES:
            run = spawn(name, fraction, rounds, supernodes)
            runs.append(run)
            print(
                f"engine N={supernodes} f={fraction} {name}: {run['mean_round_seconds']:.3f} "
                f"s/round (process {run['process_seconds']:.1f} s)",
                flush=True,
            )
    for run in runs:
        base = next(
            r for r in runs if r["strategy"] == "FedAvg" and r["fraction"] == run["fraction"]
        )
        run["ratio_vs_fedavg"] = run["mean_round_seconds"] / base["mean_round_seconds"]
    print(
        "\n"
        + format_table(
            [
                "SuperNodes",
                "f",
                "strategy",
                "s/round (mean)",
                "x FedAvg",
                "process s",
                "max RSS MiB",
            ],
            [
                [
                    supernodes,
                    r["fraction"],
                    r["strategy"],
                    f"{r['mean_round_seconds']:.3f}",
                    f"{r['ratio_vs_fedavg']:.3f}",
                    f"{r['process_seconds']:.1f}",
                    f"{r['server_max_rss_mib']:.0f}",
                ]
                for r in runs
            ],
        )
    )
    return {
        "supernodes": supernodes,
        "rounds": rounds,
        "backend_config": BACKEND_CONFIG,
        "runs": runs,
    }


def main(argv: list[str] | None = None) -> None:
    """Worker entry point (or the engine part alone)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--worker")
    parser.add_argument("--fraction", type=float, default=0.1)
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--supernodes", type=int, default=NUM_SUPERNODES)
    parser.add_argument("--result-file", type=Path)
    args = parser.parse_args(argv)
    if args.worker is None:
        engine_part(quick=args.quick)
        return
    result = run_worker(args.worker, args.fraction, args.rounds, args.supernodes)
    args.result_file.write_text(json.dumps(result))


if __name__ == "__main__":
    main()
