"""Run strategies side by side with real `flwr run`s, then check, plot and summarize.

    python -m simulations.compare --task seed-logreg --strategies fedadmm,fedavg,fedprox \
        --rounds 200 --output-dir outputs [--preset seed] [--api message|legacy] \
        [--run-config 'rho=1.0 ...']

Each strategy is one ``flwr run simulations --stream`` against a private SuperLink
(`simulations.launcher.LocalFlower`: temporary FLWR_HOME, free port, runtime
dependency installation off, stopped by PID afterwards). Since `flwr run` exits 0
even when a run failed, every result file is checked (status, all rounds present,
no client failure, no error marker); the command exits 1 if any is not right, and
prints each failed run's first problem last (a run the strategies' divergence
watchdog stopped: its full `RunDivergedError` message, with what to try).
Writes, under ``output-dir/<task>/``: ``<stem>.json/.csv`` (by the ServerApp),
``<stem>.log`` (the streamed Flower log), PNG plots and ``summary.md``.
"""

from __future__ import annotations

import argparse
import sys
import tomllib
from pathlib import Path
from typing import Any

from .admm_app.evaluation import get_task
from .admm_app.run_config import APIS, STRATEGIES, parse_run_config
from .launcher import APP_DIR, LocalFlower, RunOutcome
from .report import RunResult, check_result, plot_all, summary_markdown

# Settings per preset; anything not listed keeps the app's defaults (pyproject.toml),
# which take the task's recommended learning rate and local work (Task.defaults).
PRESETS: dict[str, dict[str, Any]] = {
    "default": {"rho": 0.1, "proximal-mu": 0.1, "prox-step": "exact", "local-init": "previous"},
    # Seed 000's own settings (its explicit gradient step on the penalized loss).
    "seed": {
        "rho": 0.1,
        "proximal-mu": 0.1,
        "local-steps": 5,
        "learning-rate": 0.02,
        "batch-size": 0,
        "prox-step": "gradient",
        "local-init": "previous",
    },
}
# The default preset pins seed-logreg's comparison: enough local work for client drift
# to matter (20 full-batch steps at lr 1.0), whatever the task's defaults become.
TASK_DEFAULT_PRESETS: dict[str, dict[str, Any]] = {
    "seed-logreg": {"local-steps": 20, "learning-rate": 1.0, "batch-size": 0},
}


def preset_config(preset: str, task: str, overrides: dict[str, Any]) -> dict[str, Any]:
    """Preset values, then the user's overrides (local-steps and local-epochs replace
    each other, so overriding one drops the preset's other)."""
    config = dict(PRESETS[preset])
    if preset == "default":
        config.update(TASK_DEFAULT_PRESETS.get(task, {}))
    for key, other in (("local-steps", "local-epochs"), ("local-epochs", "local-steps")):
        if key in overrides and other not in overrides:
            config.pop(other, None)
    return {**config, **overrides}


def parse_overrides(text: str) -> dict[str, Any]:
    """'k=v k2="s"' (TOML values, bare words taken as strings) -> dict."""
    overrides: dict[str, Any] = {}
    for item in text.split():
        key, sep, raw = item.partition("=")
        if not sep or not key:
            raise ValueError(f"--run-config: expected key=value items, got {item!r}")
        try:
            overrides[key] = tomllib.loads(f"v = {raw}")["v"]
        except tomllib.TOMLDecodeError:
            overrides[key] = raw
    return overrides


