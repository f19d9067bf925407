"""Server cost of one round: ``aggregate_fit`` time and peak memory, FedADMM vs FedAvg.

Both strategies aggregate the IDENTICAL replies (the FitRes list is built once per
configuration; FedAvg's in-place aggregation mutates only the arrays it deserializes,
never the FitRes). The server knows N clients and samples 10 a round; FedADMM is
first run over all N clients (rounds of 10) so it holds w_i and y_i for every one of
them, as in a long run. Then the same 10 clients reply each timed round.

- time: median of interleaved repeats (FedAvg, FedADMM, FedADMM, FedAvg, ...), as
  CPU time of the process (the ratio reported; the work is single-threaded, one
  BLAS thread) and as wall time; glibc's allocator is put in one state first
  (`benchmarks.common.settle_allocator`);
- memory: tracemalloc peak above the pre-call level during one call (numpy reports
  its buffers to tracemalloc), in model copies (P * 8 bytes), next to FedADMM's cached
  state; the issue's budget is cached state + two model copies;
- profile: where FedADMM's time goes (cProfile by function), and time per reply in
  "passes", one pass being ``a += b`` over the whole model.

Configurations whose server state (N x P x 16 bytes for w_i and y_i in float64) does
not fit the memory budget are skipped and listed with their sizes.

    python -m benchmarks.server_cost [--quick] [--memory-budget-gib 6]

To measure a variant, pass a FedADMM subclass: ``measure(P, N, repeats, profile=True,
factory=MyFedADMM)`` returns the same row (its ratios are against Flower's FedAvg).
"""

from __future__ import annotations

import cProfile
import gc
import itertools
import pstats
import time
import tracemalloc
from collections.abc import Callable
from typing import Any

import numpy as np
from flwr.server.strategy import FedAvg
from threadpoolctl import threadpool_limits

from benchmarks.common import (
    BLAS_THREADS,
    base_parser,
    format_table,
    interleaved_times,
    median,
    quiet_flower,
    settle_allocator,
    size_text,
    write_json,
)
from benchmarks.server_setup import (
    FLOAT,
    SAMPLED,
    cached_state_bytes,
    peak_need_bytes,
    prepared_fedadmm,
    state_bytes,
)
from flwr_admm.server import FedADMM


def peak_extra_bytes(call: Any) -> int:
    """Tracemalloc peak above the level before `call()` (tracing must be on)."""
    gc.collect()
    before = tracemalloc.get_traced_memory()[0]
    tracemalloc.reset_peak()
    result = call()
    peak = tracemalloc.get_traced_memory()[1]
    del result
    return peak - before


def pass_seconds(num_parameters: int, repeats: int) -> float:
    """Median time of one ``a += b`` over a model of `num_parameters` float64 values."""
    a, b = np.ones(num_parameters), np.ones(num_parameters)
    _, cpu = interleaved_times({"pass": lambda: np.add(a, b, out=a)}, repeats)
    return median(cpu["pass"])


PROFILED = (  # the legacy translator, the round layer, FedADMM's round, the core
    "aggregate_fit",
    "aggregate",
    "parameters_to_views",
    "check_reply",
    "absorb_all",
    "fold_in",
    "finish",
    "complete",
    "z_step",
    "dual_step",
    "round_report",
    "_model_parameters",
)


def profile_call(call: Any) -> dict[str, float]:
    """Cumulative seconds of the interesting functions during one `call()`."""
    profiler = cProfile.Profile()
    profiler.enable()
    call()
    profiler.disable()
    stats = pstats.Stats(profiler).stats  # type: ignore[attr-defined]
    seconds: dict[str, float] = {}
    for (_, _, name), (_, _, _, cumulative, _) in stats.items():
        if name in PROFILED:
            seconds[name] = seconds.get(name, 0.0) + cumulative
    return seconds


