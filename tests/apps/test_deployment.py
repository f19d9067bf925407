"""A real Flower deployment on loopback: SuperLink + 3 SuperNodes + `flwr run`.

The deployed run must reproduce the in-process run of the same apps round for round;
a SuperNode killed mid-run must cost one failed reply, not the run; restarted (new
node id, same partition-id), it is refused while its old node is within its grace
and then rejoins as a new client (key_binding="node": its old dual and cached model
are evicted, it is sent z); a ServerApp stopped mid-run and resumed from its
checkpoint by a new run with the same SuperNodes ends where the uninterrupted run does.
Every process is stopped by PID by the fixture, also when a test fails.

The deployed runs are the Message API's; the fault test holds them against the legacy
strategy's in-process replay of the same fault (both APIs run one round layer,
`flwr_admm.rounds`), so the legacy API needs no deployment of its own.
"""

from __future__ import annotations

import json
import os
import stat
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from app_runs import run_message
from flwr.common import Context, RecordDict

from flwr_admm.rounds.checkpoint import load_checkpoint
from flwr_admm.rounds.identity import ABSENT_GRACE
from flwr_admm.testing import make_proxies
from simulations.admm_app.client_app import client_fn
from simulations.admm_app.server_app import PartitionClientManager, server_fn
from simulations.deploy_process import read_log
from simulations.deployment import LoopbackDeployment
from simulations.launcher import process_table
from simulations.report import check_result

pytestmark = pytest.mark.deployment

NUM_NODES = 3
KILLED = 2  # partition-id of the SuperNode the fault test kills
CONFIG = {
    # every deployed run is the Message API's; the fault test replays the legacy
    # strategy in process
    "api": "message",
    "strategy": "fedadmm",
    "task": "seed-logreg",
    "num-clients": NUM_NODES,
    "rho": 0.1,
    "local-steps": 20,
    "learning-rate": 1.0,
    "batch-size": 0,
    "seed": 42,
    # long enough for a restarted SuperNode to register before the next round
    "client-wait-seconds": 30.0,
}
POLL_SECONDS = 0.2  # Flower's 3 s polls, shortened (simulations/fast_polls)
COMPARED = (
    "objective",
    "gap",
    "relative_gap",
    "test_accuracy",
    "primal_residual",
    "dual_residual",
    "rho",
    "client_drift",
    "model_change",
    "num_results",
    "num_failures",
)


@pytest.fixture(scope="module")
def deployment(tmp_path_factory):
    home = tmp_path_factory.mktemp("loopback") / "flwr-home"
    with LoopbackDeployment(NUM_NODES, home=home, poll_seconds=POLL_SECONDS) as running:
        yield running
    # __exit__ stopped everything by PID (it raises otherwise); double-check
    leftover = [pid for pid, (_, _, token) in process_table().items() if token == running.token]
    assert leftover == [], f"still running after stop: {leftover}"


def _context(run_config):
    return Context(run_id=0, node_id=0, node_config={}, state=RecordDict(), run_config=run_config)


def _node_client_fn(run_config):
    def node_client_fn(context):
        context.run_config = run_config
        return client_fn(context)

    return node_client_fn


def _rounds(task_dir):
    document = json.loads((task_dir / "fedadmm.json").read_text())
    return {record["round"]: record for record in document["rounds"]}


def _assert_same_rounds(deployed, in_process, rounds):
    for number in rounds:
        for key in COMPARED:
            np.testing.assert_allclose(
                deployed[number][key],
                in_process[number][key],
                rtol=1e-10,
                atol=1e-14,
                err_msg=f"round {number}, {key}",
            )


def test_deployed_message_api_run_matches_the_in_process_run(deployment, tmp_path):
    """The Message-API app deployed (the default api) equals it on an in-process grid."""
    rounds = 2  # each deployed round costs ~4 s (fresh processes; polls shortened)
    config = {**CONFIG, "num-server-rounds": rounds}
    outcome = deployment.run(
        {**config, "output-dir": str(tmp_path / "deployed")}, tmp_path / "run.log", timeout=300
    )
    log = outcome.log_path.read_text()[-3000:]
    assert outcome.returncode == 0, log
    document, problems = check_result(tmp_path / "deployed" / "seed-logreg", "fedadmm", rounds)
    assert problems == [], log
    assert document["num_clients"] == NUM_NODES

    run_message({**config, "output-dir": str(tmp_path / "in-process")}, NUM_NODES)

    deployed = _rounds(tmp_path / "deployed" / "seed-logreg")
    expected = _rounds(tmp_path / "in-process" / "seed-logreg")
    _assert_same_rounds(deployed, expected, range(1, rounds + 1))
    assert all(deployed[r]["num_results"] == NUM_NODES for r in range(1, rounds + 1))
    assert deployed[rounds]["relative_gap"] < deployed[1]["relative_gap"]


