"""The tools over finished runs: report, compare and diagnose (simulations/).

References: hand-built result documents whose rounds to a gap of 1e-3 / 1e-6 and to the
accuracy target are counted by hand (summary_markdown, plot_all, check_result);
compare's exit codes, TOML overrides and presets, parsed by parse_run_config; and, for
diagnose on seed-logreg, the algebra of update cosines (symmetric, unit diagonal).
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from simulations import compare, diagnose
from simulations.admm_app.run_config import parse_run_config
from simulations.report import RunResult, check_result, plot_all, summary_markdown

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
