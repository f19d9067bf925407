"""Smoke tests of the benchmarks: they run and write their ratios (never timed).

The quick mode runs as a user would (``python -m benchmarks.all --quick``) in a
subprocess from the repository root; the Ray engine benchmark is marked ``ray``.
Only the presence and sanity of the numbers is checked, never their values.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]


def run_module(*args: str, timeout: float = 300) -> str:
    done = subprocess.run(
        [sys.executable, "-m", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done.stdout


def load(path: Path) -> dict[str, Any]:
    assert path.exists(), f"{path} was not written"
    document: dict[str, Any] = json.loads(path.read_text())
    machine = document["machine"]
    assert machine["nproc"] >= 1 and machine["cpu_model"] and machine["numpy"]
    assert machine["blas_runtime"], "no BLAS library reported"
    return document


def positive(value: Any) -> bool:
    return isinstance(value, int | float) and math.isfinite(value) and value > 0


def test_quick_benchmarks_write_their_ratios(tmp_path: Path) -> None:
    out = run_module("benchmarks.all", "--quick", "--skip", "engine", "--output-dir", str(tmp_path))
    assert "# goals" in out

    convergence = load(tmp_path / "convergence.json")
    (task,) = convergence["tasks"]
    assert task["task"] == "seed-logreg" and task["metric"] == "gap"
    labels = {run["label"] for run in task["runs"]}
    assert labels == {
        "FedAvg",
        "FedProx",
        "FedADMM",
        "FedADMM (defaults)",
        "FedADMM (defaults), local tuned",
        "FedADMM-default (untuned)",
        "FedADMM-RB (untuned)",
        "FedADMM alpha=1.6",
        "FedADMM alpha=1.6-RB (untuned)",
        "SCAFFOLD",
        "FedDyn",
        "FedADMM prox form",
        "FedADMM prox form (untuned)",
        "FedADMM linearized, convex recipe",
        "FedADMM linearized, convex recipe (untuned)",
    }
    assert set(task["peers"]) == labels
    scaffold = [run for run in task["runs"] if run["label"] == "SCAFFOLD"]
    assert {run["server_step"] for run in scaffold} == {1.0, 1.6}  # eta_g is on its grid
    for entry in task["peers"].values():
        assert entry["rounds"] is None or positive(entry["bytes_of_fastest"]), entry
    relaxed = [run for run in task["runs"] if run["label"].startswith("FedADMM alpha=")]
    assert {run["relaxation"] for run in relaxed} == {1.6}
    assert task["info"]["optimum_grad_norm"] < 1e-6
    for key in (
        "fedadmm_over_best_baseline",
        "untuned_rb_over_tuned_fedadmm",
        "relaxed_fedadmm_over_best_baseline",
        "relaxed_untuned_rb_over_tuned",
        "defaults_over_best_baseline",
        "defaults_over_best_peer",
        "local_tuned_defaults_over_best_peer",
    ):
        entry = task["summary"][key]
        assert positive(entry["value"]) or positive(entry["bound"]), entry
    for run in task["runs"]:
        assert 1 <= run["rounds_run"] <= task["max_rounds"]
        assert run["stop_reason"] in {"all_targets", "max_rounds", "plateau", "diverged", "stalled"}

    server = load(tmp_path / "server_cost.json")
    assert len(server["results"]) == 4
    for row in server["results"]:
        for key in ("time_ratio", "wall_time_ratio"):
            assert positive(row[key]), (key, row)
        # Replies are kept as views, not copied: the peak above the state may be ~0.
        assert row["fedadmm_peak_extra_models"] >= 0
        # the state of every known client is cached: N x (w_i, y_i)
        model = row["model_bytes"]
        assert row["cached_state_bytes"] >= 2 * row["num_clients"] * model
        assert "aggregate_fit" in row["fedadmm_profile_seconds"]

    loop = load(tmp_path / "client_loop.json")
    assert len(loop["results"]) == 3
    for row in loop["results"]:
        assert positive(row["exact_step_ratio"]) and positive(row["gradient_step_ratio"])

    summary = load(tmp_path / "all.json")
    assert set(summary["seconds_per_benchmark"]) == {
        "client_loop",
        "server_cost",
        "client_duals_cost",
        "convergence",
    }
    duals = load(tmp_path / "client_duals_cost.json")
    assert all(positive(row["time_ratio"]) for row in duals["results"])
    goals = summary["goals"]
    assert any(g["goal"].startswith("FedADMM rounds / best-tuned baseline") for g in goals)
    assert all(g["met"] in (True, False, None) for g in goals)


def test_server_cost_skips_and_reports_infeasible_configurations(tmp_path: Path) -> None:
    out_file = tmp_path / "server.json"
    out = run_module(
        "benchmarks.server_cost",
        "--quick",
        "--memory-budget-gib",
        "0.01",
        "--output",
        str(out_file),
    )
    document = load(out_file)
    # 1e4 x 10 needs ~6 MiB and runs; everything larger exceeds 10 MiB and is listed
    assert [(r["num_parameters"], r["num_clients"]) for r in document["results"]] == [(10**4, 10)]
    skipped = {(s["num_parameters"], s["num_clients"]) for s in document["skipped"]}
    assert skipped == {(10**4, 100), (10**5, 10), (10**5, 100)}
    assert all(
        s["state_bytes"] == (2 * s["num_clients"] + 3) * s["num_parameters"] * 8
        for s in document["skipped"]
    )
    assert "skipped P=1e+05 N=100" in out


def test_unknown_benchmark_name_is_rejected() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.all", "--quick", "--skip", "nope"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode != 0 and "unknown benchmark" in done.stderr


@pytest.mark.ray
def test_engine_quick_reports_seconds_per_round(tmp_path: Path) -> None:
    out_file = tmp_path / "engine.json"
    run_module("benchmarks.engine", "--quick", "--output", str(out_file), timeout=600)
    document = load(out_file)
    assert positive(document["ratio"])
    assert {run["strategy"] for run in document["runs"]} == {"FedAvg", "FedADMM"}
    for run in document["runs"]:
        assert len(run["round_seconds"]) == document["rounds"]
        assert all(positive(t) for t in run["round_seconds"])


def test_scale_quick_reports_times_state_and_ratios_per_strategy(tmp_path: Path) -> None:
    """The driver part, as a user runs it. Its Ray part is the engine smoke run of
    `test_engine_quick_reports_seconds_per_round` again (the same `timed_run_simulation`
    in a subprocess per strategy), so it is skipped here and its table checked below."""
    out_file = tmp_path / "scale.json"
    args = ("--quick", "--skip-engine", "--output", str(out_file), "--plot-dir", str(tmp_path))
    out = run_module("benchmarks.scale", *args)
    assert "aggregate_fit ms" in out
    document = load(out_file)
    strategies = {"FedAvg", "FedADMM", "FedADMMClientDuals"}
    rows = document["driver"]
    assert {row["strategy"] for row in rows} == strategies
    assert {row["num_clients"] for row in rows} == {20, 100}
    for row in rows:
        for key in ("mean_round_seconds", "mean_aggregate_fit_seconds", "round_ratio_vs_fedavg"):
            assert positive(row[key]), (key, row)
        assert row["retained_state_bytes"] >= 0
    assert (tmp_path / "scale_driver.png").stat().st_size > 0
    assert "engine" not in document


def test_scale_engine_part_divides_each_run_by_fedavg_of_its_fraction(monkeypatch) -> None:
    """`benchmarks.scale_engine.engine_part` with its subprocess runs stubbed: one run
    per (fraction, strategy), each divided by FedAvg's run of the same fraction."""
    from benchmarks import scale_engine
    from benchmarks.scale import FRACTIONS, STRATEGIES

    seconds = {"FedAvg": 0.5, "FedADMM": 0.6, "FedADMMClientDuals": 0.75}

    def spawn(name: str, fraction: float, rounds: int, supernodes: int) -> dict[str, Any]:
        mean = seconds[name] * (2.0 if fraction == FRACTIONS[-1] else 1.0)
        return {
            "strategy": name,
            "fraction": fraction,
            "mean_round_seconds": mean,
            "process_seconds": 1.0,
            "server_max_rss_mib": 100.0,
        }

    monkeypatch.setattr(scale_engine, "spawn", spawn)
    part = scale_engine.engine_part(quick=False)
    assert part["supernodes"] == scale_engine.NUM_SUPERNODES
    runs = part["runs"]
    assert [(r["fraction"], r["strategy"]) for r in runs] == [
        (f, name) for f in FRACTIONS for name in STRATEGIES
    ]
    for run in runs:
        assert run["ratio_vs_fedavg"] == pytest.approx(seconds[run["strategy"]] / 0.5)


