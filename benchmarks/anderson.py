"""Anderson acceleration of the server's round map against fast ADMM and the defaults.

Rounds to the task's targets (relative objective gap 1e-3 and 1e-6 on seed-logreg,
test accuracy 90% and 93% on digits) for plain ADMM, fast ADMM ("nesterov"), the
`FedADMM()` defaults and `acceleration="anderson"` (`flwr_admm.core.anderson`) with
and without over-relaxation 1.6 / `ResidualBalancing`, plus the Anderson memory m
and safeguard D. Same driver, tracker, untuned local settings and client sampling
as `benchmarks.defaults` (`run_candidate`): full participation and 3 of 10 clients a
round (twice the round budget).

    python -m benchmarks.anderson [--tasks seed-logreg,digits] [--candidates ...]
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from typing import Any
from unittest import mock

from threadpoolctl import threadpool_limits

from benchmarks.common import BLAS_THREADS, base_parser, format_table, quiet_flower, write_json
from benchmarks.defaults import PLAIN, run_candidate
from benchmarks.problems import build_problems
from flwr_admm import ResidualBalancing
from flwr_admm.core.anderson import AndersonMemory
from flwr_admm.core.consensus import ConsensusADMM
from flwr_admm.core.settings import ConsensusSettings

AA: dict[str, Any] = {**PLAIN, "acceleration": "anderson"}
CANDIDATES: dict[str, dict[str, Any]] = {
    "plain (rho 1)": PLAIN,
    "fast": {**PLAIN, "acceleration": "nesterov"},
    "defaults": {},
    "AA": AA,
    "AA alpha 1.6": {**AA, "relaxation": 1.6},
    "AA RB": {**AA, "rho_schedule": ResidualBalancing()},
    "AA RB alpha 1.6": {**AA, "rho_schedule": ResidualBalancing(), "relaxation": 1.6},
}
# Variants of "AA alpha 1.6" and "AA RB alpha 1.6": AndersonMemory keywords (memory
# m, safeguard D, patience, regularization lam) and "replied_only" (only the replying
# clients' y_i move); the others use the module defaults and move every cached y_i.
NO_SAFEGUARD = 1e300
VARIANTS: dict[str, dict[str, Any]] = {
    "AA alpha 1.6 m=1": {"memory": 1},
    "AA alpha 1.6 m=3": {"memory": 3},
    "AA alpha 1.6 m=10": {"memory": 10},
    "AA alpha 1.6 D=2": {"safeguard": 2.0},
    "AA alpha 1.6 no safeguard": {"safeguard": NO_SAFEGUARD},
    "AA alpha 1.6 replied-only": {"replied_only": True},
    "AA RB alpha 1.6 replied-only": {"replied_only": True},
    "AA RB alpha 1.6 m=3": {"memory": 3},
    "AA RB alpha 1.6 no safeguard": {"safeguard": NO_SAFEGUARD},
    "AA alpha 1.6 patience 5": {"patience": 5},
    "AA RB alpha 1.6 patience 5": {"patience": 5},
    "AA alpha 1.6 lam=1e-2": {"regularization": 1e-2},
    "AA RB alpha 1.6 lam=1e-2": {"regularization": 1e-2},
}
for _label in VARIANTS:
    CANDIDATES[_label] = CANDIDATES["AA RB alpha 1.6" if "RB" in _label else "AA alpha 1.6"]


@contextmanager
def anderson_memory(variant: dict[str, Any]) -> Iterator[list[AndersonMemory]]:
    """Build every ConsensusADMM of the block with the variant's Anderson settings."""
    built: list[AndersonMemory] = []
    original = ConsensusSettings.new_admm
    keywords = {k: v for k, v in variant.items() if k != "replied_only"}

    def new_admm(self: ConsensusSettings, z: Any) -> ConsensusADMM:
        admm = original(self, z)
        if admm.anderson is not None:
            admm.anderson.accel = AndersonMemory(**keywords)
            admm.anderson.replied_only = bool(variant.get("replied_only", False))
            built.append(admm.anderson.accel)
        return admm

    with mock.patch.object(ConsensusSettings, "new_admm", new_admm):
        yield built


def run_labelled(problem: Any, label: str, fraction: float) -> dict[str, Any]:
    """Run one candidate; report the Anderson steps accepted and rejected."""
    variant = VARIANTS.get(label, {})
    with anderson_memory(variant) as built:
        run = run_candidate(problem, CANDIDATES[label], fraction)
    if built:
        accel = built[-1]
        run["anderson"] = {
            "memory": accel.memory,
            "safeguard": accel.safeguard,
            "patience": accel.patience,
            "regularization": accel.regularization,
            "replied_only": bool(variant.get("replied_only", False)),
            "accepted": accel.accepted,
            "rejected": accel.rejected,
            "restarts": accel.restarts,
        }
    return run


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Run every candidate on every task, full and 3 of 10 clients; print, write JSON."""
    parser = base_parser(__doc__.splitlines()[0])
    parser.add_argument("--tasks", default="seed-logreg,digits")
    parser.add_argument("--fraction", type=float, default=0.3)
    parser.add_argument("--candidates", default=",".join(CANDIDATES))
    args = parser.parse_args(argv)
    quiet_flower()
    results: list[dict[str, Any]] = []
    started = time.perf_counter()
    with threadpool_limits(BLAS_THREADS):
        for problem in build_problems(args.tasks.split(","), args.quick):
            for fraction in (1.0, args.fraction):
                budget = problem.max_rounds * (1 if fraction == 1.0 else 2)
                sized = replace(problem, max_rounds=budget)
                rows = []
                for label in args.candidates.split(","):
                    run = run_labelled(sized, label, fraction)
                    results.append(
                        {"task": problem.name, "fraction": fraction, "label": label, **run}
                    )
                    aa = run.get("anderson")
                    rows.append(
                        [
                            label,
                            *(run["rounds_to"][str(t)] or f"> {budget}" for t in problem.targets),
                            f"{run['best']:.3g}",
                            run["stop_reason"],
                            "-" if aa is None else f"{aa['accepted']}/{aa['rejected']}",
                        ]
                    )
                print(f"\n## {problem.name}, fraction {fraction:g} (max {budget} rounds)")
                headers = [
                    "candidate",
                    *(f"rounds to {t:g}" for t in problem.targets),
                    "best",
                    "stop",
                    "AA accepted/rejected",
                ]
                print(format_table(headers, rows), flush=True)
    payload = {"seconds": time.perf_counter() - started, "runs": results}
    path = write_json("anderson", payload, args.output)
    print(f"\nwrote {path} ({payload['seconds']:.0f} s)")
    return payload


if __name__ == "__main__":
    main()
