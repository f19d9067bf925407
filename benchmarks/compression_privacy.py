"""Uplink compression and local DP, measured for docs/compression_privacy.md.

    python -m benchmarks.compression_privacy [--quick] [--json PATH] [--plot PATH]

Everything runs through the in-process driver (`flwr_admm.testing`: deterministic, no
Ray) with `ADMMClient`s; bytes are the sizes of the serialized FitRes
(``flwr.common.serde.fit_res_to_proto``) every client returns, summed per round.

1. Wire bytes of one FitRes vs the float32 encoding of the same arrays.
2. seed-logreg (FedADMM rho 0.1, 20 local steps, lr 1.0): relative objective gap per
   round for full precision, 8/4/2-bit stochastic quantization and top-k, with the
   residual kept by the client (error feedback, "update") or dropped ("none"); client
   seeds 0..2.
3. digits (Dirichlet 0.1, 10 clients, tanh MLP): test accuracy of FedADMM and FedAvg
   at full precision, 8 and 4 bits.
4. digits with local DP (clip C, noise sigma C): accuracy and the epsilon at 1e-5.
5. digits: rounds to 90% / 93% test accuracy, FedADMM vs FedAvg, best of a small grid.
MNIST cannot be downloaded here, so digits stands in for seed 001's MNIST claims.
"""

from __future__ import annotations

import argparse
import json
import logging
import random
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from flwr.common import (
    Context,
    FitIns,
    FitRes,
    NDArrays,
    RecordDict,
    ndarrays_to_parameters,
    parameters_to_ndarrays,
)
from flwr.common.serde import fit_res_to_proto
from flwr.server.strategy import FedAvg, Strategy
from scipy.optimize import minimize

from flwr_admm.client import ADMMClient
from flwr_admm.data import Task, load_task
from flwr_admm.models import SoftmaxRegression
from flwr_admm.options import Uplink
from flwr_admm.server.fedadmm import textbook
from flwr_admm.testing import InProcessClientProxy, make_proxies, run_rounds
from flwr_admm.uplink import LocalDP, StochasticQuantizer, TopK, UplinkWrapper
from flwr_admm.uplink.compression import Compressor
from flwr_admm.uplink.privacy import PrivacyLedger

DIGITS = {"lr": 0.2, "rho": 1.0, "epochs": 1, "batch": 16}
DP_CLIP = 1.0  # about the median ||w_i - v_i|| of the first rounds on digits


# ---------------------------------------------------------------- plumbing
class MeasuringProxy(InProcessClientProxy):
    """Records the serialized size of every FitRes, by round."""

    def __init__(self, proxy: InProcessClientProxy, sizes: dict[int, int]) -> None:
        super().__init__(proxy.cid, proxy.client_fn, proxy.context)
        self.sizes = sizes

    def fit(self, ins: FitIns, timeout: float | None, group_id: int | None) -> FitRes:
        """Fit, then count the reply's bytes."""
        res = super().fit(ins, timeout, group_id)
        key = int(group_id or 0)
        self.sizes[key] = self.sizes.get(key, 0) + fit_res_to_proto(res).ByteSize()
        return res


def client_fn_for(task: Task, seed: int, **kwargs: Any) -> Callable[[Context], ADMMClient]:
    """ADMMClient on partition ``partition-id``, client seed `seed` (rounding, batches)."""
    data = task.data

    def client_fn(context: Context) -> ADMMClient:
        i = int(context.node_config["partition-id"])
        return ADMMClient(
            task.make_model(),
            data.X[i],
            data.y[i],
            context=context,
            seed=seed,
            dp_seed=seed,  # reproducible experiment; real deployments keep the default
            **kwargs,
        )

    return client_fn


