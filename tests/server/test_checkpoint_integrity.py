"""Checkpoints are tamper-evident and complete (issue 12, item 6).

An edited manifest (rho, n_i, keys) is refused by its checksum; an arrays file whose
manifest was deleted is an error, not a fresh start that deletes it; every setting that
changes the iterates (uplink, sampling_seed, identity, eviction, ...) is fingerprinted
and named when it differs; an old-format checkpoint is refused with a clear message;
bindings, last-heard rounds and evictions resume exactly. Each test failed on the code
before the change it covers.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from flower_run import NUM_CLIENTS, admm_client_fn, zeros_parameters
from flwr.common import parameters_to_ndarrays

from flwr_admm import Checkpointing, ClientPolicy, Uplink
from flwr_admm.rounds.checkpoint import MANIFEST, CheckpointError
from flwr_admm.server import FedADMM, FedADMMClientDuals
from flwr_admm.testing import make_proxies, run_rounds
from flwr_admm.uplink.compression import StochasticQuantizer

CLIENT = {"local_steps": 5, "learning_rate": 0.5}


def checkpointed(
    directory: Path, strategy_class: Any = FedADMM, rounds: int = 2, **kwargs: Any
) -> Any:
    """A strategy that ran `rounds` rounds and wrote its checkpoint to `directory`."""
    strategy = strategy_class(
        rho=0.1,
        initial_parameters=zeros_parameters(),
        checkpoint=Checkpointing(directory),
        **kwargs,
    )
    run_rounds(strategy, make_proxies(admm_client_fn(**CLIENT), NUM_CLIENTS), rounds)
    return strategy


def edit_manifest(directory: Path, edit: Any) -> None:
    path = directory / MANIFEST
    manifest = json.loads(path.read_text())
    edit(manifest)
    path.write_text(json.dumps(manifest, indent=1, sort_keys=True))


# ------------------------------------------------------------ manifest checksum
EDITS = {
    "rho": lambda m: m["admm"].update(rho=0.5),
    "num_examples": lambda m: m["admm"]["clients"][0].update(num_examples=5000),
    "keys": lambda m: m["admm"]["clients"][0].update(key="partition-id:99"),
    "binding": lambda m: m["binding"]["node_of"].update({"partition-id:0": "7"}),
    "round": lambda m: m.update(round=1),
}


@pytest.mark.parametrize("field", sorted(EDITS))
def test_an_edited_manifest_is_refused(tmp_path: Path, field: str) -> None:
    checkpointed(tmp_path)
    edit_manifest(tmp_path, EDITS[field])
    with pytest.raises(CheckpointError, match="manifest_sha256"):
        FedADMM(rho=0.1, initial_parameters=zeros_parameters(), checkpoint=Checkpointing(tmp_path))


@pytest.mark.parametrize(
    "edit",
    [
        lambda m: m.update(total_examples=m["total_examples"] + 1),
        lambda m: m.update(keys=list(reversed(m["keys"]))),
    ],
    ids=["total_examples", "keys"],
)
def test_an_edited_client_duals_manifest_is_refused(tmp_path: Path, edit: Any) -> None:
    checkpointed(tmp_path, FedADMMClientDuals)
    edit_manifest(tmp_path, edit)
    with pytest.raises(CheckpointError, match="manifest_sha256"):
        FedADMMClientDuals(rho=0.1, checkpoint=Checkpointing(tmp_path))


def test_an_unedited_manifest_rewritten_in_another_layout_still_loads(tmp_path: Path) -> None:
    """The checksum is over the canonical JSON, not the bytes of the file."""
    before = checkpointed(tmp_path)
    edit_manifest(tmp_path, lambda m: None)  # re-indented, same content
    after = FedADMM(
        rho=0.1, initial_parameters=zeros_parameters(), checkpoint=Checkpointing(tmp_path)
    )
    assert after.admm is not None and before.admm is not None
    np.testing.assert_array_equal(after.admm.z[0], before.admm.z[0])


# ------------------------------------------------------- arrays without manifest
@pytest.mark.parametrize("strategy_class", [FedADMM, FedADMMClientDuals])
def test_arrays_without_a_manifest_are_an_error_and_are_kept(
    tmp_path: Path, strategy_class: Any
) -> None:
    checkpointed(tmp_path, strategy_class)
    (tmp_path / MANIFEST).unlink()
    arrays = sorted(tmp_path.glob("state-r*.npz"))
    assert len(arrays) == 1
    content = arrays[0].read_bytes()
    with pytest.raises(CheckpointError, match=r"no checkpoint\.json"):
        strategy_class(
            rho=0.1, initial_parameters=zeros_parameters(), checkpoint=Checkpointing(tmp_path)
        )
    assert arrays[0].read_bytes() == content  # nothing deleted or overwritten


# ------------------------------------------------------------------ fingerprint
@pytest.mark.parametrize(
    ("saved", "now", "field"),
    [
        ({"uplink": Uplink(StochasticQuantizer(bits=8))}, {}, "uplink"),
        (
            {"uplink": Uplink(StochasticQuantizer(bits=8))},
            {"uplink": Uplink(StochasticQuantizer(bits=4))},
            "uplink",
        ),
        ({"sampling_seed": 0}, {"sampling_seed": 1}, "sampling_seed"),
        (
            {"clients": ClientPolicy(key_binding="node")},
            {"clients": ClientPolicy(key_binding="reported")},
            "key_binding",
        ),
        # the fingerprint keeps the names of before the option values: old checkpoints match
        ({"clients": ClientPolicy(max_age=3)}, {}, "max_client_age"),
        ({"clients": ClientPolicy(max_count=5)}, {}, "max_clients"),
        ({"fraction_fit": 0.5}, {}, "fraction_fit"),
        ({"relaxation": 1.0}, {"relaxation": 1.5}, "relaxation"),
        ({"z_average": "replies"}, {}, "z_average"),
        ({}, {"z_average": "replies"}, "z_average"),
        ({"accept_failures": True}, {"accept_failures": False}, "accept_failures"),
    ],
)
def test_every_setting_that_changes_the_iterates_is_fingerprinted(
    tmp_path: Path, saved: dict[str, Any], now: dict[str, Any], field: str
) -> None:
    checkpointed(tmp_path, **saved)
    with pytest.raises(CheckpointError, match=rf"another configuration \(.*{field}: checkpoint"):
        FedADMM(
            rho=0.1,
            initial_parameters=zeros_parameters(),
            checkpoint=Checkpointing(tmp_path),
            **now,
        )


def test_client_duals_fingerprints_uplink_and_sampling_seed(tmp_path: Path) -> None:
    checkpointed(tmp_path, FedADMMClientDuals, uplink=Uplink(StochasticQuantizer(bits=8)))
    with pytest.raises(CheckpointError, match="uplink: checkpoint"):
        FedADMMClientDuals(rho=0.1, checkpoint=Checkpointing(tmp_path))
    with pytest.raises(CheckpointError, match="sampling_seed: checkpoint 0, now 3"):
        FedADMMClientDuals(
            rho=0.1,
            checkpoint=Checkpointing(tmp_path),
            uplink=Uplink(StochasticQuantizer(bits=8)),
            sampling_seed=3,
        )


def test_an_old_format_checkpoint_is_refused_with_a_clear_message(tmp_path: Path) -> None:
    checkpointed(tmp_path)
    edit_manifest(tmp_path, lambda m: m.update(format=1))
    with pytest.raises(CheckpointError, match=r"format 1.*reads format 2 only"):
        FedADMM(rho=0.1, initial_parameters=zeros_parameters(), checkpoint=Checkpointing(tmp_path))


# --------------------------------------------------------- bindings in the state
def test_bindings_and_evictions_resume_bit_identically(tmp_path: Path) -> None:
    """12 rounds straight == 6 + checkpoint + a new strategy object + 6, with evictions."""
    kwargs = {
        "rho": 0.1,
        "fraction_fit": 0.3,
        "min_fit_clients": 3,
        "min_available_clients": NUM_CLIENTS,
        "clients": ClientPolicy(max_age=2),
        "initial_parameters": zeros_parameters(),
    }
    client = {**CLIENT, "local_init": "center"}  # no warm start: new proxies are exact

    def proxies() -> list[Any]:
        return make_proxies(admm_client_fn(**client), NUM_CLIENTS)

    straight = FedADMM(**kwargs)
    expected = run_rounds(straight, proxies(), 12)
    assert sum(int(m["num_evicted"]) for m in expected.fit_metrics) > 0

    first = FedADMM(checkpoint=Checkpointing(tmp_path), **kwargs)
    run_rounds(first, proxies(), 6)
    second = FedADMM(checkpoint=Checkpointing(tmp_path), **kwargs)
    assert second.binding.last_seen == first.binding.last_seen
    assert second.binding.node_of == first.binding.node_of
    resumed = run_rounds(second, proxies(), 6)

    assert [m["num_evicted"] for m in resumed.fit_metrics] == [
        m["num_evicted"] for m in expected.fit_metrics[6:]
    ]
    np.testing.assert_array_equal(
        parameters_to_ndarrays(resumed.parameters)[0],
        parameters_to_ndarrays(expected.parameters)[0],
    )
    assert second.admm is not None and straight.admm is not None
    assert sorted(second.admm.records) == sorted(straight.admm.records)


def test_a_resume_under_new_node_ids_keeps_every_dual(tmp_path: Path) -> None:
    """Issue 25, item 7: a new run (or restarted insecure SuperNodes) gives the clients
    new node ids. The restored bindings are provisional: each key moves to the node
    that claims it, keeping its dual (resynced once: that round's reply trained around
    z); the old code evicted every key and kept only z."""
    first = checkpointed(tmp_path, rounds=4)
    assert first.admm is not None
    duals = {key: record.y[0].copy() for key, record in first.admm.records.items()}
    second = FedADMM(
        rho=0.1, initial_parameters=zeros_parameters(), checkpoint=Checkpointing(tmp_path)
    )
    renewed = make_proxies(admm_client_fn(**CLIENT), NUM_CLIENTS, node_ids=list(range(101, 111)))
    resumed = run_rounds(second, renewed, 3)
    assert [m["num_evicted"] for m in resumed.fit_metrics] == [0, 0, 0]
    assert [m["num_key_conflicts"] for m in resumed.fit_metrics] == [0, 0, 0]
    assert resumed.fit_metrics[0]["num_resynced"] == NUM_CLIENTS
    assert resumed.fit_metrics[1]["num_replies"] == NUM_CLIENTS
    assert second.binding.key_of == {str(101 + i): f"partition-id:{i}" for i in range(10)}
    assert second.admm is not None
    assert sorted(second.admm.records) == sorted(duals)
    moved = [not np.array_equal(second.admm.records[k].y[0], y) for k, y in duals.items()]
    assert all(moved)  # the kept duals went on from where they were (not from 0)