def test_cnn_quick_runs_the_example_and_keeps_every_round(tmp_path: Path) -> None:
    """`benchmarks.cnn` (the CNN tables of the README and docs/torch.md) runs the example
    in process and records a run that fails as NaN: a harness error would look like a
    diverged strategy, so two rows that train must give finite accuracies every round."""
    pytest.importorskip("torch")
    out_file = tmp_path / "cnn.json"
    rows = "FedADMM (defaults), TorchADMM;FedADMMClientDuals linearized, TorchADMM"
    args = ("--quick", "--tasks", "cnn-sgd-partial", "--rows", rows, "--output", str(out_file))
    run_module("benchmarks.cnn", *args)
    (task,) = load(out_file)["tasks"]
    assert task["task"] == "cnn-sgd-partial" and task["rounds"] == 4  # 2 quick rounds, x 2
    assert list(task["rows"]) == rows.split(";")
    for row in task["rows"].values():
        (run,) = row["runs"]
        assert run["seed"] == 0 and len(run["accuracies"]) == 5  # the initial model too
        assert (
            all(0.0 <= a <= 1.0 for a in run["accuracies"])
            and run["final"] == run["accuracies"][-1]
        )


def test_torch_step_quick_reports_its_ratios(tmp_path: Path) -> None:
    out_file = tmp_path / "torch_step.json"
    out = run_module("benchmarks.torch_step", "--quick", "--output", str(out_file))
    assert "prox / bare" in out
    document = load(out_file)
    assert [row["case"].split(",")[0] for row in document["results"]] == [
        "logistic",
        "softmax",
        "cnn (BatchNorm)",
    ]
    for row in document["results"]:
        for key in ("bare_us_per_step", "prox_us_per_step", "prox_ratio", "loss_ratio"):
            assert positive(row[key]), (key, row)