def run(
    task: Task,
    strategy_fn: Callable[..., Strategy],
    rounds: int,
    seed: int,
    client_kwargs: dict[str, Any],
) -> tuple[list[NDArrays], list[dict[str, Any]], float]:
    """Run `rounds` rounds; return z per round, fit metrics, mean bytes per round."""
    # Flower's FedAvg samples with Python's `random` (order matters for the sums).
    random.seed(seed)
    model = task.make_model()
    history: list[NDArrays] = []

    def record(server_round: int, parameters: NDArrays, config: Any) -> None:
        if server_round > 0:
            history.append([np.array(p) for p in parameters])

    initial = ndarrays_to_parameters(model.init_params(getattr(model, "seed", 0)))
    strategy = strategy_fn(initial_parameters=initial, evaluate_fn=record, fraction_evaluate=0.0)
    sizes: dict[int, int] = {}
    proxies = [
        MeasuringProxy(p, sizes)
        for p in make_proxies(client_fn_for(task, seed, **client_kwargs), task.data.num_clients)
    ]
    result = run_rounds(strategy, proxies, rounds)  # type: ignore[arg-type]
    return history, result.fit_metrics, float(np.mean(list(sizes.values())))


def fedadmm(rho: float, uplink: Uplink | None = None) -> Callable[..., Strategy]:
    """Return a factory of the textbook FedADMM (as measured) with `uplink`'s options."""
    return lambda **kw: textbook(rho=rho, uplink=uplink, **kw)


def fedavg(uplink: Compressor | None = None, local_dp: LocalDP | None = None) -> Any:
    """FedAvg factory, wrapped by UplinkWrapper when compressing or privatizing."""

    def make(**kw: Any) -> Strategy:
        base = FedAvg(**kw)
        if uplink is None and local_dp is None:
            return base
        return UplinkWrapper(base, uplink=uplink, local_dp=local_dp)

    return make


# --------------------------------------------------------------- 1. bytes
def wire_bytes() -> list[dict[str, Any]]:
    """Return serialized FitRes of one reply per scheme, for three model sizes."""
    rows = []
    digits = load_task("digits", partitioner="dirichlet", dirichlet_alpha=0.1, model="mlp")
    seed_task = load_task("seed-logreg")
    rng = np.random.default_rng(0)
    big = SoftmaxRegression(9999, 10)
    cases = [
        ("seed-logreg (20)", seed_task.make_model(), seed_task.data.X[0], seed_task.data.y[0]),
        ("digits MLP (2,410)", digits.make_model(), digits.data.X[0], digits.data.y[0]),
        ("softmax 9999x10 (100,000)", big, rng.normal(size=(40, 9999)), np.arange(40) % 10),
    ]
    schemes: list[tuple[str, Compressor | None]] = [
        ("float64 (plain)", None),
        ("8 bits", StochasticQuantizer(bits=8)),
        ("4 bits", StochasticQuantizer(bits=4)),
        ("2 bits", StochasticQuantizer(bits=2)),
        ("top-k 10%", TopK(fraction=0.1)),
    ]
    for name, model, X, y in cases:
        start = ndarrays_to_parameters(model.init_params(0))
        sizes: dict[str, int] = {}
        for label, compressor in schemes:
            context = Context(0, 1, {"partition-id": 0}, RecordDict(), {})
            client = ADMMClient(model, X, y, context=context, local_steps=2).to_client()
            config = {"rho": 0.1, **(compressor.config() if compressor else {})}
            res = client.fit(FitIns(start, config))
            sizes[label] = fit_res_to_proto(res).ByteSize()
            if compressor is None:
                f32 = [a.astype(np.float32) for a in parameters_to_ndarrays(res.parameters)]
                res32 = FitRes(
                    res.status, ndarrays_to_parameters(f32), res.num_examples, res.metrics
                )
                sizes["float32"] = fit_res_to_proto(res32).ByteSize()
        rows.append(
            {
                "model": name,
                "bytes": sizes,
                "fewer_than_float32": {k: sizes["float32"] / v for k, v in sizes.items()},
            }
        )
    return rows


# ---------------------------------------------------------- 2. seed-logreg
def seed_optimum(task: Task) -> float:
    """F* of the pooled seed-logreg objective (L-BFGS, gtol 1e-12)."""
    model, data = task.make_model(), task.data
    X, y = np.vstack(data.X), np.concatenate([model.encode_labels(v) for v in data.y])

    def fun(w: np.ndarray) -> tuple[float, np.ndarray]:
        loss, grad = model.loss_and_grad([w], X, y)
        return float(loss), np.asarray(grad[0])

    res = minimize(fun, np.zeros(X.shape[1]), jac=True, method="L-BFGS-B",
                   options={"ftol": 1e-16, "gtol": 1e-12, "maxiter": 5000})  # fmt: skip
    return float(res.fun)


