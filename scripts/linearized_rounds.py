"""Rounds to a 1e-6 relative gap on seed-logreg: FedADMM's forms and recipes, and SCAFFOLD.

Server-held duals (`FedADMM`), client-held ones (`FedADMMClientDuals`) and SCAFFOLD.

Message API on the in-process grid, the task's local settings (20 full-batch steps of
lr 1), all 10 clients and 3 of 10 a round; every strategy draws its nodes with its
default ``sampling_seed=0`` (the same draws). Run from the repository root (prints a
Markdown table):

    python scripts/linearized_rounds.py
"""

from __future__ import annotations

import logging
import random
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from flwr.app import ArrayRecord
from flwr.common.logger import FLOWER_LOGGER
from flwr.serverapp.strategy import Strategy

from flwr_admm.clientapp import make_client_app
from flwr_admm.core.linearized import LINEARIZED_CONVEX, SCAFFNEW, Linearized
from flwr_admm.serverapp import SCAFFOLD, FedADMM, FedADMMClientDuals
from flwr_admm.serverapp.testing import InProcessGrid, run_strategy

sys.path[:0] = [str(Path(__file__).resolve().parents[1] / "tests")]  # the seed-task helpers
from flower_run import admm_client_fn  # noqa: E402
from message_apps import ZRecorder  # noqa: E402
from seed_task import first_round_below, gaps  # noqa: E402

TOL = 1e-6


def rounds(make: Callable[[float], Strategy], fraction: float, limit: int) -> int | None:
    """Return the first round whose z is within TOL of the pooled optimum (None: not in limit)."""
    app = make_client_app(admm_client_fn(local_steps=20, learning_rate=1.0))
    grid, recorder = InProcessGrid(app, 10), ZRecorder()
    random.seed(0)
    run_strategy(make(fraction), grid, ArrayRecord([np.zeros(20)]), limit, evaluate_fn=recorder)
    return first_round_below(gaps(recorder.matrix[1:]), TOL)


def sampling(fraction: float) -> dict[str, Any]:
    """Return the sampling keywords: every node, or `fraction` of the 10."""
    every = fraction == 1.0
    return {
        "fraction_train": fraction,
        "min_train_nodes": 10 if every else 2,
        "min_available_nodes": 10,
        "fraction_evaluate": 0.0,
    }


METHODS: dict[str, Callable[[float], Strategy]] = {
    '`FedADMM(form="prox")` (the prox form\'s defaults)': lambda f: FedADMM(
        form="prox", **sampling(f)
    ),
    "`FedADMM(dual_step=0.2)` (prox form, fixed gamma 0.2)": lambda f: FedADMM(
        dual_step=0.2, **sampling(f)
    ),
    "`FedADMM()` (defaults: `Linearized()`, adaptive gamma, gated momentum)": lambda f: FedADMM(
        **sampling(f)
    ),
    "`FedADMM(form=Linearized(dual_step=0.2))`": lambda f: FedADMM(
        form=Linearized(dual_step=0.2), **sampling(f)
    ),
    "`FedADMM(form=SCAFFNEW)` (gamma 1)": lambda f: FedADMM(form=SCAFFNEW, **sampling(f)),
    '`FedADMM(form=SCAFFNEW, z_average="replies")`': lambda f: FedADMM(
        form=SCAFFNEW, z_average="replies", **sampling(f)
    ),
    "`FedADMM(form=LINEARIZED_CONVEX)` (momentum 0.7, gamma 1)": lambda f: FedADMM(
        form=LINEARIZED_CONVEX, **sampling(f)
    ),
    "`SCAFFOLD()` (server step 1)": lambda f: SCAFFOLD(**sampling(f)),
    # client-held duals: the prox form (rho 0.1, gamma 1); the linearized form (default)
    # with the adaptive gamma from the nodes' alignment reports, the rule's floor (what
    # it ran at before the reports), the textbook step
    '`FedADMMClientDuals(form="prox")` (rho 0.1, gamma 1)': lambda f: FedADMMClientDuals(
        form="prox", **sampling(f)
    ),
    "`FedADMMClientDuals()` (defaults: linearized, adaptive gamma)": lambda f: FedADMMClientDuals(
        **sampling(f)
    ),
    "`FedADMMClientDuals(form=Linearized(dual_step=0.2))`": lambda f: FedADMMClientDuals(
        form=Linearized(dual_step=0.2), **sampling(f)
    ),
    "`FedADMMClientDuals(form=SCAFFNEW)` (gamma 1)": lambda f: FedADMMClientDuals(
        form=SCAFFNEW, **sampling(f)
    ),
}


def main() -> None:
    """Print one row per method: rounds with all 10 clients and with 3 of 10."""
    logging.disable(logging.WARNING)
    FLOWER_LOGGER.setLevel(logging.ERROR)
    print("| method | all 10 clients | 3 of 10 (`fraction_train=0.3`) |")
    print("|---|---|---|")
    for name, make in METHODS.items():
        print(f"| {name} | {rounds(make, 1.0, 100)} | {rounds(make, 0.3, 300)} |", flush=True)


if __name__ == "__main__":
    main()
