"""The simulations app: run-config validation, recording, sampling, reports, diagnostics,
and one end-to-end `flwr run` through Flower's Simulation Engine."""

from __future__ import annotations

import json
import os
import tomllib
from pathlib import Path

import numpy as np
import pytest
from flwr.common import (
    Code,
    Context,
    GetPropertiesIns,
    GetPropertiesRes,
    RecordDict,
    Status,
)
from flwr.server.client_proxy import ClientProxy

from flwr_admm.testing import make_proxies, run_rounds
from simulations import compare, diagnose
from simulations.admm_app.client_app import client_fn
from simulations.admm_app.run_config import DEFAULTS, fit_config, parse_run_config
from simulations.admm_app.server_app import PartitionClientManager, server_fn
from simulations.launcher import APP_DIR, LocalFlower, process_table
from simulations.report import RunResult, check_result, plot_all, summary_markdown

# ----------------------------------------------------------------- run config


def test_pyproject_config_is_the_validated_defaults():
    app = tomllib.loads((APP_DIR / "pyproject.toml").read_text())["tool"]["flwr"]["app"]
    assert app["config"] == DEFAULTS
    assert app["components"] == {
        "serverapp": "admm_app.server_app:app",
        "clientapp": "admm_app.client_app:app",
    }
    assert (
        "federations" not in tomllib.loads((APP_DIR / "pyproject.toml").read_text())["tool"]["flwr"]
    )
    parse_run_config(app["config"])


@pytest.mark.parametrize(
    "override, words",
    [
        ({"strategy": "sgd"}, ["'strategy'", "fedadmm", "fednova", "'sgd'"]),
        ({"task": "nope"}, ["'task'", "seed-logreg"]),
        ({"num-server-rounds": 0}, ["'num-server-rounds'", ">= 1"]),
        ({"num-server-rounds": 2.5}, ["'num-server-rounds'"]),
        ({"rho": -1.0}, ["'rho'", ">= 0"]),
        ({"rho-schedule": "cosine"}, ["'rho-schedule'", "residual-balancing"]),
        ({"relaxation": 2.0}, ["'relaxation'", "(0, 2)"]),
        ({"round-timeout": -1.0}, ["'round-timeout'", "0 = no limit"]),
        (
            {"strategy": "fedadmm-client-duals", "rho-schedule": "residual-balancing"},
            ["'rho-schedule'", "'constant'"],
        ),
        ({"strategy": "fedadmm-client-duals", "relaxation": 1.6}, ["'relaxation'", "must be 1"]),
        ({"strategy": "fedadmm-client-duals", "rho": 0.0}, ["'rho'", "> 0"]),
        ({"relaxation": 0.0}, ["'relaxation'", "(0, 2)"]),
        ({"local-init": "zero"}, ["'local-init'", "previous", "center"]),
        ({"prox-step": "newton"}, ["'prox-step'", "exact", "gradient"]),
        ({"local-steps": 5, "local-epochs": 2}, ["'local-steps'", "'local-epochs'", "at most one"]),
        ({"local-steps": -1}, ["'local-steps'"]),
        ({"batch-size": -2}, ["'batch-size'", "-1 = task default"]),
        ({"learning-rate": float("nan")}, ["'learning-rate'"]),
        ({"proximal-mu": -0.1}, ["'proximal-mu'"]),
        ({"fraction-fit": 1.5}, ["'fraction-fit'", "[0, 1]"]),
        ({"partitioner": "shard"}, ["'partitioner'", "iid", "dirichlet", "pathological"]),
        ({"dirichlet-alpha": 0.0}, ["'dirichlet-alpha'", "> 0"]),
        ({"seed": -3}, ["'seed'"]),
        ({"output-dir": ""}, ["'output-dir'"]),
        ({"run-tag": "a b"}, ["'run-tag'"]),
        ({"strategy": 3}, ["'strategy'"]),
        ({"rho": True}, ["'rho'"]),
        ({"bogus-key": 1}, ["unknown keys", "bogus-key"]),
    ],
)
def test_run_config_errors_name_the_key_and_the_allowed_values(override, words):
    with pytest.raises(ValueError) as info:
        parse_run_config(override)
    for word in words:
        assert word in str(info.value)


def test_options_a_task_does_not_have_are_refused():
    with pytest.raises(ValueError, match=r"'model'.*seed-logreg"):
        parse_run_config({"model": "mlp"}).task_options()
    assert parse_run_config({"num-clients": 5}).task_options() == {"num_clients": 5}


