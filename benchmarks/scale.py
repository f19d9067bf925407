"""Scale: seconds per round, ``aggregate_fit`` time and server memory against N.

Task: binary logistic regression, 5 features, 8 samples per client, drawn from a
seed per client (``numpy.random.default_rng(partition_id)``), `ADMMClient` with 5
full-batch local steps of lr 0.5; FedADMM / FedADMMClientDuals with rho = 0.1 and
``sampling_seed=0``. Each round samples a fraction f of the N clients (1% and 10%,
at least one client).

1. In-process driver (`flwr_admm.testing.run_rounds`, no Ray), N = 100, 1,000, 10,000:
   per strategy and f, the mean wall seconds of a round (round 1 dropped), the mean
   seconds inside ``aggregate_fit`` and the server's retained memory after the
   rounds: bytes still allocated (tracemalloc) by frames in the strategy's code
   (``flwr_admm/server``, ``flwr_admm/core``, ``flwr/server/strategy``) - the
   per-client state a strategy keeps. FedADMM caches (w_i, y_i) per client heard, so
   it grows with the number of clients seen; FedADMMClientDuals keeps z, S and two
   integers per key; FedAvg keeps nothing.
2. Flower's Ray simulation engine (`benchmarks.scale_engine`), 1,000 virtual
   SuperNodes, each run in its own subprocess.

    python -m benchmarks.scale [--quick] [--skip-engine]
"""

from __future__ import annotations

import time
import tracemalloc
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from flwr.common import Context, ndarrays_to_parameters
from flwr.server.strategy import FedAvg, Strategy

from benchmarks.common import base_parser, format_table, quiet_flower, size_text, write_json
from flwr_admm.client import ADMMClient
from flwr_admm.models import LogisticRegression
from flwr_admm.server import FedADMM, FedADMMClientDuals
from flwr_admm.testing import make_proxies, run_rounds

STRATEGIES = ("FedAvg", "FedADMM", "FedADMMClientDuals")
FRACTIONS = (0.01, 0.1)
N_FEATURES = 5
SAMPLES = 8
RHO = 0.1
FIT_CONFIG = {"learning_rate": 0.5, "local_steps": 5}
STATE_FILES = ("*/flwr_admm/server/*", "*/flwr_admm/core/*", "*/flwr/server/strategy/*")
IMG_DIR = Path(__file__).resolve().parent.parent / "docs"


def client_data(i: int) -> tuple[np.ndarray, np.ndarray]:
    """X_i (8 x 5) and labels y_i in {0, 1} of client i, from seed i."""
    rng = np.random.default_rng(i)
    X = rng.normal(size=(SAMPLES, N_FEATURES))
    w = np.linspace(-1.0, 1.0, N_FEATURES) + 0.3 * rng.normal(size=N_FEATURES)
    y = (X @ w + 0.5 * rng.normal(size=SAMPLES) > 0).astype(np.float64)
    return X, y


def client_fn(context: Context) -> ADMMClient:
    """Return an `ADMMClient` on partition ``partition-id``."""
    X, y = client_data(int(context.node_config["partition-id"]))
    return ADMMClient(LogisticRegression(N_FEATURES), X, y, context=context)


def make_strategy(name: str, num_clients: int, fraction: float, **extra: Any) -> Strategy:
    """FedAvg, FedADMM or FedADMMClientDuals sampling `fraction` of `num_clients`."""
    initial = LogisticRegression(N_FEATURES).init_params(0)
    kwargs: dict[str, Any] = {
        "initial_parameters": ndarrays_to_parameters(initial),
        "on_fit_config_fn": lambda server_round: dict(FIT_CONFIG),
        "fraction_fit": fraction,
        "fraction_evaluate": 0.0,
        "min_fit_clients": 1,
        "min_evaluate_clients": 0,
        "min_available_clients": num_clients,
        **extra,
    }
    if name == "FedADMM":
        return FedADMM(rho=RHO, sampling_seed=0, **kwargs)
    if name == "FedADMMClientDuals":
        return FedADMMClientDuals(rho=RHO, sampling_seed=0, **kwargs)
    if name == "FedAvg":
        return FedAvg(**kwargs)
    raise ValueError(f"strategy: must be one of {STRATEGIES}, got {name!r}")


def timed(method: Callable[..., Any], sink: list[float]) -> Callable[..., Any]:
    """Wrap `method` so each call's wall seconds are appended to `sink`."""

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        started = time.perf_counter()
        try:
            return method(*args, **kwargs)
        finally:
            sink.append(time.perf_counter() - started)

    return wrapper


def driver_run(
    name: str, num_clients: int, fraction: float, rounds: int, *, trace: bool
) -> dict[str, Any]:
    """One in-process run: seconds per round and in aggregate_fit, or retained bytes.

    With `trace`, tracemalloc runs (slowing everything) and only the bytes the
    strategy's frames still hold after the rounds are reported; without, the times.
    """
    proxies = make_proxies(client_fn, num_clients)
    strategy = make_strategy(name, num_clients, fraction)
    aggregate: list[float] = []
    stamps: list[float] = []
    strategy.aggregate_fit = timed(strategy.aggregate_fit, aggregate)  # type: ignore[method-assign]

    def stamp(server_round: int, parameters: Any) -> None:
        stamps.append(time.perf_counter())

    strategy.evaluate = stamp  # type: ignore[assignment,method-assign]
    if not trace:
        run_rounds(strategy, proxies, rounds)
        durations = np.diff(stamps).tolist()  # rounds 2..R: round 1 dropped
        return {
            "round_seconds": durations,
            "mean_round_seconds": float(np.mean(durations)),
            "mean_aggregate_fit_seconds": float(np.mean(aggregate[1:])),
        }
    tracemalloc.start(40)
    before = tracemalloc.take_snapshot()
    run_rounds(strategy, proxies, rounds)
    after = tracemalloc.take_snapshot()
    tracemalloc.stop()
    filters = [tracemalloc.Filter(True, p, all_frames=True) for p in STATE_FILES]
    diff = after.filter_traces(filters).compare_to(before.filter_traces(filters), "filename")
    return {"retained_state_bytes": int(sum(s.size_diff for s in diff))}


