"""Rounds to a 1e-6 relative gap on seed-logreg: client-held duals with and without fast ADMM.

In process (`flwr_admm.testing.run_rounds`), seed 000's task (10 clients, rho 0.1,
20 local steps, lr 1.0, z^0 = 0), against server-held `FedADMM` with the same
acceleration (constant rho, alpha = 1), every client every round and 3 of 10
(sampling seeds 0-2). Run from the repository root:

    PYTHONPATH=tests python scripts/client_duals_acceleration.py
"""

from __future__ import annotations

from typing import Any

from flower_run import run_seed
from seed_task import first_round_below, gaps
from textbook import textbook_fedadmm

from flwr_admm.server import FedADMMClientDuals

CLIENT = {"local_steps": 20, "learning_rate": 1.0}
PARTIAL = {"fraction_fit": 0.3, "min_fit_clients": 3, "min_available_clients": 10}
RUNS: list[tuple[str, Any, str | None]] = [
    ("FedADMMClientDuals", FedADMMClientDuals, None),
    ("FedADMMClientDuals", FedADMMClientDuals, "nesterov"),
    ("FedADMM", textbook_fedadmm, None),
    ("FedADMM", textbook_fedadmm, "nesterov"),
]


def rounds_to(factory: Any, acceleration: str | None, rounds: int, **kwargs: Any) -> str:
    """Return the first round with a gap <= 1e-6 (or "> rounds")."""
    _, recorder, _ = run_seed(
        factory, rounds, client_kwargs=CLIENT, rho=0.1, acceleration=acceleration, **kwargs
    )
    reached = first_round_below(gaps(recorder.matrix), 1e-6)
    return str(reached) if reached is not None else f"> {rounds}"


def main() -> None:
    """Print the Markdown table of docs/client_duals.md."""
    print("| strategy | acceleration | 10 of 10 | 3 of 10 (sampling seeds 0, 1, 2) |")
    print("|---|---|---|---|")
    for name, factory, acceleration in RUNS:
        full = rounds_to(factory, acceleration, 80)
        partial = [
            rounds_to(factory, acceleration, 150, sampling_seed=s, **PARTIAL) for s in range(3)
        ]
        print(f"| `{name}` | {acceleration} | {full} | {', '.join(partial)} |")


if __name__ == "__main__":
    main()
