"""The penalized local loop's cost per step vs a bare numpy gradient loop.

On the same model, data, batches and step size, three loops run interleaved:

- bare: ``_, g = model.loss_and_grad(w, Xb, yb); w_k -= lr * g_k`` (what a FedAvg
  client does), drawing its minibatches with the same `LocalPlan.batches` call as the
  solver (a minibatch loop has to draw them; full-batch cases draw nothing);
- `flwr_admm.core.local_solver.penalized_local_solve` with ``prox_step="exact"`` and with
  ``prox_step="gradient"``, rho = 0.1 around a center v != w.

Times are CPU times of the process (single-threaded work, one BLAS thread, garbage
collector paused), interleaved repeats. Each loop runs with a short and a long step
count; within one repeat, a loop's cost per step is the difference of its two times
over the difference of the step counts, so fixed costs (copying the start, the final
full-data loss the penalized loop reports) drop out; they are reported separately as
"fixed". The ratio to bare is taken per repeat (all loops of a repeat ran back to
back) and reported as the median with its quartiles; the ratio of the median costs
is kept next to it. The JSON holds every repeat's CPU times.

    python -m benchmarks.client_loop [--quick]
"""

from __future__ import annotations

import gc
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import NDArray
from threadpoolctl import threadpool_limits

from benchmarks.common import (
    BLAS_THREADS,
    base_parser,
    format_table,
    interleaved_times,
    median,
    settle_allocator,
    write_json,
)
from flwr_admm.core.local_solver import LocalPlan, penalized_local_solve
from flwr_admm.data import load_task
from flwr_admm.models import Model
from flwr_admm.models.base import Params

RHO = 0.1


@dataclass(frozen=True)
class Case:
    """One model on one client's data, with its step size and batch size."""

    name: str
    model: Model
    X: NDArray[np.float64]
    y: NDArray[np.int64]
    learning_rate: float
    batch_size: int | None


def cases() -> list[Case]:
    """seed-logreg client 0, synthetic's largest client, a digits MLP client (batch 16)."""
    seed = load_task("seed-logreg")
    synthetic = load_task("synthetic")
    largest = int(np.argmax([X.shape[0] for X in synthetic.data.X]))
    digits = load_task("digits", partitioner="dirichlet", dirichlet_alpha=0.1, model="mlp")
    biggest_digits = int(np.argmax([X.shape[0] for X in digits.data.X]))
    built = []
    for name, task, i, lr, batch in (
        ("seed-logreg (d=20, n=500, full batch)", seed, 0, 1.0, None),
        ("synthetic softmax (60x10, full batch)", synthetic, largest, 0.01, None),
        ("digits MLP (64-32-10, batch 16)", digits, biggest_digits, 0.2, 16),
    ):
        model = task.make_model()
        X = model.check_data(task.data.X[i])
        built.append(Case(name, model, X, model.encode_labels(task.data.y[i]), lr, batch))
    return built


def bare_loop(case: Case, start: Params, steps: int) -> Callable[[], Params]:
    """Return the baseline: plain gradient steps over the batches the solver draws (same seed)."""
    plan = LocalPlan(learning_rate=case.learning_rate, steps=steps, batch_size=case.batch_size)
    lr = case.learning_rate

    def run() -> Params:
        w = [p.copy() for p in start]
        for index in plan.batches(case.X.shape[0], np.random.default_rng(0)):
            Xb, yb = (case.X, case.y) if index is None else (case.X[index], case.y[index])
            _, grads = case.model.loss_and_grad(w, Xb, yb)
            for wk, gk in zip(w, grads, strict=True):
                wk -= lr * gk
        return w

    return run


def penalized_loop(
    case: Case, start: Params, center: Params, steps: int, prox_step: str
) -> Callable[[], Any]:
    """`penalized_local_solve` with rho = RHO around `center`."""
    plan = LocalPlan(
        learning_rate=case.learning_rate,
        steps=steps,
        batch_size=case.batch_size,
        prox_step=prox_step,  # type: ignore[arg-type]
    )

    def run() -> Any:
        rng = np.random.default_rng(0)
        return penalized_local_solve(
            case.model, start, case.X, case.y, plan, center=center, rho=RHO, rng=rng
        )

    return run


