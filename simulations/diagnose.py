"""Seed 003's pre-training diagnostics for a task, as a markdown + PNG report.

    python -m simulations.diagnose --task credit [--run-config 'learning-rate=0.05 ...']

Per client: label distribution, feature mean / variance (and how far each client's
mean is from the pooled mean), the update u_i = w_i - z of one plain local round
(FedAvg's local work with the run config's learning rate and local steps/epochs)
from the initial model z_0 and, for convex tasks, from the centralized optimum z*
(where any nonzero update is pure client drift), its norm ||w_i - z||, and the
pairwise cosines of the updates. Warns when learning-rate x local-epochs > 1 (seed
003's rule of thumb eta * E <= 1). Writes ``output-dir/<task>/diagnostics.md``,
``diagnostics.json`` and ``diagnostics-*.png``.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
from numpy.typing import NDArray

from flwr_admm.core.local_solver import LocalPlan, penalized_local_solve
from flwr_admm.models import Model

from .admm_app.evaluation import Evaluator, get_task
from .admm_app.run_config import RunSettings, parse_run_config
from .compare import parse_overrides


def label_distribution(model: Model, ys: list[NDArray[Any]], n_classes: int) -> NDArray[np.float64]:
    """Row i: fraction of client i's samples in each class."""
    rows = []
    for y in ys:
        counts = np.bincount(model.encode_labels(y), minlength=n_classes).astype(np.float64)
        rows.append(counts / max(counts.sum(), 1.0))
    return np.vstack(rows)


def local_updates(
    model: Model,
    z: list[NDArray[np.float64]],
    X: list[NDArray[np.float64]],
    y: list[NDArray[np.int64]],
    plan: LocalPlan,
    seed: int,
) -> NDArray[np.float64]:
    """Row i: flattened w_i - z after one plain local round of client i from z."""
    rows = []
    for i, (Xi, yi) in enumerate(zip(X, y, strict=True)):
        rng = np.random.default_rng([seed, i, 1])  # the client's round-1 minibatch order
        result = penalized_local_solve(model, z, Xi, yi, plan, rng=rng)
        rows.append(
            np.concatenate([(w - c).ravel() for w, c in zip(result.params, z, strict=True)])
        )
    return np.vstack(rows)


def cosine_matrix(updates: NDArray[np.float64]) -> NDArray[np.float64]:
    """Pairwise cosines of the rows (0 where a row is zero)."""
    norms = np.linalg.norm(updates, axis=1)
    safe = np.where(norms > 0, norms, 1.0)
    unit = updates / safe[:, None]
    cos = unit @ unit.T
    cos[norms == 0, :] = 0.0
    cos[:, norms == 0] = 0.0
    return np.asarray(cos)


def local_epochs_equivalent(settings: RunSettings, sizes: list[int]) -> float:
    """E in seed 003's eta * E rule: epochs, or steps x batch / n (mean over clients)."""
    if settings.local_epochs is not None:
        return float(settings.local_epochs)
    steps = float(settings.local_steps or 0)
    if settings.batch_size is None:
        return steps
    return float(np.mean([steps * min(settings.batch_size, n) / n for n in sizes]))


