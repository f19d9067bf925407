"""Message-API FedADMM and FedADMMClientDuals: exact resume from checkpoints, eviction.

Seed 000's task, 10 nodes, rho 0.1, the ready ClientApp (`ADMMClient`), in process. A
run stopped after round 6 and resumed from its checkpoint (nodes keep their
``context.state``, as persistent SuperNodes do) gives the same z sequence, bit for bit,
as one unbroken run, under partial participation (seeded sampling continues).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from flower_run import NUM_CLIENTS, admm_client_fn
from flwr.app import ArrayRecord
from message_apps import ZRecorder, zeros
from seed_task import gaps

from flwr_admm import Checkpointing, ClientPolicy
from flwr_admm.clientapp import make_client_app
from flwr_admm.core import AdaptiveDualStep
from flwr_admm.node.records import load_states
from flwr_admm.rounds.checkpoint import (
    MANIFEST,
    MANIFEST_SHA256,
    CheckpointError,
    config_fingerprint,
)
from flwr_admm.rounds.checkpoint import _manifest_sha256 as manifest_sha256
from flwr_admm.serverapp import FedADMM, FedADMMClientDuals
from flwr_admm.serverapp.testing import InProcessGrid, run_strategy

CLIENT = {"local_steps": 20, "learning_rate": 1.0}
SETTINGS = {
    "rho": 0.1,
    "fraction_train": 0.5,
    "min_train_nodes": 5,
    "min_available_nodes": NUM_CLIENTS,
    "fraction_evaluate": 0.0,
    "sampling_seed": 3,
}
STRATEGIES = {
    "FedADMM": FedADMM,
    "FedADMMClientDuals": FedADMMClientDuals,
    # the adaptive gamma of client-held duals is server state: checkpointed
    "FedADMMClientDuals-adaptive": lambda **kw: FedADMMClientDuals(
        dual_step=AdaptiveDualStep(), **kw
    ),
}
RESUMED = {
    **STRATEGIES,
    # S weighs c_i by n_i / b_i: the weights are server state, checkpointed
    "FedADMMClientDuals-linearized": lambda **kw: FedADMMClientDuals(
        form="linearized", **{k: v for k, v in kw.items() if k != "rho"}
    ),
}


def grid() -> InProcessGrid:
    return InProcessGrid(make_client_app(admm_client_fn(**CLIENT)), NUM_CLIENTS)


def run(strategy: Any, on: InProcessGrid, rounds: int) -> np.ndarray:
    recorder = ZRecorder()
    run_strategy(strategy, on, zeros(), rounds, evaluate_fn=recorder)
    return recorder.matrix[1:]


@pytest.mark.parametrize("name", list(RESUMED))
def test_resume_from_a_checkpoint_is_bit_identical(name: str, tmp_path: Path) -> None:
    factory = RESUMED[name]
    straight = run(factory(**SETTINGS), grid(), 12)
    nodes = grid()  # persistent: they keep their context.state across the restart
    first = factory(**SETTINGS, checkpoint=Checkpointing(tmp_path, every=3))
    before = run(first, nodes, 6)
    second = factory(**SETTINGS, checkpoint=Checkpointing(tmp_path, every=3))
    assert second.last_round == 6
    resumed = second.resumed_arrays()  # what an app passes as initial_arrays
    np.testing.assert_array_equal(resumed["0"].numpy(), before[-1])
    after = run(second, nodes, 6)  # a new strategy object, from the files only
    np.testing.assert_array_equal(np.vstack([before, after]), straight)
    assert [h["round"] for h in second.history] == list(range(7, 13))
    manifest = json.loads((tmp_path / MANIFEST).read_text())
    assert manifest["round"] == 12 and manifest["names"] == ["0"]
    assert manifest["configuration"]["strategy"] == name.split("-")[0]


# acceleration="anderson" (FedADMM only), "goldstein" and "nesterov" were deleted
@pytest.mark.parametrize(
    ("name", "deleted"),
    [
        ("FedADMM", "anderson"),
        ("FedADMM", "goldstein"),
        ("FedADMM", "nesterov"),
        ("FedADMMClientDuals", "goldstein"),
        ("FedADMMClientDuals", "nesterov"),
    ],
)
def test_a_checkpoint_written_with_a_deleted_option_is_refused_naming_it(
    name: str, deleted: str, tmp_path: Path
) -> None:
    """As the version before the deletion wrote it: its fingerprinted configuration
    names the option (not a fingerprint mismatch, not a KeyError in the state)."""
    factory = STRATEGIES[name]
    run(factory(**SETTINGS, checkpoint=Checkpointing(tmp_path)), grid(), 2)
    path = tmp_path / MANIFEST
    manifest = json.loads(path.read_text())
    manifest["configuration"]["acceleration"] = deleted
    manifest["fingerprint"] = config_fingerprint(manifest["configuration"])
    manifest[MANIFEST_SHA256] = manifest_sha256(manifest)
    path.write_text(json.dumps(manifest))
    with pytest.raises(CheckpointError, match=f"written with acceleration='{deleted}', which"):
        factory(**SETTINGS, checkpoint=Checkpointing(tmp_path))


def test_a_recorded_state_dtype_resumes_if_float64_and_is_refused_naming_float32(
    tmp_path: Path,
) -> None:
    """Before float32 state was deleted, FedADMM fingerprinted its ``state_dtype``."""
    straight = run(FedADMM(**SETTINGS), grid(), 8)
    nodes = grid()
    before = run(FedADMM(**SETTINGS, checkpoint=Checkpointing(tmp_path)), nodes, 4)
    path = tmp_path / MANIFEST
    manifest = json.loads(path.read_text())
    for dtype in ("float32", "float64"):
        manifest["configuration"]["state_dtype"] = dtype
        manifest["fingerprint"] = config_fingerprint(manifest["configuration"])
        manifest[MANIFEST_SHA256] = manifest_sha256(manifest)
        path.write_text(json.dumps(manifest))
        if dtype == "float32":
            with pytest.raises(CheckpointError, match="written with state_dtype='float32', which"):
                FedADMM(**SETTINGS, checkpoint=Checkpointing(tmp_path))
    after = run(FedADMM(**SETTINGS, checkpoint=Checkpointing(tmp_path)), nodes, 4)
    np.testing.assert_array_equal(np.vstack([before, after]), straight)


def test_a_checkpoint_fingerprinted_with_acceleration_none_resumes(tmp_path: Path) -> None:
    """Until fast ADMM was deleted, FedADMM fingerprinted ``acceleration`` (None) and
    ``restart_eta``: such a checkpoint resumes bit for bit; another acceleration is
    refused by name."""
    straight = run(FedADMM(**SETTINGS), grid(), 8)
    nodes = grid()
    before = run(FedADMM(**SETTINGS, checkpoint=Checkpointing(tmp_path)), nodes, 4)
    path = tmp_path / MANIFEST
    manifest = json.loads(path.read_text())
    assert "acceleration" not in manifest["configuration"]
    manifest["configuration"].update(acceleration=None, restart_eta=0.999)
    manifest["fingerprint"] = config_fingerprint(manifest["configuration"])
    manifest[MANIFEST_SHA256] = manifest_sha256(manifest)
    path.write_text(json.dumps(manifest))
    after = run(FedADMM(**SETTINGS, checkpoint=Checkpointing(tmp_path)), nodes, 4)
    np.testing.assert_array_equal(np.vstack([before, after]), straight)


@pytest.mark.parametrize("name", list(STRATEGIES))
def test_a_checkpoint_of_other_settings_or_damaged_is_refused(name: str, tmp_path: Path) -> None:
    factory = STRATEGIES[name]
    run(factory(**SETTINGS, checkpoint=Checkpointing(tmp_path)), grid(), 2)
    with pytest.raises(CheckpointError, match=r"rho: checkpoint 0\.1, now 0\.2"):
        factory(**{**SETTINGS, "rho": 0.2}, checkpoint=Checkpointing(tmp_path))
    with pytest.raises(CheckpointError, match="sampling_seed"):
        factory(**{**SETTINGS, "sampling_seed": 4}, checkpoint=Checkpointing(tmp_path))
    fresh = factory(**SETTINGS, checkpoint=Checkpointing(tmp_path, resume=False))
    assert fresh.last_round == 0
    path = tmp_path / MANIFEST
    path.write_text(path.read_text().replace('"round": 2', '"round": 3'))
    with pytest.raises(CheckpointError, match="edited or damaged"):
        factory(**SETTINGS, checkpoint=Checkpointing(tmp_path))


def test_resume_refuses_initial_arrays_of_another_model(tmp_path: Path) -> None:
    run(FedADMM(**SETTINGS, checkpoint=Checkpointing(tmp_path)), grid(), 1)
    resumed = FedADMM(**SETTINGS, checkpoint=Checkpointing(tmp_path))
    with pytest.raises(ValueError, match="initial_arrays"):
        run_strategy(resumed, grid(), ArrayRecord([np.zeros(3)]), 1)


@pytest.mark.parametrize("name", list(STRATEGIES))
def test_max_clients_evicts_the_least_recently_heard(name: str) -> None:
    strategy = STRATEGIES[name](
        **{**SETTINGS, "fraction_train": 0.3}, clients=ClientPolicy(max_count=6)
    )
    z = run(strategy, grid(), 30)
    held = strategy.admm.records if name == "FedADMM" else strategy.state.clients
    assert len(held) <= 6
    assert sum(h["num_evicted"] for h in strategy.history) > 0
    assert all(h["num_clients_cached"] <= 6 for h in strategy.history)
    assert np.isfinite(z).all()


def test_an_evicted_keys_share_leaves_s() -> None:
    """Client duals: the sweep takes an evicted key's share out of S exactly."""
    strategy = FedADMMClientDuals(
        **{**SETTINGS, "fraction_train": 1.0}, clients=ClientPolicy(max_age=2)
    )
    nodes = grid()
    nodes.offline = set()
    run(strategy, nodes, 4)
    away = {3, 4}  # nodes 3 and 4 leave: their replies never arrive again
    nodes.offline = away
    run(strategy, nodes, 8)
    assert "partition-id:2" not in strategy.state.clients and not strategy.state.sweep.active
    assert strategy.state.total_examples == 8 * 500
    expected = np.zeros(20)
    for node_id, context in nodes.contexts.items():
        if node_id not in away:
            kept = load_states(context.state, [(20,)])
            assert kept.pending is not None
            expected += kept.pending.share[0]
    assert strategy.state.contribution_sum is not None
    np.testing.assert_allclose(strategy.state.contribution_sum[0], expected, rtol=0, atol=1e-9)
    assert gaps(np.array([strategy.z[0]]))[-1] > 0  # optimum of the 8 remaining nodes