def _replay_with_restart(config, rounds, kill_round):
    """In process: partition KILLED fails in `kill_round`, then its node leaves and it
    returns as a new node (new cid, empty node state), as the restarted SuperNode does
    (SIGTERM: the SuperNode deactivates itself, so the SuperLink no longer lists it)."""
    components = server_fn(_context(config))
    strategy = components.strategy
    node_client_fn = _node_client_fn(config)
    proxies = make_proxies(node_client_fn, NUM_NODES)
    manager = PartitionClientManager(wait_seconds=0.01, seed=0)
    for proxy in proxies:
        manager.register(proxy)
    parameters = strategy.initialize_parameters(manager)
    strategy.evaluate(0, parameters)
    for server_round in range(1, rounds + 1):
        if server_round == kill_round + 1:
            manager.unregister(proxies[KILLED])
            restarted = make_proxies(node_client_fn, NUM_NODES, node_ids=[101, 102, 103])
            manager.register(restarted[KILLED])
        results, failures = [], []
        for proxy, ins in strategy.configure_fit(server_round, parameters, manager):
            if server_round == kill_round and proxy is proxies[KILLED]:
                failures.append(RuntimeError("SuperNode killed"))
            else:
                results.append((proxy, proxy.fit(ins, None, server_round)))
        aggregated, _ = strategy.aggregate_fit(server_round, results, failures)
        parameters = aggregated if aggregated is not None else parameters
        strategy.evaluate(server_round, parameters)