def diagnose(settings: RunSettings) -> dict[str, Any]:
    """Everything the report shows, as plain data."""
    task = get_task(settings.task, settings.seed, settings.task_options())
    model = task.make_model()
    X = [model.check_data(Xi) for Xi in task.data.X]
    y = [model.encode_labels(yi) for yi in task.data.y]
    n_classes = int(model.predict_proba(model.init_params(0), X[0][:1]).shape[1])
    pooled = np.concatenate(X)
    means = np.vstack([Xi.mean(axis=0) for Xi in X])
    variances = np.vstack([Xi.var(axis=0) for Xi in X])
    plan = LocalPlan(
        learning_rate=settings.learning_rate,
        steps=settings.local_steps,
        epochs=settings.local_epochs,
        batch_size=settings.batch_size,
        prox_step="exact",
    )
    starts = {"initial model": model.init_params(settings.seed)}
    if task.convex:
        starts["optimum z*"] = Evaluator.build(task, settings.task_dir).optimum.params  # type: ignore[union-attr]
    updates = {
        name: local_updates(model, z, X, y, plan, settings.seed) for name, z in starts.items()
    }
    epochs = local_epochs_equivalent(settings, [len(yi) for yi in y])
    warnings = []
    if settings.learning_rate * epochs > 1:
        warnings.append(
            f"learning-rate x local-epochs = {settings.learning_rate:g} x {epochs:g} = "
            f"{settings.learning_rate * epochs:g} > 1: seed 003's rule of thumb (eta * E <= 1) "
            "says local models will drift towards their own optima; expect FedAvg to stall "
            "at a biased point (FedProx's mu and FedADMM's duals counteract it)."
        )
    norms = {name: np.linalg.norm(u, axis=1) for name, u in updates.items()}
    for name, values in norms.items():
        if values.min() > 0 and values.max() / values.min() > 3:
            warnings.append(
                f"update norms from the {name} differ by {values.max() / values.min():.1f}x "
                f"(client {int(values.argmax())} vs client {int(values.argmin())}): "
                "strongly heterogeneous clients."
            )
    return {
        "task": settings.task,
        "settings": settings.to_dict(),
        "num_clients": len(X),
        "sizes": [len(yi) for yi in y],
        "label_distribution": label_distribution(model, task.data.y, n_classes).tolist(),
        "feature_mean": means.tolist(),
        "feature_variance": variances.tolist(),
        "mean_shift": np.linalg.norm(means - pooled.mean(axis=0), axis=1).tolist(),
        "local_epochs_equivalent": epochs,
        "update_norms": {name: v.tolist() for name, v in norms.items()},
        "update_cosines": {name: cosine_matrix(u).tolist() for name, u in updates.items()},
        "warnings": warnings,
    }


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    return [
        "| " + " | ".join(header) + " |",
        "|" + "---|" * len(header),
        *("| " + " | ".join(row) + " |" for row in rows),
    ]


def report_markdown(result: dict[str, Any]) -> str:
    """The diagnostics as markdown."""
    s = result["settings"]
    lines = [
        f"# Diagnostics: {result['task']}",
        "",
        f"Local round: lr `{s['learning_rate']}`, local steps `{s['local_steps']}`, local epochs "
        f"`{s['local_epochs']}`, batch `{s['batch_size'] or 'full'}` "
        f"(about {result['local_epochs_equivalent']:g} epochs); seed `{s['seed']}`.",
        "",
        "## Warnings",
        "",
        *([f"- {w}" for w in result["warnings"]] or ["- none"]),
        "",
        "## Clients",
        "",
    ]
    variances = np.asarray(result["feature_variance"])
    starts = list(result["update_norms"])
    header = [
        "client",
        "n",
        "majority class (share)",
        "||mean_i - mean||",
        "mean var",
        "min var",
        "max var",
        *[f"||w_i - z|| from {name}" for name in starts],
    ]
    rows = []
    for i in range(result["num_clients"]):
        labels = np.asarray(result["label_distribution"][i])
        rows.append(
            [
                str(i),
                str(result["sizes"][i]),
                f"{int(labels.argmax())} ({labels.max():.1%})",
                f"{result['mean_shift'][i]:.3g}",
                f"{variances[i].mean():.3g}",
                f"{variances[i].min():.3g}",
                f"{variances[i].max():.3g}",
                *[f"{result['update_norms'][name][i]:.3g}" for name in starts],
            ]
        )
    lines += [*_table(header, rows), "", "## Label distribution (share of each class)", ""]
    distribution = np.asarray(result["label_distribution"])
    lines += _table(
        ["client", *[f"class {k}" for k in range(distribution.shape[1])]],
        [[str(i), *[f"{v:.1%}" for v in row]] for i, row in enumerate(distribution)],
    )
    for name, matrix in result["update_cosines"].items():
        cos = np.asarray(matrix)
        lines += ["", f"## Pairwise cosine of local updates from the {name}", ""]
        lines += _table(
            ["", *[str(j) for j in range(len(cos))]],
            [[str(i), *[f"{v:+.2f}" for v in row]] for i, row in enumerate(cos)],
        )
        off = cos[~np.eye(len(cos), dtype=bool)]
        if off.size:
            lines += ["", f"min {off.min():+.2f}, mean {off.mean():+.2f}, max {off.max():+.2f}."]
    return "\n".join(lines) + "\n"