def test_a_resume_under_new_node_ids_keeps_every_dual(tmp_path: Path) -> None:
    """Issue 25, item 7: a resumed run whose nodes have new ids (a new simulation run,
    restarted insecure SuperNodes) keeps every key's dual: each key moves to the node
    that claims it (resynced once) instead of being evicted (the old code kept z only)."""
    settings = {**SETTINGS, "fraction_train": 1.0, "min_train_nodes": NUM_CLIENTS}
    first = FedADMM(**settings, checkpoint=Checkpointing(tmp_path))
    run(first, grid(), 4)
    assert first.admm is not None
    duals = {key: record.y[0].copy() for key, record in first.admm.records.items()}
    second = FedADMM(**settings, checkpoint=Checkpointing(tmp_path))
    renewed = InProcessGrid(
        make_client_app(admm_client_fn(**CLIENT)), NUM_CLIENTS, node_ids=range(101, 111)
    )
    run(second, renewed, 3)
    rounds = second.history
    assert [h["num_evicted"] for h in rounds] == [0, 0]  # the resync round folds nothing
    assert [h["num_replies"] for h in rounds] == [NUM_CLIENTS, NUM_CLIENTS]
    assert second.admm is not None and sorted(second.admm.records) == sorted(duals)
    assert second.binding.key_of == {str(101 + i): f"partition-id:{i}" for i in range(10)}