def measure(case: Case, short: int, long: int, repeats: int) -> dict[str, Any]:
    """Per-step and fixed cost of each loop from interleaved short and long runs."""
    start = case.model.init_params(0)
    rng = np.random.default_rng(1)
    center = [p + 0.1 * rng.standard_normal(p.shape) for p in start]
    loops = {}
    for name in ("bare", "exact", "gradient"):
        for steps in (short, long):
            if name == "bare":
                loops[f"{name}/{steps}"] = bare_loop(case, start, steps)
            else:
                loops[f"{name}/{steps}"] = penalized_loop(case, start, center, steps, name)
    gc.disable()  # a collection would land in whichever loop happened to trigger it
    try:
        _, times = interleaved_times(loops, repeats)  # CPU time: single-threaded work
    finally:
        gc.enable()
    row: dict[str, Any] = {"case": case.name, "short_steps": short, "long_steps": long}
    per_step = {}
    for name in ("bare", "exact", "gradient"):
        # paired by repeat: the short and long runs of one repeat ran back to back
        pairs = zip(times[f"{name}/{short}"], times[f"{name}/{long}"], strict=True)
        per_step[name] = [(t_long - t_short) / (long - short) for t_short, t_long in pairs]
        row[f"{name}_step_seconds"] = median(per_step[name])
        row[f"{name}_fixed_seconds"] = median(times[f"{name}/{short}"]) - short * median(
            per_step[name]
        )
        row[f"{name}_call_seconds_long"] = median(times[f"{name}/{long}"])
    for name in ("exact", "gradient"):
        ratios = [a / b for a, b in zip(per_step[name], per_step["bare"], strict=True)]
        row[f"{name}_step_ratio"] = median(ratios)
        row[f"{name}_step_ratio_quartiles"] = quartiles(ratios)
        row[f"{name}_step_ratio_of_medians"] = (
            row[f"{name}_step_seconds"] / row["bare_step_seconds"]
        )
        row[f"{name}_call_ratio_long"] = (
            row[f"{name}_call_seconds_long"] / row["bare_call_seconds_long"]
        )
    row["cpu_seconds"] = times
    return row


def quartiles(values: list[float]) -> list[float]:
    """First and third quartile (the spread around the median), or the lone value twice."""
    if len(values) < 2:
        return [values[0], values[0]]
    first, _, third = statistics.quantiles(values, n=4)
    return [first, third]


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Measure every case, print the table, write JSON."""
    parser = base_parser(__doc__.splitlines()[0])
    args = parser.parse_args(argv)
    short, long = (5, 20) if args.quick else (20, 120)
    repeats = 3 if args.quick else 101
    started = time.perf_counter()
    settle_allocator()
    with threadpool_limits(BLAS_THREADS):
        rows = [measure(case, short, long, repeats) for case in cases()]
    table = [
        [
            r["case"],
            f"{r['bare_step_seconds'] * 1e6:.1f}",
            f"{r['exact_step_seconds'] * 1e6:.1f}",
            f"{r['gradient_step_seconds'] * 1e6:.1f}",
            _ratio_text(r, "exact"),
            _ratio_text(r, "gradient"),
            f"{r['exact_fixed_seconds'] * 1e6:.0f} / {r['bare_fixed_seconds'] * 1e6:.0f}",
            f"{r['exact_call_ratio_long']:.2f}",
        ]
        for r in rows
    ]
    headers = [
        "case",
        "bare us/step",
        "exact us/step",
        "gradient us/step",
        "exact ratio [quartiles]",
        "gradient ratio [quartiles]",
        "fixed us (exact / bare)",
        f"exact call ratio ({long} steps)",
    ]
    print(format_table(headers, table))
    print(f"goal: per-step ratio <= 1.1 (rho = {RHO}, median of {repeats} interleaved repeats)")
    payload = {
        "quick": args.quick,
        "rho": RHO,
        "repeats": repeats,
        "blas_threads": BLAS_THREADS,
        "seconds": time.perf_counter() - started,
        "results": rows,
    }
    path = write_json("client_loop", payload, args.output)
    print(f"wrote {path} ({payload['seconds']:.0f} s)")
    return payload


def _ratio_text(row: dict[str, Any], name: str) -> str:
    low, high = row[f"{name}_step_ratio_quartiles"]
    return f"{row[f'{name}_step_ratio']:.2f} [{low:.2f}, {high:.2f}]"


if __name__ == "__main__":
    main()
