"""Run the quickstart under several strategies and seeds; print a table, save a plot.

    python examples/quickstart-pytorch/compare.py \
        --strategies fedavg,fedprox,fedadmm,fedadmm-fedprox,scaffold,feddyn \
        --seeds 0,1,2 --rounds 30

One ``flwr run examples/quickstart-pytorch --stream`` per (strategy, seed), 10
simulated nodes of one CPU each, all on one private Flower runtime
(`simulations.launcher.LocalFlower`: a temporary FLWR_HOME, a free port, telemetry
and runtime dependency installation off, the SuperLink started from a neutral
directory and stopped by PID at the end; `flwr_admm` imported from this checkout).
``fedadmm-fedprox`` is FedADMM driven by the stock FedProx handler (run-config
handler = "fedprox"); ``fedadmm-prox[-fedprox]`` the same with ``form="prox"``. A run whose JSON is
missing, incomplete or non-finite is a failure: the script then exits 1.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

APP_DIR = Path(__file__).resolve().parent
ROOT = APP_DIR.parents[1]
sys.path.insert(0, str(ROOT))  # the repository's Flower runtime launcher

from simulations.launcher import LocalFlower  # noqa: E402

# name -> (run-config strategy, handler)
RUNS = {
    "fedavg": ("fedavg", "torchadmm"),
    "fedprox": ("fedprox", "torchadmm"),
    "fedadmm": ("fedadmm", "torchadmm"),
    "fedadmm-fedprox": ("fedadmm", "fedprox"),
    "fedadmm-prox": ("fedadmm-prox", "torchadmm"),
    "fedadmm-prox-fedprox": ("fedadmm-prox", "fedprox"),
    "fedadmm-client-duals": ("fedadmm-client-duals", "torchadmm"),
    "scaffold": ("scaffold", "torchadmm"),
    "feddyn": ("feddyn", "torchadmm"),
}
TARGET = 0.9  # the table's "round of 90%"


class QuickstartFlower(LocalFlower):
    """`LocalFlower` whose processes import `flwr_admm` from this checkout.

    The app's ClientApps and ServerApp run in Ray workers and subprocesses of the
    SuperLink; flwr-admm is not on PyPI, so they find it through PYTHONPATH (the
    checkout's root) whether or not it is installed in the environment.
    """

    @property
    def env(self) -> dict[str, str]:
        """Return `LocalFlower`'s environment plus PYTHONPATH = the repository root."""
        return {**super().env, "PYTHONPATH": str(ROOT)}


@dataclass
class RunResult:
    """One (strategy, seed) run: its accuracies per round, or why it failed."""

    name: str
    seed: int
    accuracy: list[float]
    seconds: float
    problem: str = ""

    @property
    def final(self) -> float | None:
        """Return the last round's central accuracy (None when failed)."""
        return None if self.problem or not self.accuracy else self.accuracy[-1]

    @property
    def round_of_target(self) -> int | None:
        """Return the first round whose accuracy reaches `TARGET`, if any."""
        return next((r for r, a in enumerate(self.accuracy) if a >= TARGET), None)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Parse the command line."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--strategies", default=",".join(RUNS), help=f"from {list(RUNS)}")
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--num-supernodes", type=int, default=10)
    parser.add_argument("--output-dir", type=Path, default=Path("outputs/quickstart-pytorch"))
    parser.add_argument("--timeout", type=float, default=3600.0, help="seconds per run")
    parser.add_argument(
        "--set", action="append", default=[], metavar="KEY=VALUE", help="more run config"
    )
    parser.add_argument(
        "--report-only",
        action="store_true",
        help="run nothing: the table and plot of the records already in --output-dir",
    )
    args = parser.parse_args(argv)
    args.strategies = args.strategies.split(",")
    unknown = [s for s in args.strategies if s not in RUNS]
    if unknown:
        parser.error(f"--strategies: unknown {unknown}; choose from {list(RUNS)}")
    args.seeds = [int(s) for s in args.seeds.split(",")]
    args.extra = {}
    for item in args.set:
        key, _, value = item.partition("=")
        args.extra[key] = tomllib.loads(f"v = {value}")["v"]
    args.output_dir = args.output_dir.resolve()  # the ServerApp runs elsewhere
    return args


def run_config(args: argparse.Namespace, name: str, seed: int) -> dict[str, Any]:
    """Return the run-config overrides of one run."""
    strategy, handler = RUNS[name]
    return {
        **args.extra,
        "strategy": strategy,
        "handler": handler,
        "seed": seed,
        "num-server-rounds": args.rounds,
        "num-partitions": args.num_supernodes,
        "output-dir": str(args.output_dir),
    }


def json_path(output_dir: Path, name: str, seed: int) -> Path:
    """Return where the ServerApp writes the run's record."""
    return output_dir / f"{name}-seed{seed}.json"


