"""Candidate untuned defaults of `FedADMM`: rounds to target on every task, no tuning.

Each candidate is a set of FedADMM keywords (rho0 = 1 unless said) run on the task's untuned
local settings (`Problem.defaults`) through the same driver, tracker and client
sampling as `benchmarks.convergence`, with full participation and with a sampled
fraction (the task's own when it samples, else ``--fraction``: 3 of 10 clients), the
sampled runs with twice the round budget. The candidate that `FedADMM()` (Message
API) uses is labelled "defaults" (the linearized form, ``Linearized()``); "prox
defaults" is ``FedADMM(form="prox")``.

The CNN tasks (``cnn-sgd``: every node, 30 rounds; ``cnn-sgd-partial``: 3 of 10 nodes,
60 rounds) run `benchmarks.cnn`'s momentum-SGD task (Flower's PyTorch quickstart with
`TorchADMM`) with the Message API's ``FedADMM(**candidate)`` in place of the example's
strategy, on ``--cnn-seeds``; their column is the mean final accuracy.

    python -m benchmarks.defaults [--tasks seed-logreg,synthetic,digits,cnn-sgd,cnn-sgd-partial]
                                  [--fraction 0.3] [--candidates LABEL,...] [--cnn-seeds 0,1,2]
"""

from __future__ import annotations

import math
import random
import tempfile
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import numpy as np
from flwr.common import Context, Scalar, ndarrays_to_parameters
from flwr.server.strategy import Strategy
from threadpoolctl import threadpool_limits

from benchmarks import cnn
from benchmarks.common import BLAS_THREADS, base_parser, format_table, quiet_flower, write_json
from benchmarks.convergence import Tracker, _StopRunError, client_fn_for
from benchmarks.problems import Problem, build_problems
from flwr_admm import FedADMM as MessageFedADMM
from flwr_admm import RunDivergedError
from flwr_admm.core import ResidualBalancing
from flwr_admm.core.linearized import LINEARIZED_CONVEX, Linearized
from flwr_admm.core.settings import TEXTBOOK
from flwr_admm.server import FedADMM
from flwr_admm.testing import make_proxies, run_rounds

PLAIN: dict[str, Any] = {**TEXTBOOK, "rho": 1.0}
CANDIDATES: dict[str, dict[str, Any]] = {
    "plain (rho 1)": PLAIN,
    "RB": {**PLAIN, "rho_schedule": ResidualBalancing()},
    "RB alpha 1.6": {**PLAIN, "rho_schedule": ResidualBalancing(), "relaxation": 1.6},
    "defaults": {"form": None},  # the Message API's FedADMM(): Linearized()
    # the prox form's defaults: RB from 0.1, the adaptive dual step from 0.2
    "prox defaults": {"form": "prox"},
    "prox defaults gamma 0.2": {"dual_step": 0.2},  # with the fixed step of before
    # the defaults' neighbours on the CNN task (docs/torch.md): rho0 = 1, gamma 0.2 or 0.5
    "RB gamma 0.2": {**PLAIN, "rho_schedule": ResidualBalancing(), "dual_step": 0.2},
    "RB gamma 0.5 rho 0.1": {
        **PLAIN,
        "rho_schedule": ResidualBalancing(),
        "dual_step": 0.5,
        "rho": 0.1,
    },
    # z_average="replies" (docs/peers.md): the z-step averages this round's replies
    # only; identical to the row above it with every client replying.
    "RB alpha 1.6 z-replies": {
        **PLAIN,
        "rho_schedule": ResidualBalancing(),
        "relaxation": 1.6,
        "z_average": "replies",
    },
    "prox defaults z-replies": {"form": "prox", "z_average": "replies"},
    # the linearized form (docs/options.md): its convex recipe
    "linearized convex": {"form": LINEARIZED_CONVEX},
    # the defaults' momentum start (beta 0.9 behind the steady gate 0.9): without it,
    # and without its gate (the restart test alone)
    "defaults no momentum": {"form": Linearized(momentum=0.0)},
    "defaults ungated momentum": {"form": Linearized(steady=None)},
    "defaults z-replies": {"form": None, "z_average": "replies"},
    "defaults ungated momentum z-replies": {
        "form": Linearized(steady=None),
        "z_average": "replies",
    },
    "defaults gamma 1 z-replies": {"form": Linearized(dual_step=1.0), "z_average": "replies"},
    "linearized convex z-replies": {"form": LINEARIZED_CONVEX, "z_average": "replies"},
}
# The candidates a plain run compares (the z_average rows: --candidates).
CHOSEN = ",".join(label for label in CANDIDATES if "z-replies" not in label)
CNN_TASKS = ("cnn-sgd", "cnn-sgd-partial")  # benchmarks.cnn's momentum-SGD tasks


