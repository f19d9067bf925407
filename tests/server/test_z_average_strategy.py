"""FedADMM(z_average="replies") through the legacy strategy: wired, resumable.

With 5 of 10 clients a round the replies-only z-step changes z (it is not silently
ignored); with every client it is the textbook run bit for bit; a checkpointed run
resumes bit for bit (R rounds straight == k + checkpoint + new strategy + R - k).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
from flower_run import NUM_CLIENTS, Recorder, admm_client_fn, zeros_parameters

from flwr_admm import Checkpointing
from flwr_admm.server import FedADMM
from flwr_admm.testing import make_proxies, run_rounds

# "center": the clients keep no warm start, so new client objects after the resume
# see what the old ones would have (the server state is what is under test)
CLIENT = {"local_steps": 20, "learning_rate": 1.0, "local_init": "center"}
PARTIAL = {"fraction_fit": 0.5, "min_fit_clients": 3}


def strategy(**kwargs: Any) -> FedADMM:
    return FedADMM(
        rho=0.1, min_available_clients=NUM_CLIENTS, initial_parameters=zeros_parameters(), **kwargs
    )


def run(fedadmm: FedADMM, rounds: int) -> np.ndarray:
    recorder = Recorder()
    fedadmm.evaluate_fn = recorder
    run_rounds(fedadmm, make_proxies(admm_client_fn(**CLIENT), NUM_CLIENTS), rounds)
    return recorder.matrix


def test_partial_participation_changes_z_and_full_participation_does_not() -> None:
    cached, replies = run(strategy(**PARTIAL), 6), run(strategy(z_average="replies", **PARTIAL), 6)
    np.testing.assert_array_equal(cached[0], replies[0])  # round 1: every client is new
    assert not np.allclose(cached[-1], replies[-1])
    full = {"fraction_fit": 1.0, "min_fit_clients": NUM_CLIENTS}
    np.testing.assert_array_equal(
        run(strategy(**full), 6), run(strategy(z_average="replies", **full), 6)
    )


def test_resume_is_bit_identical(tmp_path: Path) -> None:
    straight = run(strategy(z_average="replies", **PARTIAL), 12)
    before = run(strategy(z_average="replies", checkpoint=Checkpointing(tmp_path), **PARTIAL), 7)
    after = run(strategy(z_average="replies", checkpoint=Checkpointing(tmp_path), **PARTIAL), 5)
    np.testing.assert_array_equal(np.vstack([before, after]), straight)