def test_task_defaults_fill_only_what_is_left_unset():
    task_defaults = {"learning_rate": 0.5, "local_epochs": 2, "batch_size": 32, "fraction_fit": 0.3}
    s = parse_run_config({}, task_defaults)
    assert (s.learning_rate, s.local_steps, s.local_epochs, s.batch_size) == (0.5, None, 2, 32)
    assert s.fraction_fit == 0.3
    s = parse_run_config(
        {"learning-rate": 0.1, "local-steps": 7, "batch-size": 0, "fraction-fit": 1.0},
        task_defaults,
    )
    assert (s.learning_rate, s.local_steps, s.local_epochs, s.batch_size) == (0.1, 7, None, None)
    assert s.fraction_fit == 1.0
    assert fit_config(s) == {"learning_rate": 0.1, "batch_size": 0, "local_steps": 7}


# ----------------------------------------------- the apps in process (no Ray)


def _run_in_process(run_config, num_clients=10, fail=False):
    context = Context(
        run_id=0, node_id=0, node_config={}, state=RecordDict(), run_config=run_config
    )
    components = server_fn(context)

    def node_client_fn(node_context):
        if fail:
            raise RuntimeError("client exploded")
        node_context.run_config = run_config
        return client_fn(node_context)

    return run_rounds(
        components.strategy, make_proxies(node_client_fn, num_clients), components.config.num_rounds
    )


