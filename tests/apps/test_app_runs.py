"""The simulations app run in process (server_fn and client_fn, no Ray), its sampling,
and `flwr run`s of the peer baselines and of a failing run through Flower's Simulation
Engine (marked ray).

References: the result-file checker report.check_result; byte counts computed by hand
(10 clients x one float64 (20,) array in .npy format); a second run (reruns are
bit-identical); PartitionClientManager's draws compared across node ids.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from app_runs import run_legacy, run_message
from flwr.common import (
    Code,
    Context,
    GetPropertiesIns,
    GetPropertiesRes,
    RecordDict,
    Status,
)
from flwr.server.client_proxy import ClientProxy

from flwr_admm.core import RunDivergedError
from simulations import compare
from simulations.admm_app.client_app import client_fn
from simulations.admm_app.server_app import PartitionClientManager, server_fn
from simulations.launcher import APP_DIR
from simulations.report import check_result

# ----------------------------------------------- the apps in process (no Ray)


def _run_in_process(run_config, num_clients=10, fail=False):
    """The legacy path in process (api=legacy set explicitly: these tests are about it)."""
    return run_legacy(run_config, num_clients, fail=fail)


@pytest.mark.parametrize(
    "strategy",
    ["fedadmm", "fedadmm-client-duals", "fedavg", "fedprox", "fednova", "scaffold", "feddyn"],
)
def test_every_strategy_records_complete_results(tmp_path, strategy):
    config = {
        "strategy": strategy,
        "num-server-rounds": 3,
        "output-dir": str(tmp_path),
        "local-steps": 5,
    }
    _run_in_process(config)
    document, problems = check_result(tmp_path / "seed-logreg", strategy, 3)
    assert problems == []
    assert (tmp_path / "seed-logreg" / f"{strategy}.csv").exists()
    last = document["rounds"][-1]
    for key in ("objective", "gap", "relative_gap", "test_accuracy", "test_auc"):
        assert np.isfinite(last[key])
    if strategy == "fedadmm-client-duals":  # its replies are contribution changes
        assert last["client_drift"] is None
    else:  # SCAFFOLD's replies carry y_i first: its drift is measured on them
        assert np.isfinite(last["client_drift"]) and last["client_drift"] > 0
    assert len(last["client_auc"]) == 10
    # 10 clients x one float64 (20,) array in .npy format, both ways; SCAFFOLD sends
    # its control variate with the model, both ways: twice the bytes
    blocks = 2 if strategy == "scaffold" else 1
    assert last["bytes_up"] == last["bytes_down"] == blocks * 10 * (20 * 8 + 128)
    assert last["num_results"] == 10 and last["num_failures"] == 0
    assert document["rounds"][0]["relative_gap"] > last["relative_gap"] > 0
    if strategy == "fedadmm":
        assert last["rho"] == 0.1 and last["primal_residual"] > 0
    if strategy == "fedadmm-client-duals":
        assert last["rho"] == 0.1 and last["previous_primal_residual"] > 0
    if strategy == "fednova":
        assert last["tau_eff"] == 5.0


def test_client_duals_clients_start_at_the_received_z_with_local_init_consensus(tmp_path):
    # Only the start of the local solve differs: same sampling, same data, same rho
    objectives = {}
    for start in ("previous", "consensus"):
        config = {
            "strategy": "fedadmm-client-duals",
            "num-server-rounds": 4,
            "output-dir": str(tmp_path / start),
            "local-steps": 2,
            "local-init": start,
        }
        _run_in_process(config)
        document, problems = check_result(tmp_path / start / "seed-logreg", config["strategy"], 4)
        assert problems == []
        objectives[start] = {r["round"]: r["objective"] for r in document["rounds"]}
    assert objectives["previous"][1] == objectives["consensus"][1]  # no w_i kept yet: start z
    for server_round in (2, 3, 4):
        assert objectives["previous"][server_round] != objectives["consensus"][server_round]


@pytest.mark.parametrize(
    "task, num_clients, extra",
    [
        ("credit", 3, {}),
        ("digits", 10, {}),
        # the paper's 20 local epochs of batch 10 on 30 users: one epoch keeps it quick
        ("synthetic", 30, {"local-epochs": 1}),
    ],
)
def test_other_tasks_run_with_their_defaults(tmp_path, task, num_clients, extra):
    config = {
        "task": task,
        "strategy": "fednova",
        "num-server-rounds": 2,
        "output-dir": str(tmp_path),
        **extra,
    }
    _run_in_process(config, num_clients=num_clients)
    document, problems = check_result(tmp_path / task, "fednova", 2)
    assert problems == []
    assert document["evaluation_data"] == "test split"
    assert np.isfinite(document["rounds"][-1]["test_accuracy"])


def test_reruns_are_bit_identical(tmp_path):
    rounds = []
    for name in ("a", "b"):
        config = {
            "strategy": "fedadmm",
            "num-server-rounds": 3,
            "output-dir": str(tmp_path / name),
        }
        _run_in_process(config)
        document = json.loads((tmp_path / name / "seed-logreg" / "fedadmm.json").read_text())
        rounds.append(
            [{k: v for k, v in r.items() if "seconds" not in k} for r in document["rounds"]]
        )
    assert rounds[0] == rounds[1]


def test_all_clients_failing_is_loud(tmp_path):
    config = {"strategy": "fedavg", "num-server-rounds": 3, "output-dir": str(tmp_path)}
    with pytest.raises(RuntimeError, match="all 10 clients failed"):
        _run_in_process(config, fail=True)
    marker = tmp_path / "seed-logreg" / "fedavg.error.json"
    assert "client exploded" in json.loads(marker.read_text())["message"]
    _, problems = check_result(tmp_path / "seed-logreg", "fedavg", 3)
    assert any("error marker" in p for p in problems)
    assert any("status is 'failed'" in p for p in problems)


def test_bad_run_config_in_the_server_app_leaves_an_error_marker(tmp_path):
    context = Context(
        run_id=0,
        node_id=0,
        node_config={},
        state=RecordDict(),
        run_config={"strategy": "fedavg", "rho": -1.0, "output-dir": str(tmp_path)},
    )
    with pytest.raises(ValueError, match="'rho'"):
        server_fn(context)
    marker = json.loads((tmp_path / "seed-logreg" / "fedavg.error.json").read_text())
    assert "'rho'" in marker["message"]


def test_client_refuses_a_partition_the_task_does_not_have():
    context = Context(
        run_id=0,
        node_id=1,
        node_config={"partition-id": 3, "num-partitions": 4},
        state=RecordDict(),
        run_config={},
    )
    with pytest.raises(ValueError, match="num-supernodes=10"):
        client_fn(context)


class _PartitionProxy(ClientProxy):
    def __init__(self, cid, partition_id):
        super().__init__(cid)
        self.partition_id = partition_id
        self.asked = 0

    def get_properties(self, ins, timeout, group_id):
        assert isinstance(ins, GetPropertiesIns)
        self.asked += 1
        return GetPropertiesRes(Status(Code.OK, ""), {"partition-id": self.partition_id})

    def get_parameters(self, ins, timeout, group_id):  # pragma: no cover
        raise NotImplementedError

    def fit(self, ins, timeout, group_id):  # pragma: no cover
        raise NotImplementedError

    def evaluate(self, ins, timeout, group_id):  # pragma: no cover
        raise NotImplementedError

    def reconnect(self, ins, timeout, group_id):  # pragma: no cover
        raise NotImplementedError


def _sampled_partitions(node_ids, draws=3):
    manager = PartitionClientManager(wait_seconds=1, seed=7)
    proxies = [_PartitionProxy(str(node_id), pid) for pid, node_id in enumerate(node_ids)]
    for proxy in proxies:
        manager.register(proxy)
    picks = [sorted(p.partition_id for p in manager.sample(4)) for _ in range(draws)]
    assert all(p.asked == 1 for p in proxies)  # asked once, then remembered
    return picks


def test_partial_sampling_depends_on_partition_ids_not_node_ids():
    rng = np.random.default_rng(0)
    first = _sampled_partitions(rng.choice(10**9, size=10, replace=False))
    second = _sampled_partitions(rng.choice(10**9, size=10, replace=False))
    assert first == second
    assert len({tuple(p) for p in first}) > 1  # it does vary from round to round


def test_full_participation_asks_nothing_and_too_few_clients_samples_none():
    manager = PartitionClientManager(wait_seconds=0.1, seed=0)
    proxies = [_PartitionProxy(str(i), i) for i in range(3)]
    for proxy in proxies:
        manager.register(proxy)
    assert len(manager.sample(3)) == 3 and all(p.asked == 0 for p in proxies)
    assert manager.sample(5, min_num_clients=5) == []


# --------------------------------------------------------- end to end (Ray)


@pytest.mark.ray
def test_flwr_run_end_to_end(tmp_path, local_flower):
    """The peer baselines and a failing run through `flwr run` on the session's SuperLink
    (FedADMM's own `flwr run`s, both APIs: tests/apps/test_message_app.py; that the
    launcher stops everything it started, by PID: the fixture's teardown)."""
    output_dir = tmp_path / "outputs"
    # The peer baselines keep c_i / grad_i in context.state: 3 rounds of 5 of 10
    peers = {
        name: local_flower.run(
            APP_DIR,
            {
                "api": api,  # one peer on each API, in Flower's real engine
                "strategy": name,
                "num-server-rounds": 3,
                "fraction-fit": 0.5,
                "output-dir": str(output_dir),
            },
            num_supernodes=10,
            log_path=tmp_path / f"{name}.log",
            timeout=120,
        )
        for name, api in (("scaffold", "message"), ("feddyn", "legacy"))
    }
    # A run that fails in the ServerApp: flwr run still exits 0, the marker tells.
    failed = local_flower.run(
        APP_DIR,
        {"strategy": "fedavg", "rho": -1.0, "output-dir": str(output_dir)},
        num_supernodes=10,
        log_path=tmp_path / "failed.log",
        timeout=120,
    )
    _, problems = check_result(output_dir / "seed-logreg", "fedavg", 50)
    assert any("error marker" in p and "'rho'" in p for p in problems), problems
    # (Flower 1.42 exits 0 here: failed.returncode is not evidence either way.)
    assert failed.log_path.exists()
    for name, peer in peers.items():
        assert peer.returncode == 0, peer.log_path.read_text()[-3000:]
        document, problems = check_result(output_dir / "seed-logreg", name, 3)
        assert problems == [], peer.log_path.read_text()[-3000:]
        rounds = document["rounds"]
        assert [r["num_results"] for r in rounds[1:]] == [5, 5, 5]
        # 5 clients x one float64 (20,) block (.npy), SCAFFOLD two: model and c
        blocks = 2 if name == "scaffold" else 1
        assert rounds[-1]["bytes_down"] == rounds[-1]["bytes_up"] == blocks * 5 * (20 * 8 + 128)
        assert rounds[0]["relative_gap"] > rounds[-1]["relative_gap"] > 0


@pytest.mark.parametrize("model", [{}, {"framework": "torch", "model": "cnn"}], ids=["mlp", "cnn"])
@pytest.mark.parametrize(
    "task, shape, column", [("mnist", (28, 28), "image"), ("cifar10", (32, 32, 3), "img")]
)
def test_image_tasks_run_through_the_app_on_an_in_memory_standin(
    tmp_path, monkeypatch, task, shape, column, model
):
    """mnist/cifar10 download from the hub in real runs; here the same app code path
    runs on a small in-memory DatasetDict injected where the app loads its task."""
    from standins import image_standin

    import simulations.admm_app.evaluation as evaluation

    standin = image_standin(shape, column, n_train=200)
    real_load_task = evaluation.load_task
    monkeypatch.setattr(
        evaluation,
        "load_task",
        lambda name, **options: real_load_task(name, dataset=standin, **options),
    )
    evaluation._cached_task.cache_clear()
    try:
        config = {
            "task": task,
            "strategy": "fedadmm",
            "num-server-rounds": 2,
            "num-clients": 4,
            "partitioner": "iid",
            "output-dir": str(tmp_path),
            **model,
        }
        _run_in_process(config, num_clients=4)
    finally:
        evaluation._cached_task.cache_clear()
    document, problems = check_result(tmp_path / task, "fedadmm", 2)
    assert problems == []
    assert np.isfinite(document["rounds"][-1]["test_accuracy"])
    assert document["settings"]["framework"] == model.get("framework", "numpy")
    assert document["settings"]["model"] == model.get("model", document["settings"]["model"])


@pytest.mark.parametrize("api", ["legacy", "message"])
def test_a_diverging_run_fails_with_the_watchdogs_message(tmp_path, api, capsys):
    # lr 10 with a gradient step on the penalty (lr rho = 10 > 2) blows up in round 1.
    config = {
        "strategy": "fedadmm",
        "num-server-rounds": 10,
        "output-dir": str(tmp_path),
        "rho": 1.0,
        "learning-rate": 10.0,
        "local-steps": 20,
        "prox-step": "gradient",
    }
    run = run_legacy if api == "legacy" else run_message
    with pytest.raises(RunDivergedError, match="FedADMM: the run diverged or stalled at round 1"):
        run(config)
    marker = json.loads((tmp_path / "seed-logreg" / "fedadmm.error.json").read_text())
    assert marker["error"] == "RunDivergedError" and "Traceback" in marker["traceback"]
    _, problems = check_result(tmp_path / "seed-logreg", "fedadmm", 10)
    assert "(explosion)" in problems[0] and "What to try: lower the clients'" in problems[0]
    argv = ["--task", "seed-logreg", "--rounds", "10", "--output-dir", str(tmp_path)]
    assert compare.main([*argv, "--strategies", "fedadmm", "--report-only"]) == 1
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert last.startswith("What to try:") and "FedADMM(health=None)" in last