def sampled_count(num_clients: int, fraction: float) -> int:
    """Clients a round samples: Flower's ``max(int(f * N), min_fit_clients=1)``."""
    return max(int(fraction * num_clients), 1)


def driver_part(sizes: list[int], rounds: int) -> list[dict[str, Any]]:
    """Every (N, f, strategy): a timed run and a traced run."""
    rows = []
    for num_clients in sizes:
        for fraction in FRACTIONS:
            for name in STRATEGIES:
                row: dict[str, Any] = {
                    "strategy": name,
                    "num_clients": num_clients,
                    "fraction": fraction,
                    "sampled": sampled_count(num_clients, fraction),
                    "rounds": rounds,
                }
                row.update(driver_run(name, num_clients, fraction, rounds, trace=False))
                row.update(driver_run(name, num_clients, fraction, rounds, trace=True))
                rows.append(row)
                print(
                    f"driver N={num_clients} f={fraction} {name}: "
                    f"{row['mean_round_seconds']:.4f} s/round, aggregate_fit "
                    f"{row['mean_aggregate_fit_seconds'] * 1e3:.2f} ms, state "
                    f"{size_text(row['retained_state_bytes'])}",
                    flush=True,
                )
    for row in rows:
        base = next(
            r
            for r in rows
            if r["strategy"] == "FedAvg"
            and r["num_clients"] == row["num_clients"]
            and r["fraction"] == row["fraction"]
        )
        row["round_ratio_vs_fedavg"] = row["mean_round_seconds"] / base["mean_round_seconds"]
    return rows


def driver_table(rows: list[dict[str, Any]]) -> str:
    """Markdown table of the driver part."""
    return format_table(
        ["N", "f", "sampled", "strategy", "s/round", "x FedAvg", "aggregate_fit ms", "state KiB"],
        [
            [
                r["num_clients"],
                r["fraction"],
                r["sampled"],
                r["strategy"],
                f"{r['mean_round_seconds']:.4f}",
                f"{r['round_ratio_vs_fedavg']:.3f}",
                f"{r['mean_aggregate_fit_seconds'] * 1e3:.3f}",
                f"{r['retained_state_bytes'] / 1024:.1f}",
            ]
            for r in rows
        ],
    )


def plot(rows: list[dict[str, Any]], directory: Path) -> list[str]:
    """PNG plots of s/round, aggregate_fit and state bytes against N (log-log)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    directory.mkdir(parents=True, exist_ok=True)
    panels = [
        ("mean_round_seconds", "seconds per round"),
        ("mean_aggregate_fit_seconds", "aggregate_fit seconds"),
        ("retained_state_bytes", "server state bytes"),
    ]
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    for ax, (key, label) in zip(axes, panels, strict=True):
        for name in STRATEGIES:
            for fraction, style in zip(FRACTIONS, ("--", "-"), strict=True):
                pts = [r for r in rows if r["strategy"] == name and r["fraction"] == fraction]
                xs = [r["num_clients"] for r in pts]
                ys = [
                    max(float(r[key]), 1.0 if key == "retained_state_bytes" else 1e-6) for r in pts
                ]
                ax.plot(xs, ys, style, marker="o", label=f"{name} f={fraction:g}")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("N clients (in-process driver)")
        ax.set_title(label)
    axes[0].legend(fontsize=7)
    fig.tight_layout()
    path = directory / "scale_driver.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return [str(path)]


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Run the driver part (and the engine part unless skipped), print, write JSON/PNG."""
    parser = base_parser(__doc__.splitlines()[0])
    parser.add_argument("--skip-engine", action="store_true", help="no Ray simulation part")
    parser.add_argument("--plot-dir", type=Path, default=None, help="PNG directory")
    args = parser.parse_args(argv)
    quiet_flower()
    started = time.perf_counter()
    sizes = [20, 100] if args.quick else [100, 1000, 10000]
    rounds = 3 if args.quick else 6
    rows = driver_part(sizes, rounds)
    print("\n" + driver_table(rows))
    payload: dict[str, Any] = {
        "quick": args.quick,
        "task": {"n_features": N_FEATURES, "samples": SAMPLES, "fit_config": FIT_CONFIG},
        "rho": RHO,
        "driver": rows,
    }
    if not args.skip_engine:
        from benchmarks.scale_engine import engine_part

        payload["engine"] = engine_part(quick=args.quick)
    plot_dir = args.plot_dir
    if plot_dir is None and not args.quick:
        plot_dir = IMG_DIR
    if plot_dir is not None:
        payload["plots"] = plot(rows, plot_dir)
    payload["seconds"] = time.perf_counter() - started
    path = write_json("scale", payload, args.output)
    print(f"wrote {path} ({payload['seconds']:.0f} s)")
    return payload


if __name__ == "__main__":
    main()