@pytest.mark.parametrize(
    "strategy", ["fedadmm", "fedadmm-client-duals", "fedavg", "fedprox", "fednova"]
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
    else:
        assert np.isfinite(last["client_drift"])
    assert len(last["client_auc"]) == 10
    # 10 clients x one float64 (20,) array in .npy format, both ways
    assert last["bytes_up"] == last["bytes_down"] == 10 * (20 * 8 + 128)
    assert last["num_results"] == 10 and last["num_failures"] == 0
    assert document["rounds"][0]["relative_gap"] > last["relative_gap"] > 0
    if strategy == "fedadmm":
        assert last["rho"] == 0.1 and last["primal_residual"] > 0
    if strategy == "fedadmm-client-duals":
        assert last["rho"] == 0.1 and last["previous_primal_residual"] > 0
    if strategy == "fednova":
        assert last["tau_eff"] == 5.0


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


# --------------------------------------------------------- report and runner


def _fake_document(stem, gaps, accuracy, status="complete", failures=0):
    rounds = []
    for r, gap in enumerate(gaps):
        record = {
            "round": r,
            "objective": 0.5 + gap,
            "relative_gap": gap,
            "test_accuracy": accuracy[r],
            "test_auc": 0.9,
            "worst_client_auc": 0.8,
            "client_auc": {"0": 0.8, "1": 0.9},
        }
        if r > 0:
            record.update(
                {
                    "num_results": 2,
                    "num_failures": failures,
                    "bytes_up": 1000,
                    "bytes_down": 1000,
                    "round_seconds": 0.1 * r,
                    "client_drift": gap,
                }
            )
            if stem.startswith("fedadmm"):
                record.update({"primal_residual": gap, "dual_residual": gap / 2, "rho": 0.1})
        rounds.append(record)
    return {
        "task": "credit",
        "strategy": stem,
        "status": status,
        "num_rounds": len(gaps) - 1,
        "settings": {"task": "credit", "learning_rate": 0.5, "rho": 0.1},
        "optimum": {"objective": 0.5, "grad_norm": 1e-10},
        "rounds": rounds,
    }


def _write_fakes(task_dir):
    task_dir.mkdir(parents=True)
    documents = {
        "fedadmm": _fake_document("fedadmm", [1.0, 1e-2, 1e-4, 1e-7], [0.5, 0.8, 0.9, 0.95]),
        "fedavg": _fake_document("fedavg", [1.0, 1e-2, 2e-3, 9e-4], [0.5, 0.7, 0.8, 0.9]),
    }
    for stem, document in documents.items():
        (task_dir / f"{stem}.json").write_text(json.dumps(document))
    return documents


def test_summary_counts_rounds_to_target_and_plots_are_written(tmp_path):
    task_dir = tmp_path / "credit"
    documents = _write_fakes(task_dir)
    results = [RunResult(stem, doc, wall_seconds=12.0) for stem, doc in documents.items()]
    markdown = summary_markdown(results, title="fake")
    rows = {line.split(" | ")[0].strip("| "): line.split(" | ") for line in markdown.splitlines()}
    # columns: strategy, rounds to 1e-3, rounds to 1e-6, final gap, rounds to acc ...
    assert rows["fedadmm"][1:3] == ["2", "3"]
    assert rows["fedavg"][1:3] == ["3", "-"]
    assert "rounds to acc 0.9405" in markdown  # 0.99 x the best final accuracy
    assert rows["fedadmm"][4] == "3" and rows["fedavg"][4] == "-"
    paths = plot_all(results, task_dir)
    assert {p.name for p in paths} == {
        "objective.png",
        "accuracy.png",
        "residuals.png",
        "client_auc.png",
    }
    assert all(p.stat().st_size > 1000 for p in paths)


def test_check_result_finds_incomplete_and_failed_runs(tmp_path):
    task_dir = tmp_path / "credit"
    task_dir.mkdir()
    _, problems = check_result(task_dir, "fedavg", 3)
    assert problems and "missing result file" in problems[0]
    doc = _fake_document("fedavg", [1.0, 0.1], [0.5, 0.6], status="running")
    (task_dir / "fedavg.json").write_text(json.dumps(doc))
    _, problems = check_result(task_dir, "fedavg", 3)
    assert any("'running'" in p for p in problems)
    assert any("num_rounds is 1" in p for p in problems)
    assert any("rounds missing" in p for p in problems)
    doc = _fake_document("fedavg", [1.0, 0.1, 0.01], [0.5, 0.6, 0.7], failures=1)
    (task_dir / "fedavg.json").write_text(json.dumps(doc))
    assert any("client failures" in p for p in check_result(task_dir, "fedavg", 2)[1])
    assert check_result(task_dir, "fedavg", 2, allow_failures=True)[1] == []


def test_compare_report_only_exit_codes(tmp_path, capsys):
    _write_fakes(tmp_path / "seed-logreg")
    argv = ["--task", "seed-logreg", "--rounds", "3", "--output-dir", str(tmp_path)]
    assert compare.main([*argv, "--strategies", "fedadmm,fedavg", "--report-only"]) == 0
    summary = (tmp_path / "seed-logreg" / "summary.md").read_text()
    assert "| fedadmm |" in summary and "FAILED" not in summary
    assert compare.main([*argv, "--strategies", "fedadmm,fednova", "--report-only"]) == 1
    assert "fednova" in capsys.readouterr().err
    with pytest.raises(SystemExit, match="'rho'"):
        compare.main([*argv, "--run-config", "rho=-1", "--report-only"])
    with pytest.raises(SystemExit, match="--strategies"):
        compare.main([*argv, "--strategies", "fedsgd", "--report-only"])


def test_parse_overrides_reads_toml_values():
    assert compare.parse_overrides('rho=0.5 strategy=fedavg local-init="center" seed=3') == {
        "rho": 0.5,
        "strategy": "fedavg",
        "local-init": "center",
        "seed": 3,
    }
    with pytest.raises(ValueError, match="key=value"):
        compare.parse_overrides("rho")


def test_presets_are_valid_run_configs():
    for preset in compare.PRESETS:
        for task in ("seed-logreg", "credit"):
            parse_run_config(compare.preset_config(preset, task, {}))
    seed = parse_run_config(compare.preset_config("seed", "seed-logreg", {}))
    assert (seed.rho, seed.local_steps, seed.learning_rate, seed.prox_step) == (
        0.1,
        5,
        0.02,
        "gradient",
    )
    default = parse_run_config(compare.preset_config("default", "seed-logreg", {}))
    assert (default.rho, default.proximal_mu, default.local_steps, default.learning_rate) == (
        0.1,
        0.1,
        20,
        1.0,
    )
    # overriding local-epochs drops the preset's local-steps instead of clashing
    config = compare.preset_config("seed", "seed-logreg", {"local-epochs": 2})
    assert "local-steps" not in config and config["local-epochs"] == 2
    # other tasks keep their own recommended local work under the default preset
    assert "local-steps" not in compare.preset_config("default", "credit", {})


# ------------------------------------------------------------------ diagnose


def test_diagnostics_on_seed_logreg(tmp_path, capsys):
    assert diagnose.main(["--task", "seed-logreg", "--output-dir", str(tmp_path)]) == 0
    out_dir = tmp_path / "seed-logreg"
    result = json.loads((out_dir / "diagnostics.json").read_text())
    assert result["num_clients"] == 10 and result["sizes"] == [500] * 10
    # lr 1.0 x 20 full-batch steps = 20 epochs: seed 003's warning
    assert any("learning-rate x local-epochs = 1 x 20 = 20 > 1" in w for w in result["warnings"])
    for name in ("initial model", "optimum z*"):
        cos = np.asarray(result["update_cosines"][name])
        np.testing.assert_allclose(cos, cos.T, atol=1e-12)
        np.testing.assert_allclose(np.diag(cos), 1.0)
        assert min(result["update_norms"][name]) > 0
    # at z* the updates are pure drift; they are much smaller than from z_0 = 0
    assert max(result["update_norms"]["optimum z*"]) < min(result["update_norms"]["initial model"])
    np.testing.assert_allclose(np.sum(result["label_distribution"], axis=1), 1.0)
    assert "## Pairwise cosine" in (out_dir / "diagnostics.md").read_text()
    assert (out_dir / "diagnostics-labels.png").stat().st_size > 1000
    assert (out_dir / "diagnostics-updates.png").stat().st_size > 1000


def test_no_warning_when_lr_times_epochs_is_small(tmp_path):
    settings = parse_run_config(
        {"learning-rate": 0.02, "local-steps": 5, "output-dir": str(tmp_path)},
        {"learning_rate": 1.0, "local_steps": 20},
    )
    result = diagnose.diagnose(settings)
    assert not any("learning-rate x local-epochs" in w for w in result["warnings"])


# --------------------------------------------------------- end to end (Ray)


@pytest.mark.ray
def test_flwr_run_end_to_end(tmp_path):
    output_dir = tmp_path / "outputs"
    flower = LocalFlower(home=tmp_path / "flwr-home")
    with flower:
        superlink_pid = flower.superlink.pid
        assert flower.port != 39091
        outcome = flower.run(
            APP_DIR,
            {
                "strategy": "fedadmm",
                "num-server-rounds": 3,
                "fraction-fit": 0.5,
                "output-dir": str(output_dir),
            },
            num_supernodes=10,
            log_path=tmp_path / "run.log",
            timeout=120,
        )
        assert outcome.returncode == 0, outcome.log_path.read_text()[-3000:]
        # A run that fails in the ServerApp: flwr run still exits 0, the marker tells.
        failed = flower.run(
            APP_DIR,
            {"strategy": "fedavg", "rho": -1.0, "output-dir": str(output_dir)},
            num_supernodes=10,
            log_path=tmp_path / "failed.log",
            timeout=120,
        )
        pids = flower.owned_pids()
    _, problems = check_result(output_dir / "seed-logreg", "fedavg", 50)
    assert any("error marker" in p and "'rho'" in p for p in problems), problems
    # (Flower 1.42 exits 0 here: failed.returncode is not evidence either way.)
    assert failed.log_path.exists()
    document, problems = check_result(output_dir / "seed-logreg", "fedadmm", 3)
    assert problems == [], (tmp_path / "run.log").read_text()[-3000:]
    last = document["rounds"][-1]
    assert last["num_results"] == 5 and last["num_failures"] == 0
    assert last["primal_residual"] > 0 and last["rho"] == 0.1
    assert last["bytes_up"] > 0 and last["bytes_down"] > 0
    assert document["rounds"][0]["relative_gap"] > last["relative_gap"]
    # everything it started is gone, by PID, and nothing else carries its token
    for pid in {superlink_pid, *pids}:
        assert not os.path.exists(f"/proc/{pid}") or _is_zombie(pid)
    assert not any(token == flower.token for _, _, token in process_table().values())
    assert Path(tmp_path / "flwr-home" / "local-superlink" / "superlink.log").exists()


def _is_zombie(pid):
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat[stat.rindex(")") + 2] == "Z"


@pytest.mark.parametrize(
    "task, shape, column", [("mnist", (28, 28), "image"), ("cifar10", (32, 32, 3), "img")]
)
def test_image_tasks_run_through_the_app_on_an_in_memory_standin(
    tmp_path, monkeypatch, task, shape, column
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
        }
        _run_in_process(config, num_clients=4)
    finally:
        evaluation._cached_task.cache_clear()
    document, problems = check_result(tmp_path / task, "fedadmm", 2)
    assert problems == []
    assert np.isfinite(document["rounds"][-1]["test_accuracy"])


def test_round_timeout_reaches_flowers_server_config():
    assert parse_run_config({}).round_timeout is None  # 0: no limit
    context = Context(
        run_id=0,
        node_id=0,
        node_config={},
        state=RecordDict(),
        run_config={"round-timeout": 15.0, "num-server-rounds": 2},
    )
    assert server_fn(context).config.round_timeout == 15.0