def seed_logreg_gaps(rounds: int, seeds: list[int]) -> dict[str, Any]:
    """Gap curves of every variant and seed; see the module docstring."""
    task = load_task("seed-logreg")
    model, data = task.make_model(), task.data
    X, y = np.vstack(data.X), np.concatenate([model.encode_labels(v) for v in data.y])
    f_star = seed_optimum(task)
    variants: dict[str, Uplink | None] = {"full precision": None}
    for bits in (8, 4, 2):
        variants[f"{bits} bits, update"] = Uplink(StochasticQuantizer(bits=bits))
        variants[f"{bits} bits, none"] = Uplink(
            StochasticQuantizer(bits=bits, error_feedback=False)
        )
    variants["top-k 25%, update"] = Uplink(TopK(fraction=0.25))
    variants["top-k 25%, none"] = Uplink(TopK(fraction=0.25, error_feedback=False))
    out: dict[str, Any] = {}
    client = {"local_steps": 20, "learning_rate": 1.0}
    for name, uplink in variants.items():
        curves, per_round = [], 0.0
        for seed in seeds if uplink is not None else seeds[:1]:
            z, _, per_round = run(task, fedadmm(0.1, uplink), rounds, seed, client)
            curves.append([(model.loss(zk, X, y) - f_star) / abs(f_star) for zk in z])
        gaps = np.array(curves)
        out[name] = {"gaps": gaps.tolist(), "bytes_per_round": per_round}
        print(f"  seed-logreg {name}: final {np.median(gaps[:, -1]):.2e}", flush=True)
    return {"f_star": f_star, "variants": out}


def first_round(values: np.ndarray, target: float, *, above: bool) -> int | None:
    """1-based first round with values >= target (above) or <= target, or None."""
    hits = np.flatnonzero(values >= target if above else values <= target)
    return int(hits[0]) + 1 if hits.size else None


# ---------------------------------------------------------------- digits
def digits_task() -> Task:
    """Digits, Dirichlet(0.1) over 10 clients, tanh MLP (2,410 parameters)."""
    return load_task("digits", partitioner="dirichlet", dirichlet_alpha=0.1, model="mlp")


def accuracies(task: Task, z: list[NDArrays]) -> np.ndarray:
    """Accuracy of every round's model on the shared test set."""
    model, X, y = task.make_model(), task.data.X_global_test, task.data.y_global_test
    assert X is not None and y is not None
    return np.array([np.mean(model.predict_proba(list(p), X).argmax(axis=1) == y) for p in z])


def digits_client(lr: float) -> dict[str, Any]:
    """Local settings: 1 epoch of minibatches of 16 at learning rate `lr`."""
    return {"learning_rate": lr, "local_epochs": 1, "local_steps": None, "batch_size": 16}


def digits_runs(
    runs: dict[str, Callable[..., Strategy]], rounds: int, seeds: list[int]
) -> dict[str, Any]:
    """Accuracy curves (per seed), bytes per round and the last fit metrics of each run.

    Each run is also compared with the first run of its algorithm (the first word of
    its name): ``distance`` = ||z - z_ref|| / ||z_ref|| after the last round and
    ``max_accuracy_difference`` = max over rounds of |acc - acc_ref| (per seed).
    """
    task = digits_task()
    out: dict[str, Any] = {}
    finals: dict[str, list[np.ndarray]] = {}
    for name, factory in runs.items():
        curves, metrics, per_round, ends = [], {}, 0.0, []
        for seed in seeds:
            z, fit_metrics, per_round = run(
                task, factory, rounds, seed, digits_client(DIGITS["lr"])
            )
            curves.append(accuracies(task, z).tolist())
            ends.append(np.concatenate([p.ravel() for p in z[-1]]))
            metrics = fit_metrics[-1]
        acc = np.array(curves)
        reference = next(n for n in runs if n.split()[0] == name.split()[0])
        finals[name] = ends
        ref_acc = np.array(out[reference]["accuracy"]) if reference in out else acc
        out[name] = {
            "accuracy": curves,
            "bytes_per_round": per_round,
            "last_metrics": metrics,
            "reference": reference,
            "distance": [
                float(np.linalg.norm(a - b) / np.linalg.norm(b))
                for a, b in zip(ends, finals[reference], strict=True)
            ],
            "max_accuracy_difference": np.abs(acc - ref_acc).max(axis=1).tolist(),
        }
        print(f"  digits {name}: final {acc[:, -1].mean():.4f}", flush=True)
    return out


