"""The app's checkpoint keys (checkpoint-dir, checkpoint-every, resume), both APIs.

A FedADMM run (server-held duals, local-init=center) stopped after round k and
resumed (a new run: empty client state, same node ids) from its checkpoint ends where
the uninterrupted run does, in process; the real
deployment does the same in tests/apps/test_deployment.py
(test_killed_serverapp_resumes_from_its_checkpoint).
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from app_runs import run_legacy, run_message

from flwr_admm import Checkpointing
from flwr_admm.rounds.checkpoint import load_checkpoint
from simulations.admm_app.run_config import parse_run_config

NODES = 3
NODE_IDS = [11, 12, 13]
CONFIG = {
    "strategy": "fedadmm",
    "task": "seed-logreg",
    "num-clients": NODES,
    "rho": 0.1,
    "local-steps": 20,
    "learning-rate": 1.0,
    "batch-size": 0,
    "local-init": "center",  # the solve starts at v_i: no client state is needed
    "seed": 42,
    "client-wait-seconds": 5.0,
}


@pytest.mark.parametrize(
    ("overrides", "key"),
    [
        ({"checkpoint-dir": 3}, "checkpoint-dir"),
        ({"checkpoint-dir": "  "}, "checkpoint-dir"),
        ({"checkpoint-dir": "c", "strategy": "fedavg"}, "checkpoint-dir"),
        ({"checkpoint-every": 0}, "checkpoint-every"),
        ({"checkpoint-every": 1.5}, "checkpoint-every"),
        ({"checkpoint-every": True}, "checkpoint-every"),
        ({"resume": 1}, "resume"),
        ({"resume": True}, "resume"),  # no checkpoint-dir
    ],
)
def test_bad_checkpoint_keys_name_the_key(overrides, key):
    with pytest.raises(ValueError, match=f"'{key}'"):
        parse_run_config({**CONFIG, **overrides})


def test_checkpoint_keys_default_off_and_resolve_the_directory(tmp_path):
    assert parse_run_config(CONFIG).checkpoint.directory is None
    assert parse_run_config(CONFIG).checkpoint.checkpointing() is None
    settings = parse_run_config({**CONFIG, "checkpoint-dir": str(tmp_path / "c"), "resume": True})
    assert settings.checkpoint.checkpointing() == Checkpointing(
        (tmp_path / "c").resolve(), every=1, resume=True
    )


def _document(output_dir, strategy="fedadmm"):
    return json.loads((output_dir / "seed-logreg" / f"{strategy}.json").read_text())


def _z(checkpoint_dir):
    arrays, _ = load_checkpoint(checkpoint_dir)
    return {k: v for k, v in arrays.items() if k.startswith("z")}


@pytest.mark.parametrize("api", ["message", "legacy"])
@pytest.mark.parametrize("strategy", ["fedadmm", "fedadmm-client-duals"])
def test_a_resumed_run_ends_where_the_uninterrupted_one_does(tmp_path, api, strategy):
    rounds, stop = 4, 2
    run = run_message if api == "message" else run_legacy
    config = {**CONFIG, "strategy": strategy}
    if strategy == "fedadmm-client-duals":
        config["local-init"] = "consensus"
    full, part = tmp_path / "full", tmp_path / "part"
    run(
        {
            **config,
            "num-server-rounds": rounds,
            "output-dir": str(full / "out"),
            "checkpoint-dir": str(full / "ckpt"),
            "checkpoint-every": rounds,
        },
        NODES,
        node_ids=NODE_IDS,
    )
    base = {**config, "checkpoint-dir": str(part / "ckpt"), "checkpoint-every": stop}
    run(
        {**base, "num-server-rounds": stop, "output-dir": str(part / "b")}, NODES, node_ids=NODE_IDS
    )
    run(
        {**base, "num-server-rounds": rounds, "output-dir": str(part / "c"), "resume": True},
        NODES,
        node_ids=NODE_IDS,
    )
    resumed = _document(part / "c", strategy)
    assert resumed["resumed_after_round"] == stop and resumed["status"] == "complete"
    records = {r["round"]: r for r in resumed["rounds"]}
    # round `stop`: Flower's round-0 evaluation, of the checkpoint's z (the legacy
    # in-process loop, flwr_admm.testing.run_rounds, has none)
    first = stop if api == "message" else stop + 1
    assert sorted(records) == list(range(first, rounds + 1))
    if strategy == "fedadmm-client-duals":
        # its duals live in the clients' context.state, which a new run starts without:
        # the resumed run continues (its round numbers, z) but resyncs, so no exact match
        assert all(records[r]["num_results"] == NODES for r in range(stop + 1, rounds + 1))
        return
    expected = {r["round"]: r for r in _document(full / "out", strategy)["rounds"]}
    for number in range(first, rounds + 1):
        np.testing.assert_allclose(
            records[number]["objective"], expected[number]["objective"], rtol=1e-10
        )
    for number in range(stop + 1, rounds + 1):
        assert records[number]["fit_metrics"]["num_evicted"] == 0
    z_full, z_resumed = _z(full / "ckpt"), _z(part / "ckpt")
    assert z_full and z_full.keys() == z_resumed.keys()
    for key, value in z_full.items():
        assert np.linalg.norm(z_resumed[key] - value) <= 1e-8 * np.linalg.norm(value)


def test_resuming_a_finished_run_names_resume(tmp_path):
    config = {**CONFIG, "num-server-rounds": 1, "checkpoint-dir": str(tmp_path / "c")}
    run_message({**config, "output-dir": str(tmp_path / "a")}, NODES, node_ids=NODE_IDS)
    with pytest.raises(ValueError, match="'resume': the checkpoint is at round 1"):
        run_message(
            {**config, "resume": True, "output-dir": str(tmp_path / "b")},
            NODES,
            node_ids=NODE_IDS,
        )
    assert _document(tmp_path / "b")["status"] == "failed"
