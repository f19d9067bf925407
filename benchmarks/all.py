"""Run every benchmark, then print the issue's goals next to the measured ratios.

    python -m benchmarks.all [--quick] [--output-dir DIR] [--skip engine,...]

Writes ``<name>.json`` per benchmark and ``all.json`` (the goal table) to DIR
(default ``benchmarks/results``). Full: under 10 minutes on 2 cores; --quick: under
a minute, for CI smoke runs (its numbers are not meant to be read).
"""

from __future__ import annotations

import importlib
import time
from pathlib import Path
from typing import Any

from benchmarks.common import RESULTS_DIR, base_parser, format_table, write_json

BENCHMARKS = ("client_loop", "server_cost", "client_duals_cost", "convergence", "engine")


def goals(results: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """Return the issue's goals, each with its measured value and whether it is met."""
    rows: list[dict[str, Any]] = []

    def add(goal: str, limit: float, value: float | None, note: str = "") -> None:
        met = None if value is None else value <= limit
        rows.append({"goal": goal, "limit": limit, "measured": value, "met": met, "note": note})

    for task in results.get("convergence", {}).get("tasks", []):
        summary = task["summary"]
        checks = [
            ("untuned_rb_over_tuned_fedadmm", "untuned RB rounds / tuned FedADMM", 1.5),
            (
                "relaxed_untuned_rb_over_tuned",
                "untuned RB rounds / tuned FedADMM, both alpha=1.6",
                1.5,
            ),
        ]
        if task["task"] == "seed-logreg":  # the issue sets the 1/3 goal on this task
            checks[:0] = [
                ("fedadmm_over_best_baseline", "FedADMM rounds / best-tuned baseline", 1 / 3),
                (
                    "relaxed_fedadmm_over_best_baseline",
                    "FedADMM alpha=1.6 rounds / best-tuned baseline",
                    1 / 3,
                ),
            ]
        for key, label, limit in checks:
            entry = summary[key]
            value = entry["value"] if entry["value"] is not None else entry["bound"]
            note = entry["note"] or ""
            add(f"{label}, {task['task']} @ {summary['final_target']:g}", limit, value, note)
    for row in results.get("server_cost", {}).get("results", []):
        size = f"P={row['num_parameters']:.0e} N={row['num_clients']}"
        if row["num_parameters"] >= 10**6:
            add(f"aggregate_fit CPU time FedADMM / FedAvg, {size}", 1.5, row["time_ratio"])
        add(
            f"aggregate_fit peak extra memory (model copies), {size}",
            2.0,
            row["fedadmm_peak_extra_models"],
            "above the cached state",
        )
    for row in results.get("client_duals_cost", {}).get("results", []):
        if row["num_parameters"] >= 10**6:
            size = f"P={row['num_parameters']:.0e} N={row['num_clients']}"
            add(
                f"aggregate_fit CPU time FedADMMClientDuals / FedAvg, {size}",
                1.5,
                row["time_ratio"],
                "client-held duals",
            )
        add(
            f"aggregate_fit peak extra memory (model copies), FedADMMClientDuals, "
            f"P={row['num_parameters']:.0e} N={row['num_clients']}",
            2.0,
            row["client_duals_peak_extra_models"],
            "state: z and S only, for any N",
        )
    engine = results.get("engine")
    if engine and "ratio" in engine:
        add("engine s/round FedADMM / FedAvg", 1.05, engine["ratio"])
    for row in results.get("client_loop", {}).get("results", []):
        for variant in ("exact", "gradient"):
            add(
                f"local loop s/step {variant} / bare, {row['case']}",
                1.1,
                row[f"{variant}_step_ratio"],
            )
    return rows


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Run the benchmarks in turn, then print and write the goal table."""
    parser = base_parser(__doc__.splitlines()[0])
    parser.add_argument("--output-dir", type=Path, default=RESULTS_DIR)
    parser.add_argument("--skip", default="", help="comma-separated benchmark names")
    args = parser.parse_args(argv)
    skip = {name for name in args.skip.split(",") if name}
    unknown = skip - set(BENCHMARKS)
    if unknown:
        parser.error(f"--skip: unknown benchmark(s) {sorted(unknown)}; known: {BENCHMARKS}")
    started = time.perf_counter()
    results: dict[str, dict[str, Any]] = {}
    seconds: dict[str, float] = {}
    for name in BENCHMARKS:
        if name in skip:
            continue
        print(f"\n# benchmarks.{name}", flush=True)
        module = importlib.import_module(f"benchmarks.{name}")
        flags = ["--quick"] if args.quick else []
        begun = time.perf_counter()
        results[name] = module.main([*flags, "--output", str(args.output_dir / f"{name}.json")])
        seconds[name] = time.perf_counter() - begun
    table = goals(results)
    print("\n# goals")
    print(
        format_table(
            ["goal", "limit", "measured", "met"],
            [
                [
                    g["goal"],
                    f"{g['limit']:.3g}",
                    "-" if g["measured"] is None else f"{g['measured']:.3g}",
                    {True: "yes", False: "NO", None: "n/a"}[g["met"]],
                ]
                for g in table
            ],
        )
    )
    payload = {
        "quick": args.quick,
        "seconds": time.perf_counter() - started,
        "seconds_per_benchmark": seconds,
        "goals": table,
    }
    path = write_json("all", payload, args.output_dir / "all.json")
    print(f"\nwrote {path} ({payload['seconds']:.0f} s in all)")
    return payload


if __name__ == "__main__":
    main()