def build_parser() -> argparse.ArgumentParser:
    """The command line."""
    parser = argparse.ArgumentParser(
        prog="python -m simulations.compare", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--task", default="seed-logreg")
    parser.add_argument(
        "--strategies",
        default="fedadmm,fedavg,fedprox",
        help=f"comma-separated, from {list(STRATEGIES)}",
    )
    parser.add_argument("--rounds", type=int, default=200)
    parser.add_argument(
        "--api",
        choices=list(APIS),
        default=None,
        help="Flower API of the app (run-config key api; default: the app's default)",
    )
    parser.add_argument("--preset", choices=sorted(PRESETS), default="default")
    parser.add_argument(
        "--run-config",
        default="",
        help="extra app run-config overrides for every strategy: 'k=v ...'",
    )
    parser.add_argument("--output-dir", default="outputs")
    parser.add_argument(
        "--tag",
        default=None,
        help="suffix of result files and plots (default: the preset name, "
        "none for the default preset)",
    )
    parser.add_argument(
        "--num-supernodes", type=int, default=0, help="default: the task's number of clients"
    )
    parser.add_argument("--target-accuracy", type=float, default=None)
    parser.add_argument("--timeout", type=float, default=1800.0, help="seconds per flwr run")
    parser.add_argument(
        "--allow-failures",
        action="store_true",
        help="accept rounds where some (not all) clients failed",
    )
    parser.add_argument(
        "--report-only",
        action="store_true",
        help="do not run; check, plot and summarize existing results",
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run, check, plot, summarize; 0 only if every strategy's results are complete."""
    args = build_parser().parse_args(argv)
    strategies = [s.strip() for s in args.strategies.split(",") if s.strip()]
    bad = [s for s in strategies if s not in STRATEGIES]
    if bad or not strategies:
        raise SystemExit(
            f"--strategies: must be a comma-separated subset of "
            f"{list(STRATEGIES)}, got {args.strategies!r}"
        )
    tag = args.tag if args.tag is not None else ("" if args.preset == "default" else args.preset)
    output_dir = Path(args.output_dir).expanduser().resolve()
    try:  # validate everything before starting any process
        overrides = parse_overrides(args.run_config)
        base = {
            **preset_config(args.preset, args.task, overrides),
            "task": args.task,
            "num-server-rounds": args.rounds,
            "output-dir": str(output_dir),
            "run-tag": tag,
        }
        if args.api is not None:
            base["api"] = args.api
        configs = {s: {**base, "strategy": s} for s in strategies}
        settings = {s: parse_run_config(c) for s, c in configs.items()}
    except ValueError as error:
        raise SystemExit(str(error)) from None
    first = next(iter(settings.values()))
    task = get_task(first.task, first.seed, first.task_options())
    num_supernodes = args.num_supernodes or task.data.num_clients
    task_dir = output_dir / args.task
    outcomes: dict[str, RunOutcome] = {}
    if not args.report_only:
        outcomes = run_all(configs, settings, task_dir, num_supernodes, args.timeout)
    results = []
    for strategy, s in settings.items():
        document, problems = check_result(
            task_dir, s.stem, args.rounds, allow_failures=args.allow_failures
        )
        outcome = outcomes.get(strategy)
        if outcome is not None and outcome.returncode != 0:
            problems.insert(
                0, f"flwr run exited with code {outcome.returncode} (log {outcome.log_path})"
            )
        results.append(
            RunResult(s.stem, document or {}, outcome.seconds if outcome else None, problems)
        )
    prefix = f"{tag}-" if tag else ""
    plot_all([r for r in results if r.document], task_dir, prefix)
    title = f"{args.task}: {', '.join(strategies)} ({args.rounds} rounds, preset {args.preset})"
    summary = summary_markdown(results, title=title, target_accuracy=args.target_accuracy)
    summary_path = task_dir / f"summary{'-' + tag if tag else ''}.md"
    summary_path.write_text(summary)
    print(summary)
    print(f"wrote {summary_path} and plots in {task_dir}")
    failed = [r for r in results if r.problems]
    if failed:
        print(f"FAILED: {', '.join(r.stem for r in failed)} (see {summary_path})", file=sys.stderr)
        for r in failed:  # last in the output: a diverged run says what happened, what to try
            marker = [p for p in r.problems if p.startswith("error marker")]
            print(f"{r.stem}: {(marker or r.problems)[0]}", file=sys.stderr)
        return 1
    return 0


def run_all(
    configs: dict[str, dict[str, Any]],
    settings: dict[str, Any],
    task_dir: Path,
    num_supernodes: int,
    timeout: float,
) -> dict[str, RunOutcome]:
    """One `flwr run` per strategy on one private SuperLink (stopped by PID after)."""
    outcomes: dict[str, RunOutcome] = {}
    task_dir.mkdir(parents=True, exist_ok=True)
    with LocalFlower() as flower:
        pid = flower.superlink.pid if flower.superlink else None
        print(
            f"private SuperLink pid {pid} on 127.0.0.1:{flower.port}, FLWR_HOME={flower.home}",
            flush=True,
        )
        for strategy, config in configs.items():
            stem = settings[strategy].stem
            for suffix in (".json", ".csv", ".error.json"):
                (task_dir / f"{stem}{suffix}").unlink(missing_ok=True)
            print(f"flwr run: {stem} ...", flush=True)
            outcome = flower.run(
                APP_DIR,
                config,
                num_supernodes=num_supernodes,
                log_path=task_dir / f"{stem}.log",
                timeout=timeout,
            )
            outcomes[strategy] = outcome
            print(
                f"  exit code {outcome.returncode}, {outcome.seconds:.1f} s, "
                f"log {outcome.log_path}",
                flush=True,
            )
    return outcomes


if __name__ == "__main__":
    raise SystemExit(main())