def sigma_for_epsilon(epsilon: float, rounds: int, delta: float = 1e-5) -> float:
    """Smallest sigma (bisection, 1e-3 relative) with epsilon(rounds, q = 1) <= epsilon."""
    lo, hi = 0.05, 200.0
    while hi / lo > 1.001:
        mid = (lo * hi) ** 0.5
        ledger = PrivacyLedger(mid, delta)
        for _ in range(rounds):
            ledger.record(1, 1)
        lo, hi = (mid, hi) if ledger.epsilon() > epsilon else (lo, mid)
    return hi


def rounds_to_target(rounds: int, seeds: list[int]) -> dict[str, Any]:
    """Return the rounds to 90% / 93% for FedADMM (lr x rho) and FedAvg (lr) on a small grid."""
    task = digits_task()
    grid: dict[str, tuple[Callable[..., Strategy], float]] = {}
    for lr in (0.2, 0.5):
        grid[f"FedAvg lr {lr}"] = (fedavg(), lr)
        for rho in (0.1, 1.0):
            grid[f"FedADMM lr {lr} rho {rho}"] = (fedadmm(rho), lr)
    out: dict[str, Any] = {}
    for name, (factory, lr) in grid.items():
        hits: dict[str, list[int | None]] = {"0.90": [], "0.93": []}
        finals = []
        for seed in seeds:
            z, _, _ = run(task, factory, rounds, seed, digits_client(lr))
            acc = accuracies(task, z)
            finals.append(float(acc[-1]))
            for target in hits:
                hits[target].append(first_round(acc, float(target), above=True))
        out[name] = {"rounds_to": hits, "final_accuracy": finals}
        print(f"  rounds-to-target {name}: {hits}", flush=True)
    return out


# ------------------------------------------------------------------ report
def report(results: dict[str, Any]) -> str:
    """Markdown tables of everything measured."""
    lines = ["## 1. Bytes of one serialized FitRes", ""]
    for row in results["bytes"]:
        cells = ", ".join(
            f"{k} {v:,} B ({row['fewer_than_float32'][k]:.3f}x)" for k, v in row["bytes"].items()
        )
        lines.append(f"- {row['model']}: {cells}")
    lines += ["", "## 2. seed-logreg relative objective gap (median over seeds)", ""]
    lines.append(
        "| variant | B/round | r10 | r20 | r50 | r100 | max last 20 (worst seed) "
        "| first <=1e-3 | first <=1e-4 |"
    )
    lines.append("|---|---|---|---|---|---|---|---|---|")
    for name, data in results["seed_logreg"]["variants"].items():
        g = np.array(data["gaps"])
        med = np.median(g, axis=0)
        at = [f"{med[r - 1]:.1e}" if r <= med.size else "-" for r in (10, 20, 50, 100)]
        worst = g[:, -20:].max()
        firsts = [_worst([first_round(c, t, above=False) for c in g]) for t in (1e-3, 1e-4)]
        lines.append(
            f"| {name} | {data['bytes_per_round']:,.0f} | {' | '.join(at)} | {worst:.1e} "
            f"| {firsts[0]} | {firsts[1]} |"
        )
    for title, key in (("3. digits accuracy", "digits"), ("4. digits with local DP", "dp")):
        lines += ["", f"## {title} (mean +- std over seeds)", ""]
        lines.append(
            "| run | B/round | final acc | mean acc last 10 | epsilon (delta 1e-5) "
            "| vs | max abs acc diff | final rel. z distance |"
        )
        lines.append("|---|---|---|---|---|---|---|---|")
        for name, data in results[key].items():
            acc = np.array(data["accuracy"])
            value = data["last_metrics"].get("dp_epsilon")
            eps = f"{value:,.2f}" if isinstance(value, float) else "-"
            lines.append(
                f"| {name} | {data['bytes_per_round']:,.0f} | {acc[:, -1].mean():.4f} +- "
                f"{acc[:, -1].std():.4f} | {acc[:, -10:].mean():.4f} | {eps} "
                f"| {data['reference']} | {max(data['max_accuracy_difference']):.4f} "
                f"| {np.mean(data['distance']):.3g} |"
            )
    lines += ["", "## 5. digits rounds to target accuracy (per seed)", ""]
    lines.append("| run | rounds to 90% | rounds to 93% | final accuracy |")
    lines.append("|---|---|---|---|")
    for name, data in results["rounds_to_target"].items():
        finals = np.array(data["final_accuracy"])
        lines.append(
            f"| {name} | {data['rounds_to']['0.90']} | {data['rounds_to']['0.93']} "
            f"| {finals.mean():.4f} |"
        )
    return "\n".join(lines)