def read_result(path: Path, name: str, seed: int, rounds: int, seconds: float) -> RunResult:
    """Read a run's JSON; a missing, unfinished or non-finite record is a problem."""
    if not path.exists():
        return RunResult(name, seed, [], seconds, f"no result file {path}")
    document = json.loads(path.read_text())
    accuracy = []  # the rounds before the first non-finite accuracy or loss
    for row in document["rounds"]:
        if not all(_finite(row[key]) for key in ("accuracy", "loss")):
            break
        accuracy.append(float(row["accuracy"]))
    problem = ""
    if document["status"] != "completed":
        problem = f"{document['status']}: {document['reason']}"
    elif len(accuracy) != rounds + 1 or len(document["rounds"]) != rounds + 1:
        problem = f"{len(accuracy)} finite rounds of {rounds + 1}"
    return RunResult(name, seed, accuracy, seconds, problem)


def _finite(value: Any) -> bool:
    return isinstance(value, int | float) and math.isfinite(value)


def run_all(args: argparse.Namespace) -> list[RunResult]:
    """Run every (strategy, seed) on one private Flower runtime."""
    results = []
    logs = args.output_dir / "logs"
    with QuickstartFlower() as flower:
        for name in args.strategies:
            for seed in args.seeds:
                path = json_path(args.output_dir, name, seed)
                path.unlink(missing_ok=True)  # never read an older run's record
                outcome = flower.run(
                    APP_DIR,
                    run_config(args, name, seed),
                    num_supernodes=args.num_supernodes,
                    log_path=logs / f"{name}-seed{seed}.log",
                    timeout=args.timeout,
                )
                result = read_result(path, name, seed, args.rounds, outcome.seconds)
                if outcome.returncode != 0 and not result.problem:
                    result.problem = f"flwr run exited {outcome.returncode}"
                results.append(result)
                state = result.problem or f"final accuracy {result.final:.4f}"
                print(f"{name} seed {seed}: {state} ({outcome.seconds:.0f} s)", file=sys.stderr)
    return results


def table(results: list[RunResult], seeds: list[int]) -> str:
    """Return the markdown table: final accuracy and round of 90% per seed."""
    header = ["strategy"]
    header += [f"final acc (seed {s})" for s in seeds]
    header += [f"round of {TARGET:.0%} (seed {s})" for s in seeds]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    by_run = {(r.name, r.seed): r for r in results}
    for name in dict.fromkeys(r.name for r in results):
        runs = [by_run[(name, s)] for s in seeds]
        finals = [_final_cell(r) for r in runs]
        reached = [
            "-" if r.round_of_target is None or r.problem else str(r.round_of_target) for r in runs
        ]
        lines.append("| " + " | ".join([name, *finals, *reached]) + " |")
    return "\n".join(lines)


def _final_cell(result: RunResult) -> str:
    """Return the final accuracy, or "failed (round k)" with k its first bad round."""
    if result.final is not None:
        return f"{result.final:.3f}"
    return f"failed (round {len(result.accuracy)})" if result.accuracy else "failed"


def plot(results: list[RunResult], path: Path) -> None:
    """Save central accuracy vs round: seeds as thin lines, their mean as a thick one."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(7, 4.5))
    for index, name in enumerate(dict.fromkeys(r.name for r in results)):
        color = f"C{index}"
        runs = [r.accuracy for r in results if r.name == name and r.accuracy]
        for accuracy in runs:
            axes.plot(accuracy, color=color, linewidth=0.6, alpha=0.5)
        length = min((len(a) for a in runs), default=0)
        if length:
            mean = [sum(a[k] for a in runs) / len(runs) for k in range(length)]
            axes.plot(mean, color=color, linewidth=2.0, label=name)
    axes.axhline(TARGET, color="grey", linewidth=0.5, linestyle="--")
    axes.set(xlabel="round", ylabel="central test accuracy", ylim=(0, 1))
    axes.set_title("quickstart-pytorch on digits, Dirichlet(0.1) over 10 nodes")
    axes.legend(loc="upper left")
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=120)
    plt.close(figure)


def main(argv: list[str] | None = None) -> int:
    """Run, report and plot; return 1 when any run failed."""
    args = parse_args(argv)
    started = time.monotonic()
    if args.report_only:
        results = [
            read_result(json_path(args.output_dir, name, seed), name, seed, args.rounds, 0.0)
            for name in args.strategies
            for seed in args.seeds
        ]
    else:
        results = run_all(args)
    print(table(results, args.seeds))
    figure = args.output_dir / "quickstart_pytorch.png"
    plot(results, figure)
    failed = [f"{r.name} seed {r.seed}: {r.problem}" for r in results if r.problem]
    print(f"\n{len(results)} runs in {time.monotonic() - started:.0f} s; plot {figure}")
    for line in failed:
        print(f"FAILED {line}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