def test_bytes_on_the_wire_are_counted_per_strategy() -> None:
    # One float64 (20,) array is 20 * 8 bytes plus a 128-byte .npy header; every one
    # of the 10 clients receives and returns one such block a round (FedAvg, FedDyn),
    # SCAFFOLD two (model and control variate) each way.
    sys.path.insert(0, str(ROOT))
    from benchmarks.convergence import run_one
    from benchmarks.problems import build_problems

    (problem,) = build_problems(["seed-logreg"], quick=True)
    block = 20 * 8 + 128
    config = {"lr": 1.0, "steps": 20, "penalty": 0.1}
    for algorithm, blocks in (("FedAvg", 1), ("FedDyn", 1), ("SCAFFOLD", 2)):
        run = run_one(problem, algorithm, config)
        rounds = run["rounds_to"]["0.001"]
        assert rounds is not None, run
        assert run["bytes_to"]["0.001"] == rounds * 10 * 2 * blocks * block, algorithm
    # FedADMM()'s linearized form: z and y_i down, w_i up (3 copies a round)
    run = run_one(problem, "FedADMM (defaults)", {**config, "penalty": 0.0})
    rounds = run["rounds_to"]["0.001"]
    assert rounds is not None, run
    assert run["bytes_to"]["0.001"] == rounds * 10 * 3 * block


def test_defaults_runs_each_candidate_on_the_cnn_task(tmp_path: Path) -> None:
    """`benchmarks.defaults`' CNN columns run the candidate's FedADMM, not the example's
    strategy: the prox form and the linearized defaults give different curves."""
    pytest.importorskip("torch")
    from benchmarks import cnn
    from benchmarks.defaults import cnn_strategy
    from flwr_admm import FedADMM

    cnn.example_on_path()
    from quickstart_admm.task import Settings

    settings = Settings.from_run_config(cnn.run_config({"fraction-train": 0.3}))
    strategy = cnn_strategy({"form": "prox"})(settings)
    assert strategy.admm_settings.describe() == FedADMM(form="prox").admm_settings.describe()
    assert strategy.fraction_train == 0.3 and strategy.min_available_nodes == 10
    out_file = tmp_path / "defaults.json"
    args = ("--quick", "--tasks", "cnn-sgd-partial", "--candidates", "defaults,prox defaults")
    run_module("benchmarks.defaults", *args, "--cnn-seeds", "0", "--output", str(out_file))
    document = load(out_file)
    assert document["runs"] == []  # no convex task asked
    rows = {row["label"]: row for row in document["cnn_runs"]}
    assert sorted(rows) == ["defaults", "prox defaults"]
    curves = []
    for row in rows.values():
        (run,) = row["runs"]
        assert len(run["accuracies"]) == 5 and all(0 <= a <= 1 for a in run["accuracies"])
        assert row["mean_final"] == run["final"] == run["accuracies"][-1]
        curves.append(run["accuracies"])
    assert curves[0] != curves[1]


def _track(gaps: list[float]) -> tuple[int, str]:
    """Feed `gaps` round by round to the benchmarks' tracker; return rounds seen, stop."""
    from benchmarks.convergence import Tracker, _StopRunError
    from benchmarks.problems import Problem

    values = iter(gaps)
    problem = Problem(
        name="sequence",
        task=None,  # type: ignore[arg-type]
        grid=None,  # type: ignore[arg-type]
        max_rounds=len(gaps),
        steps_key="local_steps",
        batch_size=None,
        defaults={},
        targets=(1e-6,),
        metric="gap",
        evaluate=lambda z: next(values),
    )
    tracker = Tracker(problem)
    try:
        for server_round in range(1, len(gaps) + 1):
            tracker(server_round, [np.full(2, float(server_round))], {})
    except _StopRunError:
        pass
    return len(tracker.values), tracker.stop_reason


def test_the_plateau_stop_waits_out_a_flat_stretch_that_ends():
    """A run whose best gap stays at 6.5e-5 for 30 rounds and then falls to 1e-6 (seed-
    logreg with 3 of 10 clients and a damped dual step did) is not a plateau; a best
    gap flat for good (FedAvg's bias) is, well inside a 200-round budget."""
    falling = [1e-2 / 2**k for k in range(8)]  # to 7.8e-5
    stretch = [6.5e-5 * (1.5 if k % 2 else 1.0) for k in range(30)]
    on_its_way = falling + stretch + [6e-5 / 2**k for k in range(1, 12)]
    seen, reason = _track(on_its_way)
    assert reason == "all_targets" and seen == len(falling) + len(stretch) + 6  # 9.4e-7
    biased = falling + [7.8e-5] * 192
    seen, reason = _track(biased)
    assert reason == "plateau" and seen < 100
