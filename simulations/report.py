"""Checks, plots and the markdown summary of a comparison's per-strategy result files.

Everything here reads the ``<stem>.json`` files the ServerApp writes, so it can be
rerun on old results (``python -m simulations.compare --report-only``).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .admm_app.plots import FLOOR, GAP_TARGETS, RunResult, plot_all

DIVERGED = "RunDivergedError"  # flwr_admm.core.health: the message says what to try

__all__ = [
    "FLOOR",
    "GAP_TARGETS",
    "RunResult",
    "check_result",
    "first_round_above",
    "first_round_below",
    "plot_all",
    "summary_markdown",
]


def check_result(
    task_dir: Path, stem: str, num_rounds: int, *, allow_failures: bool = False
) -> tuple[dict[str, Any] | None, list[str]]:
    """Load ``<stem>.json`` and list everything that makes it incomplete or failed.

    An error marker is reported by its first line; a diverged or stalled run
    (``RunDivergedError``, the strategies' watchdog) in full: what happened, the last
    rounds and what to try.
    """
    problems: list[str] = []
    error = task_dir / f"{stem}.error.json"
    if error.exists():
        try:
            marker = json.loads(error.read_text())
            message, kind = str(marker.get("message", "")), marker.get("error")
        except ValueError:
            message, kind = error.read_text()[:500], None
        shown = message if kind == DIVERGED else (message.splitlines() or [""])[0]
        problems.append(f"error marker {error.name}: {shown}")
    path = task_dir / f"{stem}.json"
    if not path.exists():
        return None, [*problems, f"missing result file {path}"]
    try:
        document = json.loads(path.read_text())
    except ValueError as err:
        return None, [*problems, f"unreadable {path.name}: {err}"]
    if document.get("status") != "complete":
        problems.append(f"status is {document.get('status')!r}, not 'complete'")
    if document.get("num_rounds") != num_rounds:
        problems.append(f"num_rounds is {document.get('num_rounds')}, expected {num_rounds}")
    by_round = {r.get("round"): r for r in document.get("rounds", [])}
    missing = [r for r in range(1, num_rounds + 1) if r not in by_round]
    if missing:
        problems.append(f"rounds missing from the results: {missing[:10]}")
    for number, record in sorted(by_round.items()):
        if not isinstance(record.get("objective"), int | float):
            problems.append(f"round {number}: no finite objective")
            break
        if number > 0 and not record.get("num_results"):
            problems.append(f"round {number}: no client result")
            break
        if number > 0 and record.get("num_failures") and not allow_failures:
            problems.append(
                f"round {number}: {record['num_failures']} client failures "
                f"({record.get('failure_reasons', [])[:1]})"
            )
            break
    return document, problems


def first_round_below(result: RunResult, key: str, target: float) -> int | None:
    """First round whose `key` is <= target."""
    for x, y in zip(*result.series(key), strict=True):
        if y <= target:
            return x
    return None


def first_round_above(result: RunResult, key: str, target: float) -> int | None:
    """First round whose `key` is >= target."""
    for x, y in zip(*result.series(key), strict=True):
        if y >= target:
            return x
    return None


def _fmt(value: Any, digits: int = 4) -> str:
    if value is None:
        return "-"
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    if isinstance(value, float):
        if value != 0 and (abs(value) < 1e-3 or abs(value) >= 1e5):
            return f"{value:.2e}"
        return f"{value:.{digits}f}"
    return str(value)


def _median(values: Sequence[float]) -> float | None:
    ordered = sorted(values)
    if not ordered:
        return None
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else 0.5 * (ordered[mid - 1] + ordered[mid])


def summary_markdown(
    results: list[RunResult], *, title: str, target_accuracy: float | None = None
) -> str:
    """Markdown: settings, rounds-to-target table, final metrics, costs, problems."""
    convex = any(r.final("relative_gap") is not None for r in results)
    accuracies = [a for r in results if (a := r.final("test_accuracy")) is not None]
    if target_accuracy is None and accuracies:
        target_accuracy = round(0.99 * max(accuracies), 4)
    lines = [f"# {title}", ""]
    if results:
        settings = results[0].document.get("settings", {})
        shown = {
            k: settings.get(k)
            for k in (
                "task",
                "num_server_rounds",
                "learning_rate",
                "local_steps",
                "local_epochs",
                "batch_size",
                "rho",
                "rho_schedule",
                "proximal_mu",
                "prox_step",
                "local_init",
                "fraction_fit",
                "seed",
            )
            if k in settings
        }
        lines += ["Settings: " + ", ".join(f"`{k}={v}`" for k, v in shown.items()), ""]
        evaluation = results[0].document.get("evaluation_data")
        if evaluation:
            lines += [f"Accuracy and AUC are measured on the {evaluation}.", ""]
        optimum = results[0].document.get("optimum")
        if optimum:
            lines += [
                f"Centralized optimum F* = {optimum['objective']:.12g} "
                f"(L-BFGS, gradient norm {optimum['grad_norm']:.1e}); "
                "relative gap = (F(z) - F*) / |F*|.",
                "",
            ]
    header = ["strategy"]
    if convex:
        header += [f"rounds to rel. gap {t:g}" for t in GAP_TARGETS]
        header += ["final rel. gap"]
    if target_accuracy is not None:
        header += [f"rounds to acc {target_accuracy:g}"]
    header += [
        "final objective",
        "test acc",
        "AUC",
        "worst-client AUC",
        "client drift",
        "MB up+down",
        "s/round (median)",
        "wall s",
        "status",
    ]
    lines += ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for r in results:
        row = [r.stem]
        if convex:
            row += [_fmt(first_round_below(r, "relative_gap", t)) for t in GAP_TARGETS]
            row += [_fmt(r.final("relative_gap"))]
        if target_accuracy is not None:
            row += [_fmt(first_round_above(r, "test_accuracy", target_accuracy))]
        traffic = sum(v for k in ("bytes_up", "bytes_down") for v in r.series(k)[1])
        row += [
            _fmt(r.final("objective"), 8),
            _fmt(r.final("test_accuracy")),
            _fmt(r.final("test_auc")),
            _fmt(r.final("worst_client_auc")),
            _fmt(r.final("client_drift")),
            _fmt(traffic / 1e6, 3),
            _fmt(_median(r.series("round_seconds")[1][1:])),
            _fmt(r.wall_seconds, 1),
            "ok" if not r.problems else "FAILED",
        ]
        lines.append("| " + " | ".join(row) + " |")
    lines += [
        "",
        '"-": target not reached (or metric not applicable). s/round excludes '
        "round 1 (Ray start-up); wall s is the whole `flwr run`.",
        "",
    ]
    problems = [f"- {r.stem}: {p}".replace("\n", "\n  ") for r in results for p in r.problems]
    if problems:
        lines += ["## Problems", "", *problems, ""]
    return "\n".join(lines)
