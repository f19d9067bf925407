"""Checks, plots and the markdown summary of a comparison's per-strategy result files.

Everything here reads the ``<stem>.json`` files the ServerApp writes, so it can be
rerun on old results (``python -m simulations.compare --report-only``).
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

GAP_TARGETS = (1e-3, 1e-6)
FLOOR = 1e-17  # plotted in place of gaps <= 0 (F* itself is only known to ~1e-16)


@dataclass
class RunResult:
    """One strategy's result document plus what the runner measured around it."""

    stem: str
    document: dict[str, Any]
    wall_seconds: float | None = None
    problems: list[str] = field(default_factory=list)

    @property
    def rounds(self) -> list[dict[str, Any]]:
        """Round records, round 0 (initial model) first."""
        return list(self.document.get("rounds", []))

    def series(self, key: str) -> tuple[list[int], list[float]]:
        """(rounds, values) where `key` is a number."""
        xs, ys = [], []
        for record in self.rounds:
            value = record.get(key)
            if isinstance(value, int | float) and not isinstance(value, bool):
                xs.append(int(record["round"]))
                ys.append(float(value))
        return xs, ys

    def final(self, key: str) -> float | None:
        """Value of `key` in the last round that has it."""
        _, ys = self.series(key)
        return ys[-1] if ys else None


def check_result(
    task_dir: Path, stem: str, num_rounds: int, *, allow_failures: bool = False
) -> tuple[dict[str, Any] | None, list[str]]:
    """Load ``<stem>.json`` and list everything that makes it incomplete or failed."""
    problems: list[str] = []
    error = task_dir / f"{stem}.error.json"
    if error.exists():
        try:
            message = json.loads(error.read_text()).get("message", "")
        except ValueError:
            message = error.read_text()[:500]
        problems.append(f"error marker {error.name}: {message.splitlines()[0] if message else ''}")
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
    problems = [f"- {r.stem}: {p}" for r in results for p in r.problems]
    if problems:
        lines += ["## Problems", "", *problems, ""]
    return "\n".join(lines)


def _positive(ys: list[float]) -> list[float]:
    return [y if y > FLOOR else FLOOR for y in ys]


def plot_all(results: list[RunResult], out_dir: Path, prefix: str = "") -> list[Path]:
    """Write the comparison PNGs; returns their paths."""
    out_dir.mkdir(parents=True, exist_ok=True)
    written = [
        _plot_objective(results, out_dir / f"{prefix}objective.png"),
        _plot_accuracy(results, out_dir / f"{prefix}accuracy.png"),
        _plot_residuals(results, out_dir / f"{prefix}residuals.png"),
    ]
    if any(r.rounds and r.rounds[-1].get("client_auc") for r in results):
        written.append(_plot_client_auc(results, out_dir / f"{prefix}client_auc.png"))
    return written


def _plot_objective(results: list[RunResult], path: Path) -> Path:
    convex = any(r.final("relative_gap") is not None for r in results)
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for r in results:
        if convex:
            xs, ys = r.series("relative_gap")
            ax.semilogy(xs, _positive(ys), label=r.stem)
        else:
            xs, ys = r.series("objective")
            ax.semilogy(xs, _positive(ys), label=r.stem)
    if convex:
        for target in GAP_TARGETS:
            ax.axhline(target, color="grey", lw=0.7, ls=":")
    ax.set_xlabel("round")
    ax.set_ylabel("relative gap (F(z) - F*) / |F*|" if convex else "training objective F(z)")
    ax.set_title("Objective gap of the global model" if convex else "Training objective")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def _plot_accuracy(results: list[RunResult], path: Path) -> Path:
    has_auc = any(r.final("test_auc") is not None for r in results)
    fig, axes = plt.subplots(
        1, 2 if has_auc else 1, figsize=(11 if has_auc else 7, 4.5), squeeze=False
    )
    for r in results:
        axes[0][0].plot(*r.series("test_accuracy"), label=r.stem)
        if has_auc:
            axes[0][1].plot(*r.series("test_auc"), label=r.stem)
    axes[0][0].set(xlabel="round", ylabel="test accuracy", title="Accuracy of the global model")
    if has_auc:
        axes[0][1].set(xlabel="round", ylabel="AUC", title="AUC of the global model")
    for ax in axes[0]:
        ax.grid(True, alpha=0.3)
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def _plot_residuals(results: list[RunResult], path: Path) -> Path:
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.5))
    for r in results:
        xs, ys = r.series("client_drift")
        if xs:
            axes[0].semilogy(xs, _positive(ys), label=r.stem)
        for key, style in (("primal_residual", "-"), ("dual_residual", "--")):
            xs, ys = r.series(key)
            if xs:
                axes[1].semilogy(xs, _positive(ys), style, label=f"{r.stem} {key.split('_')[0]}")
        xs, ys = r.series("rho")
        if xs:
            axes[2].plot(xs, ys, label=r.stem)
    axes[0].set(
        xlabel="round",
        ylabel="sqrt(sum_i p_i ||w_i - z||^2)",
        title="Client drift (all strategies)",
    )
    axes[1].set(xlabel="round", ylabel="residual", title="ADMM primal / dual residuals")
    axes[2].set(xlabel="round", ylabel="rho", title="Penalty rho")
    for ax in axes:
        ax.grid(True, which="both", alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def _plot_client_auc(results: list[RunResult], path: Path) -> Path:
    finals = {r.stem: r.rounds[-1].get("client_auc") or {} for r in results if r.rounds}
    clients = sorted({c for aucs in finals.values() for c in aucs}, key=int)
    fig, ax = plt.subplots(figsize=(min(16, max(7, 1.2 * len(clients))), 4.5))
    width = 0.8 / max(1, len(finals))
    for k, (stem, aucs) in enumerate(finals.items()):
        xs = [i + k * width for i in range(len(clients))]
        ax.bar(xs, [aucs.get(c, math.nan) for c in clients], width, label=stem)
    ax.set_xticks(
        [i + 0.4 - width / 2 for i in range(len(clients))], [f"client {c}" for c in clients]
    )
    values = [v for aucs in finals.values() for v in aucs.values()]
    if values:
        ax.set_ylim(max(0.0, min(values) - 0.05), min(1.0, max(values) + 0.02))
    ax.set(ylabel="AUC (final round)", title="Per-client AUC of the global model")
    ax.grid(True, axis="y", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
