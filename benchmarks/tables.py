"""The text tables `benchmarks.convergence` prints: best rounds per algorithm and ratios."""

from __future__ import annotations

from typing import Any

from benchmarks.common import format_table
from benchmarks.peers import penalty_name


def rounds_text(run: dict[str, Any] | None, target: float, max_rounds: int) -> str:
    """Return the run's rounds to `target`, or "> max_rounds" when none reached it."""
    if run is None:
        return f"> {max_rounds}"
    return str(run["rounds_to"][str(target)])


def config_text(run: dict[str, Any] | None, steps_key: str) -> str:
    """Return "lr=.. steps=.. rho=.." for a run ("-" for none)."""
    if run is None:
        return "-"
    steps = "epochs" if steps_key == "local_epochs" else "steps"
    text = f"lr={run['lr']:g} {steps}={run['steps']:g}"
    name = penalty_name(run["algorithm"], run["schedule"])
    if name is not None:
        text += f" {name}={run['penalty']:g}"
    if "server_step" in run:
        text += f" eta_g={run['server_step']:g}"
    return text


def report_table(result: dict[str, Any], steps_key: str) -> str:
    """Best rounds (and the configuration achieving it) per algorithm and target."""
    summary, max_rounds = result["summary"], result["max_rounds"]
    metric = "gap <=" if result["metric"] == "gap" else "accuracy >="
    headers = ["algorithm", "configs"]
    for target in result["targets"]:
        headers += [f"rounds {metric} {target:g}", "best config"]
    final = str(result["targets"][-1])
    # Runs stop at the last target, so the best value seen only ranks the algorithms
    # when some of them never reach it.
    show_best = any(per_target[final] is None for per_target in summary["best"].values())
    if show_best:
        metric_name = "lowest gap" if result["metric"] == "gap" else "best accuracy"
        headers += [f"{metric_name} in {max_rounds} rounds", "its config"]
    rows = []
    for label, per_target in summary["best"].items():
        count = sum(1 for r in result["runs"] if r["label"] == label)
        row: list[object] = [label, count]
        for target in result["targets"]:
            run = per_target[str(target)]
            row += [rounds_text(run, target, max_rounds), config_text(run, steps_key)]
        if show_best:
            top = summary["best_value"][label]
            row += [None if top is None else top["best"], config_text(top, steps_key)]
        rows.append(row)
    return format_table(headers, rows)


def ratio_text(entry: dict[str, Any]) -> str:
    """Return a `benchmarks.convergence.ratio` entry as text (a bound as "< x")."""
    if entry["value"] is not None:
        return f"{entry['value']:.3f}"
    if entry["bound"] is not None:
        return f"< {entry['bound']:.3f}"
    return "n/a (not reached)"
