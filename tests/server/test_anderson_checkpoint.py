"""Legacy FedADMM(acceleration="anderson"): the Anderson memory is part of the checkpoint.

R rounds straight == k rounds + checkpoint + a new strategy object + R - k rounds, z
bit for bit, with every client replying and with 5 of 10 sampled; a checkpoint whose
Anderson arrays are missing or damaged, or one written before the memory was saved,
is a `CheckpointError`. Each test failed before the memory was checkpointed.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from flower_run import NUM_CLIENTS, Recorder, admm_client_fn, zeros_parameters

from flwr_admm import FedADMM
from flwr_admm.core.schedules import Constant
from flwr_admm.server.checkpoint import MANIFEST, MANIFEST_SHA256, CheckpointError
from flwr_admm.server.checkpoint import _manifest_sha256 as manifest_sha256
from flwr_admm.testing import make_proxies, run_rounds

CLIENT = {"local_steps": 20, "learning_rate": 1.0, "local_init": "center"}
PARTICIPATION = {
    "full": {"fraction_fit": 1.0, "min_fit_clients": NUM_CLIENTS},
    "partial": {"fraction_fit": 0.5, "min_fit_clients": 3},
}


def anderson(participation: str, **kwargs: Any) -> FedADMM:
    return FedADMM(
        rho=0.1,
        rho_schedule=Constant(),  # rho changes would restart the memory
        acceleration="anderson",
        min_available_clients=NUM_CLIENTS,
        initial_parameters=zeros_parameters(),
        **PARTICIPATION[participation],
        **kwargs,
    )


def run(strategy: FedADMM, rounds: int) -> np.ndarray:
    recorder = Recorder()
    strategy.evaluate_fn = recorder
    run_rounds(strategy, make_proxies(admm_client_fn(**CLIENT), NUM_CLIENTS), rounds)
    return recorder.matrix


@pytest.mark.parametrize("participation", list(PARTICIPATION))
def test_anderson_resume_is_bit_identical(participation: str, tmp_path: Path) -> None:
    straight = run(anderson(participation), 16)
    first = anderson(participation, checkpoint_dir=tmp_path)
    before = run(first, 9)  # partial: rejections at rounds 7 and 11, 2 pairs at 9
    assert first.admm is not None and first.admm.anderson is not None
    assert first.admm.anderson.accel.dx  # the checkpoint holds a memory to restore
    second = anderson(participation, checkpoint_dir=tmp_path)
    assert second.admm is not None and second.admm.anderson is not None
    assert len(second.admm.anderson.accel.dx) == len(first.admm.anderson.accel.dx)
    after = run(second, 7)
    np.testing.assert_array_equal(np.vstack([before, after]), straight)
    assert second.admm.anderson.accel.accepted >= 1


def rewrite(directory: Path, drop: str | None = None, edit: Any = None) -> None:
    """Rewrite the checkpoint consistently (checksums updated) without `drop`, or edited.

    What a buggy writer would produce: the checksums pass, so the load itself must
    notice what is missing.
    """
    path = directory / MANIFEST
    manifest = json.loads(path.read_text())
    arrays_path = directory / manifest["arrays_file"]
    with np.load(arrays_path, allow_pickle=False) as npz:
        arrays = {name: npz[name] for name in npz.files if name != drop}
    with arrays_path.open("wb") as handle:
        np.savez(handle, **arrays)  # type: ignore[arg-type]
    manifest["sha256"] = hashlib.sha256(arrays_path.read_bytes()).hexdigest()
    if edit is not None:
        edit(manifest)
    manifest[MANIFEST_SHA256] = manifest_sha256(manifest)
    path.write_text(json.dumps(manifest, indent=1, sort_keys=True))


def checkpointed(directory: Path) -> None:
    strategy = anderson("full", checkpoint_dir=directory)
    run(strategy, 5)
    assert strategy.admm is not None and strategy.admm.anderson is not None
    assert strategy.admm.anderson.accel.dx


def test_damaged_anderson_arrays_are_refused(tmp_path: Path) -> None:
    checkpointed(tmp_path)
    manifest = json.loads((tmp_path / MANIFEST).read_text())
    arrays_path = tmp_path / manifest["arrays_file"]
    with np.load(arrays_path, allow_pickle=False) as npz:
        arrays = {name: npz[name] for name in npz.files}
    arrays["anderson_dx.0"] = arrays["anderson_dx.0"] + 1.0
    with arrays_path.open("wb") as handle:
        np.savez(handle, **arrays)  # type: ignore[arg-type]
    with pytest.raises(CheckpointError, match="truncated or altered"):
        anderson("full", checkpoint_dir=tmp_path)


@pytest.mark.parametrize("drop", ["anderson_dx.0", "anderson_dg.0", "anderson_x_prev"])
def test_missing_anderson_arrays_are_refused(tmp_path: Path, drop: str) -> None:
    checkpointed(tmp_path)
    rewrite(tmp_path, drop=drop)
    with pytest.raises(CheckpointError, match="Anderson memory"):
        anderson("full", checkpoint_dir=tmp_path)


def test_a_manifest_naming_more_pairs_than_arrays_is_refused(tmp_path: Path) -> None:
    checkpointed(tmp_path)
    rewrite(tmp_path, edit=lambda m: m["admm"]["anderson"].update(pairs=9))
    with pytest.raises(CheckpointError, match="Anderson memory"):
        anderson("full", checkpoint_dir=tmp_path)


def test_a_checkpoint_without_anderson_memory_is_refused(tmp_path: Path) -> None:
    """Written before the memory was saved: resuming it could not be bit-identical."""
    checkpointed(tmp_path)
    rewrite(tmp_path, edit=lambda m: m["admm"].pop("anderson"))
    with pytest.raises(CheckpointError, match="no Anderson memory"):
        anderson("full", checkpoint_dir=tmp_path)