def _worst(firsts: list[int | None]) -> str:
    return "never" if any(f is None for f in firsts) else str(max(f for f in firsts if f))


def plot(results: dict[str, Any], path: Path) -> None:
    """Gap curves of the seed-logreg variants (median over seeds), log scale."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for name, data in results["seed_logreg"]["variants"].items():
        if name.startswith("2 bits") or "none" in name:
            continue
        med = np.maximum(np.median(np.array(data["gaps"]), axis=0), 1e-16)
        ax.semilogy(np.arange(1, med.size + 1), med, label=name)
    ax.set_xlabel("round")
    ax.set_ylabel("relative objective gap")
    ax.set_title("seed-logreg, FedADMM rho 0.1, 20 local steps, lr 1.0")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    """Run every measurement and print the tables."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="1 seed, 30 rounds")
    parser.add_argument("--json", type=Path, help="write the raw results here")
    parser.add_argument("--plot", type=Path, help="write the seed-logreg gap plot here")
    args = parser.parse_args()
    logging.getLogger("flwr").setLevel(logging.ERROR)
    seeds = [0] if args.quick else [0, 1, 2]
    rounds = 30 if args.quick else 100
    started = time.perf_counter()
    results: dict[str, Any] = {"bytes": wire_bytes()}
    results["seed_logreg"] = seed_logreg_gaps(rounds, seeds)
    rho = DIGITS["rho"]
    results["digits"] = digits_runs(
        {
            "FedADMM full precision": fedadmm(rho),
            "FedADMM 8 bits": fedadmm(rho, Uplink(StochasticQuantizer(bits=8))),
            "FedADMM 4 bits": fedadmm(rho, Uplink(StochasticQuantizer(bits=4))),
            "FedAvg full precision": fedavg(),
            "FedAvg 8 bits": fedavg(StochasticQuantizer(bits=8)),
            "FedAvg 4 bits": fedavg(StochasticQuantizer(bits=4)),
        },
        rounds,
        seeds,
    )
    sigma_2 = sigma_for_epsilon(2.0, rounds)
    dp_runs: dict[str, Callable[..., Strategy]] = {}
    for sigma in (0.0, 0.05, 1.0, sigma_2):
        dp = LocalDP(clip=DP_CLIP, noise_multiplier=sigma)
        dp_runs[f"FedADMM C {DP_CLIP} sigma {sigma:.3g}"] = fedadmm(rho, Uplink(local_dp=dp))
        dp_runs[f"FedAvg C {DP_CLIP} sigma {sigma:.3g}"] = fedavg(local_dp=dp)
    results["dp"] = digits_runs(dp_runs, rounds, seeds)
    results["rounds_to_target"] = rounds_to_target(rounds, seeds)
    results["seconds"] = time.perf_counter() - started
    print(report(results))
    print(f"\n({results['seconds']:.0f} s)")
    if args.json:
        args.json.write_text(json.dumps(results, indent=1, default=float))
    if args.plot:
        plot(results, args.plot)


if __name__ == "__main__":
    main()