def plot_report(result: dict[str, Any], out_dir: Path) -> list[Path]:
    """Label shares per client; update norms and cosine heatmaps."""
    distribution = np.asarray(result["label_distribution"])
    clients = np.arange(distribution.shape[0])
    fig, ax = plt.subplots(figsize=(max(6, 0.5 * len(clients)), 4))
    bottom = np.zeros(len(clients))
    cmap = plt.get_cmap("tab10" if distribution.shape[1] <= 10 else "tab20")
    for k in range(distribution.shape[1]):
        ax.bar(clients, distribution[:, k], bottom=bottom, color=cmap(k % cmap.N), label=str(k))
        bottom += distribution[:, k]
    ax.set_xticks(clients)
    ax.set(xlabel="client", ylabel="share of samples", title="Label distribution")
    ax.legend(title="class", fontsize=7, ncol=2 if distribution.shape[1] > 5 else 1)
    fig.tight_layout()
    labels_path = out_dir / "diagnostics-labels.png"
    fig.savefig(labels_path, dpi=110)
    plt.close(fig)

    starts = list(result["update_norms"])
    fig, axes = plt.subplots(
        1, 1 + len(starts), figsize=(5 * (1 + len(starts)), 4.2), squeeze=False
    )
    width = 0.8 / len(starts)
    for k, name in enumerate(starts):
        axes[0][0].bar(
            clients + k * width, result["update_norms"][name], width, label=f"from {name}"
        )
        cos = np.asarray(result["update_cosines"][name])
        image = axes[0][k + 1].imshow(cos, vmin=-1, vmax=1, cmap="RdBu")
        axes[0][k + 1].set_xticks(clients)
        axes[0][k + 1].set_yticks(clients)
        axes[0][k + 1].set(title=f"cosine of updates from {name}", xlabel="client", ylabel="client")
        fig.colorbar(image, ax=axes[0][k + 1], fraction=0.046)
    axes[0][0].set_xticks(clients + 0.4 - width / 2, [str(c) for c in clients])
    axes[0][0].set(xlabel="client", ylabel="||w_i - z||", title="Local update norms")
    axes[0][0].legend(fontsize=8)
    fig.tight_layout()
    updates_path = out_dir / "diagnostics-updates.png"
    fig.savefig(updates_path, dpi=110)
    plt.close(fig)
    return [labels_path, updates_path]


def main(argv: list[str] | None = None) -> int:
    """Write the report; print its markdown."""
    parser = argparse.ArgumentParser(
        prog="python -m simulations.diagnose", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--task", default="seed-logreg")
    parser.add_argument("--run-config", default="", help="app run-config overrides: 'k=v ...'")
    parser.add_argument("--output-dir", default="outputs")
    args = parser.parse_args(argv)
    overrides = {
        **parse_overrides(args.run_config),
        "task": args.task,
        "output-dir": str(Path(args.output_dir).expanduser().resolve()),
    }
    try:
        settings = parse_run_config(overrides)
        task = get_task(settings.task, settings.seed, settings.task_options())
        settings = parse_run_config(overrides, task.defaults)
    except ValueError as error:
        raise SystemExit(str(error)) from None
    result = diagnose(settings)
    out_dir = settings.task_dir
    out_dir.mkdir(parents=True, exist_ok=True)
    markdown = report_markdown(result)
    (out_dir / "diagnostics.md").write_text(markdown)
    (out_dir / "diagnostics.json").write_text(json.dumps(result, allow_nan=False, default=_plain))
    plot_report(result, out_dir)
    print(markdown)
    print(f"wrote {out_dir / 'diagnostics.md'}, diagnostics.json and diagnostics-*.png")
    return 0


def _plain(value: Any) -> Any:
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    raise TypeError(f"not JSON-serializable: {value!r}")


if __name__ == "__main__":
    raise SystemExit(main())