def measure(
    num_parameters: int,
    num_clients: int,
    repeats: int,
    profile: bool,
    factory: Callable[..., FedADMM] = FedADMM,
) -> dict[str, Any]:
    """Time, memory (and optionally a profile) of one configuration.

    `factory` builds the FedADMM under test (a subclass measures a variant).
    """
    fedavg = FedAvg(fraction_evaluate=0.0)
    setup_started = time.perf_counter()
    # Memory first, with every allocation of the setup traced, so frees of replaced
    # client models count too; timing runs afterwards without tracing overhead.
    tracemalloc.start()
    strategy, timed = prepared_fedadmm(num_parameters, num_clients, factory)
    server_round = num_clients // SAMPLED + 1
    # Each strategy alternates between the two reply sets, so FedADMM never folds in
    # the very bytes its records already view.
    turns = {"FedAvg": itertools.count(), "FedADMM": itertools.count()}

    def run_fedavg() -> Any:
        return fedavg.aggregate_fit(server_round, timed[next(turns["FedAvg"]) % 2], [])

    def run_fedadmm() -> Any:
        return strategy.aggregate_fit(server_round, timed[next(turns["FedADMM"]) % 2], [])

    memory = {"FedAvg": peak_extra_bytes(run_fedavg), "FedADMM": peak_extra_bytes(run_fedadmm)}
    tracemalloc.stop()
    setup_seconds = time.perf_counter() - setup_started
    wall, cpu = interleaved_times(
        {"FedAvg": run_fedavg, "FedADMM": run_fedadmm},
        repeats,
    )
    model_bytes = num_parameters * FLOAT
    state = cached_state_bytes(strategy)
    row: dict[str, Any] = {
        "num_parameters": num_parameters,
        "num_clients": num_clients,
        "sampled": SAMPLED,
        "repeats": repeats,
        "fedavg_seconds": median(cpu["FedAvg"]),
        "fedadmm_seconds": median(cpu["FedADMM"]),
        "time_ratio": median(cpu["FedADMM"]) / median(cpu["FedAvg"]),
        "fedavg_wall_seconds": median(wall["FedAvg"]),
        "fedadmm_wall_seconds": median(wall["FedADMM"]),
        "wall_time_ratio": median(wall["FedADMM"]) / median(wall["FedAvg"]),
        "fedavg_cpu_times": cpu["FedAvg"],
        "fedadmm_cpu_times": cpu["FedADMM"],
        "fedavg_wall_times": wall["FedAvg"],
        "fedadmm_wall_times": wall["FedADMM"],
        "model_bytes": model_bytes,
        "cached_state_bytes": state,
        "fedavg_peak_extra_bytes": memory["FedAvg"],
        "fedadmm_peak_extra_bytes": memory["FedADMM"],
        "fedavg_peak_extra_models": memory["FedAvg"] / model_bytes,
        "fedadmm_peak_extra_models": memory["FedADMM"] / model_bytes,
        "fedadmm_peak_over_budget": (state + memory["FedADMM"]) / (state + 2 * model_bytes),
        "setup_seconds": setup_seconds,
    }
    if profile:
        one_pass = pass_seconds(num_parameters, max(5, repeats))
        row["pass_seconds"] = one_pass
        row["fedavg_passes_per_reply"] = row["fedavg_seconds"] / one_pass / SAMPLED
        row["fedadmm_passes_per_reply"] = row["fedadmm_seconds"] / one_pass / SAMPLED
        row["fedadmm_profile_seconds"] = profile_call(run_fedadmm)
    return row