def run_candidate(problem: Problem, kwargs: dict[str, Any], fraction: float) -> dict[str, Any]:
    """Run FedADMM(**kwargs) on the task's untuned local settings; rounds to each target."""
    lr, steps = float(problem.defaults["lr"]), int(problem.defaults["steps"])
    return tracked_run(problem, FedADMM, kwargs, fraction, lr, steps, client_fn_for(problem))


def tracked_run(
    problem: Problem,
    strategy_class: Callable[..., Strategy],
    kwargs: dict[str, Any],
    fraction: float,
    lr: float,
    steps: int,
    client_fn: Callable[[Context], Any],
) -> dict[str, Any]:
    """Run strategy_class(**kwargs) until the task's targets or its round budget.

    Local settings lr and steps (or epochs) for every client, `fraction` of them a
    round by Flower's sampler (seeded as in `benchmarks.convergence`); returns the
    rounds to each target, the rounds run, the best metric and the seconds.
    """
    task = problem.task
    tracker = Tracker(problem)
    fit_config: dict[str, Scalar] = {
        "learning_rate": lr,
        problem.steps_key: steps,
        "batch_size": int(problem.batch_size or 0),
    }
    model = task.make_model()
    strategy = strategy_class(
        **kwargs,
        fraction_fit=fraction,
        min_fit_clients=int(task.defaults.get("min_fit_clients", 2)),
        min_available_clients=task.data.num_clients,
        fraction_evaluate=0.0,
        initial_parameters=ndarrays_to_parameters(model.init_params(getattr(model, "seed", 0))),
        evaluate_fn=tracker,
        on_fit_config_fn=lambda server_round: dict(fit_config),
        sampling_seed=None,
    )
    proxies = make_proxies(client_fn, task.data.num_clients)
    random.seed(0)  # Flower's ClientManager.sample, as in benchmarks.convergence
    started = time.perf_counter()
    with np.errstate(all="ignore"):
        try:
            run_rounds(strategy, proxies, problem.max_rounds)
        except _StopRunError:
            pass
        except RunDivergedError:  # the strategies' watchdog (flwr_admm.core.health)
            tracker.stop_reason = "diverged"
    return {
        "rounds_to": {str(t): tracker.rounds_to.get(t) for t in problem.targets},
        "rounds_run": len(tracker.values),
        "best": (min if problem.metric == "gap" else max)(tracker.values, default=None),
        "stop_reason": tracker.stop_reason,
        "seconds": time.perf_counter() - started,
    }


def cnn_strategy(kwargs: dict[str, Any]) -> Callable[[Any], MessageFedADMM]:
    """Return the example's `make_strategy` with ``FedADMM(**kwargs)`` as its strategy.

    The sampling keywords are the example's (`quickstart_admm.server_app.sampling`).
    """
    cnn.example_on_path()
    from quickstart_admm.server_app import sampling

    def make_strategy(settings: Any) -> MessageFedADMM:
        return MessageFedADMM(**kwargs, **sampling(settings))

    return make_strategy


