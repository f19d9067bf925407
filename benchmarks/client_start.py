"""Where the local solve starts: own last w_i or the received z, under client-held duals.

`FedADMMClientDuals` (constant rho, alpha = 1: what client-held duals support) with
`ADMMClient(local_init="previous")` (the default: the client's own last w_i) against
`local_init="consensus"` (the received z, as FedDyn's clients start), through the
driver, tracker and client sampling of `benchmarks.convergence`, every client and a
sampled fraction (the task's own, else ``--fraction``; twice the round budget). Cases:
FedDyn's best digits grid points (rho 0.1, 3 epochs, lr 0.2 and 0.5), the untuned local
settings at rho 1, and synthetic / seed-logreg at rho 0.1.

    python -m benchmarks.client_start [--tasks seed-logreg,synthetic,digits] [--fraction 0.3]
"""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Any

from flwr.common import Context
from threadpoolctl import threadpool_limits

from benchmarks.common import BLAS_THREADS, base_parser, format_table, quiet_flower, write_json
from benchmarks.defaults import tracked_run
from benchmarks.problems import Problem, build_problems
from flwr_admm.client import ADMMClient
from flwr_admm.server import FedADMMClientDuals

STARTS = ("previous", "consensus")
# (task, strategy keywords, lr, local steps or epochs); None: the task's untuned ones
CASES: list[tuple[str, dict[str, Any], float | None, int | None]] = [
    ("seed-logreg", {"rho": 1.0}, None, None),
    ("seed-logreg", {"rho": 0.1}, 2.0, 5),
    ("synthetic", {"rho": 1.0}, None, None),
    ("synthetic", {"rho": 0.1}, 0.05, 20),
    ("digits-mlp-dirichlet0.1", {"rho": 1.0}, None, None),
    ("digits-mlp-dirichlet0.1", {"rho": 0.1}, 0.2, 3),
    ("digits-mlp-dirichlet0.1", {"rho": 0.1}, 0.5, 3),
]


def run_start(
    problem: Problem, kwargs: dict[str, Any], fraction: float, local: dict[str, Any]
) -> dict[str, Any]:
    """Run FedADMMClientDuals(**kwargs) with ADMMClient(local_init=local["init"])."""
    data = problem.task.data

    def client_fn(context: Context) -> ADMMClient:
        i = int(context.node_config["partition-id"])
        model_i = problem.task.make_model()
        return ADMMClient(
            model_i, data.X[i], data.y[i], context=context, seed=i, local_init=local["init"]
        )

    lr, steps = float(local["lr"]), int(local["steps"])
    return tracked_run(problem, FedADMMClientDuals, kwargs, fraction, lr, steps, client_fn)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Run every case with both starts, every client and a sampled fraction; print, write JSON."""
    parser = base_parser(__doc__.splitlines()[0])
    parser.add_argument("--tasks", default="seed-logreg,synthetic,digits")
    parser.add_argument("--fraction", type=float, default=0.3)
    args = parser.parse_args(argv)
    quiet_flower()
    results: list[dict[str, Any]] = []
    rows: list[list[object]] = []
    started = time.perf_counter()
    with threadpool_limits(BLAS_THREADS):
        problems = {p.name: p for p in build_problems(args.tasks.split(","), args.quick)}
        for name, kwargs, lr, steps in CASES:
            if name not in problems:
                continue
            problem = problems[name]
            own = float(problem.task.defaults.get("fraction_fit", 1.0))
            for fraction in (1.0, own if own < 1.0 else args.fraction):
                budget = problem.max_rounds * (1 if fraction == 1.0 else 2)
                sized = replace(problem, max_rounds=budget)
                local = {
                    "lr": lr or problem.defaults["lr"],
                    "steps": steps or problem.defaults["steps"],
                }
                row: list[object] = [name, fraction, kwargs, local["lr"], local["steps"]]
                for init in STARTS:
                    run = run_start(sized, kwargs, fraction, {**local, "init": init})
                    entry = {"task": name, "fraction": fraction, **kwargs, **local}
                    results.append({**entry, "local_init": init, **run})
                    final = run["rounds_to"][str(problem.targets[-1])]
                    best = f"> {budget} ({run['best']:.3g})"
                    row.append(final if final is not None else best)
                rows.append(row)
    headers = ["task", "fraction", "strategy", "lr", "steps", *(f"rounds: {s}" for s in STARTS)]
    print(format_table(headers, rows))
    payload = {"seconds": time.perf_counter() - started, "runs": results}
    path = write_json("client_start", payload, args.output)
    print(f"\nwrote {path} ({payload['seconds']:.0f} s)")
    return payload


if __name__ == "__main__":
    main()