def repeats_for(num_parameters: int, quick: bool) -> int:
    """More repeats for the fast small models, an odd count for a clean median."""
    if quick:
        return 5
    return 31 if num_parameters <= 10**4 else 9 if num_parameters <= 10**6 else 5


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Run every feasible configuration, print the tables and write JSON."""
    parser = base_parser(__doc__.splitlines()[0])
    parser.add_argument("--memory-budget-gib", type=float, default=6.0)
    args = parser.parse_args(argv)
    quiet_flower()
    sizes = (10**4, 10**5) if args.quick else (10**4, 10**6, 10**7)
    counts = (10, 100) if args.quick else (10, 100, 1000)
    budget = args.memory_budget_gib * 2**30
    started = time.perf_counter()
    rows, skipped = [], []
    settle_allocator()
    with threadpool_limits(BLAS_THREADS):
        for num_parameters in sizes:
            for num_clients in counts:
                need = peak_need_bytes(num_parameters, num_clients)
                if need > budget:
                    skipped.append(
                        {
                            "num_parameters": num_parameters,
                            "num_clients": num_clients,
                            "state_bytes": state_bytes(num_parameters, num_clients),
                            "need_bytes": need,
                        }
                    )
                    continue
                profile = num_parameters >= 10**5 or args.quick
                rows.append(
                    measure(
                        num_parameters,
                        num_clients,
                        repeats_for(num_parameters, args.quick),
                        profile,
                    )
                )
                print_row(rows[-1])
    print_tables(rows, skipped, args.memory_budget_gib)
    payload = {
        "quick": args.quick,
        "blas_threads": BLAS_THREADS,
        "memory_budget_gib": args.memory_budget_gib,
        "seconds": time.perf_counter() - started,
        "results": rows,
        "skipped": skipped,
    }
    path = write_json("server_cost", payload, args.output)
    print(f"\nwrote {path} ({payload['seconds']:.0f} s)")
    return payload


def print_row(row: dict[str, Any]) -> None:
    """One progress line per configuration."""
    print(
        f"P={row['num_parameters']:.0e} N={row['num_clients']}: "
        f"FedAvg {row['fedavg_seconds'] * 1e3:.2f} ms, "
        f"FedADMM {row['fedadmm_seconds'] * 1e3:.2f} ms, "
        f"ratio {row['time_ratio']:.2f}",
        flush=True,
    )


def print_tables(rows: list[dict[str, Any]], skipped: list[dict[str, Any]], budget: float) -> None:
    """Time/memory table, profile table and the skipped configurations."""
    headers = [
        "params",
        "clients",
        "FedAvg ms",
        "FedADMM ms",
        "time ratio (CPU)",
        "time ratio (wall)",
        "cached state",
        "FedAvg peak extra (models)",
        "FedADMM peak extra (models)",
        "FedADMM peak / (state + 2 models)",
    ]
    table = [
        [
            f"{r['num_parameters']:.0e}",
            r["num_clients"],
            f"{r['fedavg_seconds'] * 1e3:.2f}",
            f"{r['fedadmm_seconds'] * 1e3:.2f}",
            f"{r['time_ratio']:.2f}",
            f"{r['wall_time_ratio']:.2f}",
            size_text(r["cached_state_bytes"]),
            f"{r['fedavg_peak_extra_models']:.1f}",
            f"{r['fedadmm_peak_extra_models']:.1f}",
            f"{r['fedadmm_peak_over_budget']:.2f}",
        ]
        for r in rows
    ]
    print("\n" + format_table(headers, table))
    profiled = [r for r in rows if "fedadmm_profile_seconds" in r]
    if profiled:
        print(
            "\nFedADMM.aggregate_fit profile: share of its time per function (cumulative, "
            "so nested: finish contains dual_step ...); passes = time per reply / time "
            "of one `a += b` over the model"
        )
        labels = [f"P={r['num_parameters']:.0e} N={r['num_clients']}" for r in profiled]
        table = [
            [
                "passes per reply, FedAvg",
                *(f"{r['fedavg_passes_per_reply']:.1f}" for r in profiled),
            ],
            [
                "passes per reply, FedADMM",
                *(f"{r['fedadmm_passes_per_reply']:.1f}" for r in profiled),
            ],
        ]
        for name in PROFILED[1:]:
            shares = []
            for r in profiled:
                seconds = r["fedadmm_profile_seconds"]
                total = seconds.get("aggregate_fit") or 1.0
                shares.append(f"{seconds.get(name, 0.0) / total:.0%}")
            table.append([name, *shares])
        print(format_table(["", *labels], table))
    for s in skipped:
        print(
            f"skipped P={s['num_parameters']:.0e} N={s['num_clients']}: state "
            f"{size_text(s['state_bytes'])}, needs ~{size_text(s['need_bytes'])} > budget "
            f"{budget:g} GiB"
        )


if __name__ == "__main__":
    main()