def run_cnn(task: str, kwargs: dict[str, Any], seed: int, rounds: int = 30) -> dict[str, Any]:
    """Run FedADMM(**kwargs) on the CNN task `task` (`benchmarks.cnn`) for one seed.

    `rounds` with every node; the partial task runs `cnn.ROUNDS_FACTOR` times as many.
    """
    cnn.example_on_path()
    import quickstart_admm.server_app as server_app

    rounds *= cnn.ROUNDS_FACTOR.get(task, 1)
    example_strategy = server_app.make_strategy
    server_app.make_strategy = cnn_strategy(kwargs)  # type: ignore[assignment]
    started = time.perf_counter()
    try:
        with tempfile.TemporaryDirectory() as out:
            overrides = {"strategy": "fedadmm", "seed": seed, "num-server-rounds": rounds}
            config = cnn.run_config({**cnn.TASKS[task], **overrides, "output-dir": out})
            accuracies, _ = cnn.run_one(config)
    finally:
        server_app.make_strategy = example_strategy  # type: ignore[assignment]
    return cnn.run_record(seed, accuracies, rounds, started)


def cnn_rows(
    tasks: list[str], chosen: list[str], seeds: list[int], rounds: int
) -> list[dict[str, Any]]:
    """Run every candidate on the CNN tasks; print a table per task; return the runs."""
    results: list[dict[str, Any]] = []
    for task in tasks:
        rows = []
        for label in chosen:
            runs = [run_cnn(task, CANDIDATES[label], seed, rounds) for seed in seeds]
            mean = cnn.summary(runs)["mean_final"]
            results.append({"task": task, "label": label, "mean_final": mean, "runs": runs})
            finals = " ".join(f"{r['final']:.3f}" for r in runs)
            rows.append([label, finals, "diverged" if math.isnan(mean) else f"{mean:.3f}"])
        print(f"\n## {task} (seeds {','.join(map(str, seeds))}; final accuracy)")
        print(format_table(["candidate", "per seed", "mean"], rows))
    return results


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Run every candidate on every task, full and partial participation; print, write JSON."""
    parser = base_parser(__doc__.splitlines()[0])
    parser.add_argument("--tasks", default=f"seed-logreg,synthetic,digits,{','.join(CNN_TASKS)}")
    parser.add_argument("--fraction", type=float, default=0.3)
    parser.add_argument("--candidates", default=CHOSEN)
    parser.add_argument("--cnn-seeds", default="0,1,2")
    args = parser.parse_args(argv)
    quiet_flower()
    chosen = args.candidates.split(",")
    unknown = [label for label in chosen if label not in CANDIDATES]
    if unknown:
        raise SystemExit(f"--candidates: unknown {unknown}; known: {list(CANDIDATES)}")
    tasks = args.tasks.split(",")
    convex = [task for task in tasks if task not in CNN_TASKS]
    results: list[dict[str, Any]] = []
    started = time.perf_counter()
    with threadpool_limits(BLAS_THREADS):
        for problem in build_problems(convex, args.quick):
            task_fraction = float(problem.task.defaults.get("fraction_fit", 1.0))
            partial = task_fraction if task_fraction < 1.0 else args.fraction
            for fraction in (1.0, partial):
                budget = problem.max_rounds * (1 if fraction == 1.0 else 2)
                sized = replace(problem, max_rounds=budget)
                rows = []
                for label in chosen:
                    run = run_candidate(sized, CANDIDATES[label], fraction)
                    results.append(
                        {"task": problem.name, "fraction": fraction, "label": label, **run}
                    )
                    rows.append(
                        [
                            label,
                            *(run["rounds_to"][str(t)] or f"> {budget}" for t in problem.targets),
                            f"{run['best']:.3g}",
                            run["stop_reason"],
                        ]
                    )
                print(f"\n## {problem.name}, fraction {fraction:g} (max {budget} rounds)")
                headers = [
                    "candidate",
                    *(f"rounds to {t:g}" for t in problem.targets),
                    "best",
                    "stop",
                ]
                print(format_table(headers, rows))
    seeds = [int(seed) for seed in args.cnn_seeds.split(",")]
    cnn_tasks = [task for task in tasks if task in CNN_TASKS]
    cnn_runs = cnn_rows(cnn_tasks, chosen, seeds, 2 if args.quick else 30)
    payload = {
        "seconds": time.perf_counter() - started,
        "defaults": FedADMM(form=None).admm_settings.describe(),
        "runs": results,
        "cnn_runs": cnn_runs,
    }
    path = write_json("defaults", payload, args.output)
    print(f"\nwrote {path} ({payload['seconds']:.0f} s)")
    return payload


if __name__ == "__main__":
    main()
