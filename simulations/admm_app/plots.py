"""PNG plots of result documents (matplotlib, Agg backend).

Part of the app bundle so that every ``flwr run simulations`` can plot its own run
(the ServerApp cannot import the ``simulations`` package); `simulations.report`
re-exports `RunResult` and `plot_all` for the comparison runner.
"""

from __future__ import annotations

import math
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