def test_a_failed_start_stops_what_was_started(tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in Path(sys.executable).parent.iterdir():
        if tool.name != "flower-supernode":
            (bin_dir / tool.name).symlink_to(tool)
    broken = bin_dir / "flower-supernode"  # leaves a child behind, then fails
    broken.write_text("#!/bin/sh\nsleep 300 &\necho 'cannot reach the SuperLink'\nexit 3\n")
    broken.chmod(broken.stat().st_mode | stat.S_IEXEC)
    deployment = LoopbackDeployment(1, home=tmp_path / "home", bin_dir=bin_dir)
    with pytest.raises(RuntimeError, match="cannot reach the SuperLink"), deployment:
        pass  # pragma: no cover
    assert deployment.superlink is not None
    assert not os.path.exists(f"/proc/{deployment.superlink.pid}")
    assert deployment.owned_pids() == set()
    assert not any(token == deployment.token for _, _, token in process_table().values())


def test_message_api_killed_supernode_fails_one_round_and_rejoins(deployment, tmp_path):
    """api=message, FedADMM (server-held duals): the SuperNode killed (SIGTERM) in round
    2 is one failed reply (the SuperLink's NODE_UNAVAILABLE error reply), restarted it
    is refused in round 3 (its old node within ABSENT_GRACE) and rejoins as a new client
    in round 4 (its key's old state evicted), the run completes,
    and every round equals the legacy strategy's in-process replay of the same fault."""
    rounds, kill_round = 4, 2
    config = {**CONFIG, "num-server-rounds": rounds}
    old = deployment.supernodes[KILLED]
    output_dir = str(tmp_path / "deployed")
    run = deployment.submit({**config, "output-dir": output_dir}, tmp_path / "run.log")
    try:
        killed_pid = deployment.kill_during_round(KILLED, run, kill_round, timeout=300)
        assert killed_pid == old.process.pid and old.process.returncode is not None
        new = deployment.restart_supernode(KILLED)
        assert new.process.pid != killed_pid and new.node_id != old.node_id
        outcome = run.wait(timeout=400)  # ~70 s idle, 173 s seen under load
    finally:
        run.cancel()
    log = outcome.log_path.read_text()[-3000:]
    assert outcome.returncode == 0, log
    task_dir = tmp_path / "deployed" / "seed-logreg"
    _, problems = check_result(task_dir, "fedadmm", rounds, allow_failures=True)
    assert problems == [], log
    deployed = _rounds(task_dir)
    pattern = [
        (
            deployed[r]["num_results"],
            deployed[r]["num_failures"],
            deployed[r]["fit_metrics"]["num_evicted"],
            deployed[r]["fit_metrics"]["num_key_conflicts"],
            deployed[r]["fit_metrics"]["num_replies"],
        )
        for r in range(1, rounds + 1)
    ]
    # round 2: the others' replies aggregated, the killed node's a failure; round 3:
    # the restarted node (new node id) claims partition-id 2, whose node is absent
    # from one sampling (within ABSENT_GRACE = 1): a key conflict, the old state kept;
    # round 4: the old node has left (absent twice): the key's old dual and cached
    # model are evicted (num_evicted = 1), the key is bound to the new node, and its
    # reply (trained around z, the center of a new client) is folded in as a new one's
    assert ABSENT_GRACE == 1
    assert pattern == [(3, 0, 0, 0, 3), (2, 1, 0, 0, 2), (3, 0, 0, 1, 2), (3, 0, 1, 0, 3)], log
    assert all(deployed[r]["fit_metrics"]["num_clients_cached"] == 3 for r in range(1, rounds + 1))
    assert all(deployed[r]["fit_metrics"]["num_resynced"] == 0 for r in range(1, rounds + 1))
    # Exactly what the legacy strategy does in process with the same failure and rejoin
    # (keeping the old dual instead, key_binding="reported", changes the objective of
    # round 3 in the 3rd digit).
    _replay_with_restart({**config, "output-dir": str(tmp_path / "replay")}, rounds, kill_round)
    replayed = _rounds(tmp_path / "replay" / "seed-logreg")
    _assert_same_rounds(deployed, replayed, range(1, rounds + 1))
    assert deployed[rounds]["relative_gap"] < deployed[1]["relative_gap"]


def _checkpoint_round(directory):
    """Return the round of the checkpoint in `directory` (0: none yet)."""
    try:
        return int(json.loads((directory / "checkpoint.json").read_text())["round"])
    except (OSError, ValueError, KeyError):
        return 0


def _z(directory):
    arrays, _ = load_checkpoint(directory)
    return {name: value for name, value in arrays.items() if name.startswith("z")}


def test_killed_serverapp_resumes_from_its_checkpoint(deployment, tmp_path):
    """api=message, FedADMM (server-held duals): run B checkpoints every 2 rounds and its
    ServerApp is stopped (`flwr stop`) once round 2's checkpoint exists, mid-run; run C
    (a new run, same SuperNodes and node ids, resume=true) continues after B's last
    checkpoint (round 2, or 4 when the stop takes longer than two rounds: rounds take
    about 3.5 s with the shortened polls) with 0 evictions and ends where the
    uninterrupted run A does. local-init=center: the clients' solve needs no
    context.state, which Flower keeps per run (C's clients start empty)."""
    rounds, stop = 6, 2
    config = {**CONFIG, "local-init": "center", "num-server-rounds": rounds}
    # A: uninterrupted; its only checkpoint (after the last round) is where z is read
    full = {"checkpoint-dir": str(tmp_path / "a-ckpt"), "checkpoint-every": rounds}
    outcome = deployment.run(
        {**config, **full, "output-dir": str(tmp_path / "a")}, tmp_path / "a.log", timeout=300
    )
    assert outcome.returncode == 0, outcome.log_path.read_text()[-3000:]
    # B: checkpoints every `stop` rounds; stopped once round `stop`'s checkpoint exists
    checkpoints = tmp_path / "ckpt"
    part = {**config, "checkpoint-dir": str(checkpoints), "checkpoint-every": stop}
    run = deployment.submit({**part, "output-dir": str(tmp_path / "b")}, tmp_path / "b.log")
    try:
        deadline = time.monotonic() + 300
        while _checkpoint_round(checkpoints) < stop:
            assert run.process.poll() is None, read_log(tmp_path / "b.log")[-3000:]
            assert time.monotonic() < deadline, "no checkpoint of round 2 within 300 s"
            time.sleep(0.2)
    finally:
        run.cancel()  # flwr stop: the SuperLink ends the ServerApp mid-run
    assert run.process.returncode is not None
    stopped = _checkpoint_round(checkpoints)  # B's last checkpoint
    assert stop <= stopped < rounds, f"B was not stopped mid-run: checkpoint of {stopped}"
    # C: a new run resumes from B's checkpoint with the same SuperNodes
    outcome = deployment.run(
        {**part, "resume": True, "output-dir": str(tmp_path / "c")},
        tmp_path / "c.log",
        timeout=300,
    )
    log = outcome.log_path.read_text()[-3000:]
    assert outcome.returncode == 0, log
    document = json.loads((tmp_path / "c" / "seed-logreg" / "fedadmm.json").read_text())
    assert document["status"] == "complete" and document["resumed_after_round"] == stopped, log
    resumed = {record["round"]: record for record in document["rounds"]}
    assert sorted(resumed) == list(range(stopped, rounds + 1))  # the checkpoint's z first
    for number in range(stopped + 1, rounds + 1):
        fit = resumed[number]["fit_metrics"]
        assert (resumed[number]["num_results"], resumed[number]["num_failures"]) == (3, 0)
        assert (fit["num_evicted"], fit["num_key_conflicts"], fit["num_rejected"]) == (0, 0, 0)
    uninterrupted = _rounds(tmp_path / "a" / "seed-logreg")
    _assert_same_rounds(resumed, uninterrupted, range(stopped + 1, rounds + 1))
    for key in ("objective", "gap", "relative_gap", "test_accuracy"):  # evaluation only
        assert resumed[stopped][key] == pytest.approx(uninterrupted[stopped][key], rel=1e-10), key
    z_full, z_resumed = _z(tmp_path / "a-ckpt"), _z(checkpoints)
    assert _checkpoint_round(checkpoints) == rounds and z_full.keys() == z_resumed.keys()
    gap = max(
        float(np.linalg.norm(z_resumed[k] - z) / np.linalg.norm(z)) for k, z in z_full.items()
    )
    print(f"resumed vs uninterrupted final z: relative difference {gap:.3e}")
    assert gap <= 1e-8
