"""state_dtype through both FedADMM strategies: validation, storage, exact resume.

The core's accuracy with float32 state is in tests/core/test_state_dtype.py; here the
keyword must reach the core, the settings and the checkpoint (legacy and Message API).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from flower_run import NUM_CLIENTS, admm_client_fn, zeros_parameters
from flwr.common import parameters_to_ndarrays
from message_apps import ZRecorder, zeros

import flwr_admm.serverapp as message
from flwr_admm.clientapp import make_client_app
from flwr_admm.server import FedADMM
from flwr_admm.serverapp.testing import InProcessGrid, run_strategy
from flwr_admm.testing import make_proxies, run_rounds

CLIENT = {"local_steps": 5, "learning_rate": 0.5, "local_init": "center"}
LEGACY = {"rho": 0.1, "fraction_fit": 0.5, "min_fit_clients": 3, "min_available_clients": 10}
MESSAGE = {
    "rho": 0.1,
    "fraction_train": 0.5,
    "min_train_nodes": 5,
    "min_available_nodes": NUM_CLIENTS,
    "fraction_evaluate": 0.0,
    "sampling_seed": 3,
}


@pytest.mark.parametrize("factory", [FedADMM, message.FedADMM])
def test_bad_state_dtype_is_refused_naming_the_field(factory: Any) -> None:
    with pytest.raises(ValueError, match=r"state_dtype: must be one of \['float64', 'float32'\]"):
        factory(rho=0.1, state_dtype="float16")


@pytest.mark.parametrize("factory", [FedADMM, message.FedADMM])
def test_state_dtype_is_a_fingerprinted_setting(factory: Any) -> None:
    assert factory(rho=0.1).settings()["state_dtype"] == "float64"
    compact = factory(rho=0.1, state_dtype="float32")
    assert compact.state_dtype == "float32"
    assert compact.settings()["state_dtype"] == "float32"
    assert compact.fingerprint() != factory(rho=0.1).fingerprint()


def test_legacy_float32_state_is_stored_and_resumes_bit_identically(tmp_path: Path) -> None:
    """12 rounds straight == 6 + checkpoint + a new strategy object + 6, float32 state."""

    def strategy(**extra: Any) -> FedADMM:
        return FedADMM(
            initial_parameters=zeros_parameters(),
            state_dtype="float32",
            acceleration="nesterov",  # fast ADMM's y_i,prev is per-client state too
            **LEGACY,
            **extra,
        )

    def proxies() -> Any:
        return make_proxies(admm_client_fn(**CLIENT), 10)

    straight = strategy()
    expected = run_rounds(straight, proxies(), 12)
    assert straight.admm is not None
    for record in straight.admm.records.values():
        assert record.w[0].dtype == np.float32 and record.y[0].dtype == np.float32
    assert straight.admm.fast is not None  # fast ADMM's y_i,prev too
    assert all(p[0].dtype == np.float32 for p in straight.admm.fast.y_prev.values())
    run_rounds(strategy(checkpoint_dir=tmp_path), proxies(), 6)
    second = strategy(checkpoint_dir=tmp_path)
    assert second.admm is not None
    assert all(r.y[0].dtype == np.float32 for r in second.admm.records.values())
    resumed = run_rounds(second, proxies(), 6)
    np.testing.assert_array_equal(
        parameters_to_ndarrays(resumed.parameters)[0],
        parameters_to_ndarrays(expected.parameters)[0],
    )


def test_message_float32_state_resumes_bit_identically(tmp_path: Path) -> None:
    def grid() -> InProcessGrid:
        return InProcessGrid(make_client_app(admm_client_fn(**CLIENT)), NUM_CLIENTS)

    def run(strategy: Any, on: InProcessGrid, rounds: int) -> np.ndarray:
        recorder = ZRecorder()
        run_strategy(strategy, on, zeros(), rounds, evaluate_fn=recorder)
        return recorder.matrix[1:]

    settings = {**MESSAGE, "state_dtype": "float32"}
    straight = run(message.FedADMM(**settings), grid(), 8)
    nodes = grid()
    first = message.FedADMM(**settings, checkpoint_dir=tmp_path, checkpoint_every=2)
    before = run(first, nodes, 4)
    assert first.admm is not None
    assert all(r.w[0].dtype == np.float32 for r in first.admm.records.values())
    second = message.FedADMM(**settings, checkpoint_dir=tmp_path, checkpoint_every=2)
    after = run(second, nodes, 4)
    np.testing.assert_array_equal(np.vstack([before, after]), straight)
