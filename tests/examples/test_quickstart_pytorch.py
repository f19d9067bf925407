"""examples/quickstart-pytorch: one ``flwr run`` in Flower's engine, every handler in process.

The engine test runs compare.py's main for FedADMM, 2 rounds, 10 nodes, on the session's
private SuperLink (tests/conftest.py: own FLWR_HOME and port, stopped by PID). The
other strategies and the FedProx-style handler under FedADMM run through
`flwr_admm.serverapp.testing.InProcessGrid`, the app's own ``@app.main()`` included
(no Ray): each must train, leave its own client state and give its own trajectory;
SCAFFOLD's control variate must be option II's under plain SGD; a crashing ClientApp
or a non-finite model must fail the run.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import math
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, Context, Message, RecordDict
from quickstart_admm import client_app, server_app
from quickstart_admm.task import Settings, central_split, initial_model, node_rows, partitioner

from flwr_admm.protocol import (
    DUALS_PENDING_U,
    DUALS_PENDING_W,
    DUALS_STATE_U,
    DUALS_STATE_W,
    MESSAGE_STATE_W,
    SCAFFOLD_CONTROL_RECORD,
)
from flwr_admm.serverapp.testing import InProcessGrid, flower_task_identity
from simulations.launcher import LocalFlower

QUICKSTART = Path(__file__).resolve().parents[2] / "examples" / "quickstart-pytorch"
PYPROJECT = tomllib.loads((QUICKSTART / "pyproject.toml").read_text())
CONFIG: dict[str, Any] = PYPROJECT["tool"]["flwr"]["app"]["config"]
RUNS = [
    ("fedavg", "torchadmm"),
    ("fedprox", "torchadmm"),
    ("fedadmm", "torchadmm"),
    ("fedadmm", "fedprox"),
    ("fedadmm-prox", "torchadmm"),
    ("fedadmm-client-duals", "torchadmm"),
    ("scaffold", "torchadmm"),
    ("feddyn", "torchadmm"),
]
STATE = {  # what each run leaves in every node's context.state
    ("fedavg", "torchadmm"): set(),
    ("fedprox", "torchadmm"): set(),
    ("fedadmm", "torchadmm"): set(),  # the default, linearized form starts at z
    ("fedadmm", "fedprox"): set(),  # the stock FedProx handler keeps nothing
    ("fedadmm-prox", "torchadmm"): {MESSAGE_STATE_W},  # TorchADMM's warm start
    # the committed and the pending (not yet acknowledged) w_i, u_i
    ("fedadmm-client-duals", "torchadmm"): {
        DUALS_STATE_W,
        DUALS_STATE_U,
        DUALS_PENDING_W,
        DUALS_PENDING_U,
    },
    ("scaffold", "torchadmm"): {client_app.SCAFFOLD_C},
    ("feddyn", "torchadmm"): {client_app.FEDDYN_GRAD},
}


class Recording:
    """A ClientApp stand-in that records every (message, reply) pair by partition."""

    def __init__(self) -> None:
        self.calls: dict[int, list[tuple[Message, Message]]] = {}

    def __call__(self, message: Message, context: Context) -> Message:
        reply = client_app.app(message, context)
        self.calls.setdefault(int(context.node_config["partition-id"]), []).append((message, reply))
        return reply


def run_app(tmp_path: Path, rounds: int = 2, app: Any = None, **overrides: Any) -> Any:
    """Run the app's ``main`` on an in-process grid; return (document, grid)."""
    config = {**CONFIG, **overrides, "num-server-rounds": rounds, "output-dir": str(tmp_path)}
    grid = InProcessGrid(app or client_app.app, config["num-partitions"])
    for context in grid.contexts.values():
        context.run_config = dict(config)
    context = Context(run_id=1, node_id=0, node_config={}, state=RecordDict(), run_config=config)
    path = tmp_path / f"{Settings.from_run_config(config).run_name}.json"
    with flower_task_identity(grid.run.run_id):
        try:
            server_app.main(grid, context)
        finally:
            document = json.loads(path.read_text()) if path.exists() else None
    return document, grid


def test_settings_are_the_pyproject_keys() -> None:
    assert "federations" not in PYPROJECT["tool"]["flwr"]
    settings = Settings.from_run_config(CONFIG)
    assert {k.replace("_", "-") for k in vars(settings)} == set(CONFIG)
    assert (settings.strategy, settings.handler, settings.num_server_rounds) == (
        "fedadmm",
        "torchadmm",
        30,
    )
    with pytest.raises(ValueError, match="strategy: must be one of"):
        Settings.from_run_config({**CONFIG, "strategy": "fedsgd"})
    with pytest.raises(ValueError, match="'seed': missing"):
        Settings.from_run_config({k: v for k, v in CONFIG.items() if k != "seed"})
    with pytest.raises(ValueError, match="batch-norm: not supported with strategy 'scaffold'"):
        Settings.from_run_config({**CONFIG, "strategy": "scaffold", "batch-norm": True})
    for bad in (0.0, 1.5, "fixed", True):
        with pytest.raises(ValueError, match="dual-step: must be"):
            Settings.from_run_config({**CONFIG, "dual-step": bad})


def test_the_dual_step_key_reaches_the_strategy() -> None:
    """``"adaptive"`` is FedADMM's default rule; a number is a fixed gamma, in either form."""
    from flwr_admm.core import AdaptiveDualStep

    settings = Settings.from_run_config(CONFIG)
    assert server_app.make_strategy(settings).admm_settings.dual_step == AdaptiveDualStep()
    fixed = Settings.from_run_config({**CONFIG, "dual-step": 0.2})
    assert server_app.make_strategy(fixed).admm_settings.dual_step == 0.2
    linearized = Settings.from_run_config(
        {**CONFIG, "dual-step": 0.5, "strategy": "fedadmm-linearized"}
    )
    assert server_app.make_strategy(linearized).admm_settings.dual_step == 0.5


def test_the_split_is_fixed_and_covers_the_federated_rows() -> None:
    rows = [node_rows(i, 10, 0.1, 0) for i in range(10)]
    every = np.concatenate([np.concatenate(pair) for pair in rows])
    assert len(every) == len(set(every.tolist())) == 1437  # 80% of 1797 digits
    assert all(len(train) + len(val) >= 10 for train, val in rows)
    partitioner.cache_clear()  # as a fresh ClientApp process would rebuild it
    central_split.cache_clear()
    again = [node_rows(i, 10, 0.1, 0) for i in range(10)]
    for (train, val), (train2, val2) in zip(rows, again, strict=True):
        assert np.array_equal(train, train2) and np.array_equal(val, val2)
    assert not np.array_equal(node_rows(0, 10, 0.1, 1)[0], rows[0][0])  # the seed matters


def test_every_strategy_trains_with_its_own_handler(tmp_path: Path) -> None:
    losses = {}
    for strategy, handler in RUNS:
        document, grid = run_app(tmp_path, strategy=strategy, handler=handler)
        assert document["status"] == "completed", document["reason"]
        accuracy = [r["accuracy"] for r in document["rounds"]]
        assert len(accuracy) == 3 and all(math.isfinite(a) for a in accuracy), accuracy
        for context in grid.contexts.values():
            assert set(context.state.array_records) == STATE[(strategy, handler)]
        losses[(strategy, handler)] = document["rounds"][-1]["loss"]
        assert losses[(strategy, handler)] != document["rounds"][0]["loss"]  # it trained
    # FedADMM() over the stock FedProx handler, every node replying, is Flower's FedProx
    # (mu 0.1): the stock replies are folded with rho_i = mu and their duals held at 0.
    # Flower sums the replies in its sample's order (Python's random), in float32: the
    # two agree to rounding, not bit for bit.
    swap = losses.pop(("fedadmm", "fedprox"))
    assert swap == pytest.approx(losses[("fedprox", "torchadmm")], rel=1e-5), (swap, losses)
    assert len(set(losses.values())) == len(RUNS) - 1, losses  # the others all differ


def test_a_fraction_of_the_nodes_trains_under_client_held_linearized_duals(
    tmp_path: Path,
) -> None:
    """fraction-train 0.3: 3 of 10 nodes a round, each keeping its own y_i; with
    identify-nodes each node names its partition-id once, before the first sample."""
    recording = Recording()
    document, grid = run_app(
        tmp_path,
        app=recording,
        strategy="fedadmm-client-duals-linearized",
        **{"fraction-train": 0.3, "identify-nodes": True},
    )
    assert document["status"] == "completed", document["reason"]
    rounds: dict[str, list[int]] = {}
    for partition, calls in recording.calls.items():
        query, answer = calls[0]
        assert query.metadata.message_type == "query"
        assert dict(answer.content.metric_records["admm-identity"]) == {"partition-id": partition}
        assert all(m.metadata.message_type != "query" for m, _ in calls[1:])
        for message, reply in calls[1:]:
            if message.metadata.message_type == "train":
                assert message.content.config_records["config"]["admm-form"] == "linearized"
                assert "admm-step-budget" in reply.content.metric_records["metrics"]
                rounds.setdefault(message.metadata.group_id, []).append(partition)
    assert sorted(rounds) == ["1", "2"] and all(len(p) == 3 for p in rounds.values()), rounds
    trained = {p for partitions in rounds.values() for p in partitions}
    for context in grid.contexts.values():
        kept = set(context.state.array_records)
        partition = int(context.node_config["partition-id"])
        assert bool(kept) == (partition in trained), (partition, kept)
    assert document["rounds"][-1]["loss"] != document["rounds"][0]["loss"]
    for bad in (0.0, 1.5, True):
        with pytest.raises(ValueError, match="fraction-train: must be"):
            Settings.from_run_config({**CONFIG, "fraction-train": bad})
    with pytest.raises(ValueError, match="identify-nodes: must be true or false"):
        Settings.from_run_config({**CONFIG, "identify-nodes": "yes"})


def test_scaffold_control_is_option_two_under_plain_sgd(tmp_path: Path) -> None:
    """c_i+ - c_i = -c + (x - y_i) / (K lr) with K the steps, lr the SGD step."""
    recording = Recording()
    document, _ = run_app(tmp_path, app=recording, strategy="scaffold", momentum=0.0)
    assert document["status"] == "completed"
    lr, batch = CONFIG["learning-rate"], CONFIG["batch-size"]
    for partition, calls in recording.calls.items():
        steps = math.ceil(len(node_rows(partition, 10, 0.1, 0)[0]) / batch)
        trains = [(m, r) for m, r in calls if m.metadata.message_type == "train"]
        assert len(trains) == 2
        for message, reply in trains:
            sent, received = message.content.array_records, reply.content.array_records
            x, c = sent["arrays"], sent[SCAFFOLD_CONTROL_RECORD]
            y, change = received["arrays"], received[SCAFFOLD_CONTROL_RECORD]
            for name in x:
                expected = -c[name].numpy() + (x[name].numpy() - y[name].numpy()) / (steps * lr)
                np.testing.assert_allclose(change[name].numpy(), expected, rtol=1e-3, atol=1e-4)


def test_a_crashing_client_app_fails_the_run(tmp_path: Path) -> None:
    config = {**CONFIG, "output-dir": str(tmp_path), "num-server-rounds": 2}
    grid = InProcessGrid(client_app.app, 10)  # contexts keep an empty run config: every node raises
    context = Context(run_id=1, node_id=0, node_config={}, state=RecordDict(), run_config=config)
    with (
        flower_task_identity(grid.run.run_id),
        pytest.raises(RuntimeError, match="10 error replies"),
    ):
        server_app.main(grid, context)
    document = json.loads((tmp_path / "fedadmm-seed0.json").read_text())
    assert document["status"] == "failed" and "run config 'num-server-rounds'" in document["reason"]


def test_a_non_finite_model_fails_the_run(tmp_path: Path) -> None:
    settings = Settings.from_run_config({**CONFIG, "output-dir": str(tmp_path)})
    evaluation = server_app.CentralEvaluation(settings)
    arrays = ArrayRecord(initial_model(settings).state_dict())
    assert float(evaluation(0, arrays)["accuracy"]) > 0  # type: ignore[arg-type]
    broken = ArrayRecord(
        {k: Array(np.full(a.shape, np.nan, np.float32)) for k, a in arrays.items()}
    )
    with pytest.raises(RuntimeError, match="round 1: the global model is not finite"):
        evaluation(1, broken)
    document = json.loads(evaluation.path.read_text())
    assert document["status"] == "failed"
    assert document["rounds"][1]["accuracy"] is None
    state = initial_model(settings).state_dict()
    state["fc3.weight"] *= 1e38  # finite weights, logits overflow: a diverged model
    with pytest.raises(RuntimeError, match="round 2: the global central loss is not finite"):
        evaluation(2, ArrayRecord(state))
    assert json.loads(evaluation.path.read_text())["rounds"][2]["loss"] is None


def load_compare() -> Any:
    """examples/quickstart-pytorch/compare.py as a module (a script, not a package)."""
    name = "quickstart_compare"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, QUICKSTART / "compare.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module  # dataclasses look their module up there
        spec.loader.exec_module(module)
    return sys.modules[name]


@pytest.mark.ray
def test_flwr_run_fedadmm_two_rounds(
    tmp_path: Path, local_flower: Any, monkeypatch: pytest.MonkeyPatch, capsys: Any
) -> None:
    """compare.py's main: one ``flwr run`` of FedADMM, 2 rounds, 10 nodes, on the
    session's SuperLink (tests/conftest.py) instead of a private one of its own."""
    compare = load_compare()
    # its own runtime is a LocalFlower whose processes import flwr_admm from the checkout
    own = compare.QuickstartFlower(home=tmp_path / "unused")
    assert isinstance(own, LocalFlower) and own.env["PYTHONPATH"] == str(compare.ROOT)
    monkeypatch.setattr(compare, "QuickstartFlower", lambda: contextlib.nullcontext(local_flower))
    output = tmp_path / "outputs"
    argv = ["--strategies", "fedadmm", "--seeds", "0", "--rounds", "2"]
    code = compare.main([*argv, "--output-dir", str(output)])
    done = capsys.readouterr()
    log = output / "logs" / "fedadmm-seed0.log"
    assert code == 0, done.out + done.err + (log.read_text()[-3000:] if log.exists() else "")
    document = json.loads((output / "fedadmm-seed0.json").read_text())
    assert document["status"] == "completed"
    assert document["settings"]["strategy"] == "fedadmm"
    accuracy = [r["accuracy"] for r in document["rounds"]]
    assert len(accuracy) == 3 and all(math.isfinite(a) for a in accuracy), accuracy
    assert "| fedadmm |" in done.out
    assert (output / "quickstart_pytorch.png").stat().st_size > 0


def test_compare_reports_existing_records_without_running(tmp_path: Path) -> None:
    """--report-only: the table and plot of the records in --output-dir; a failed one fails."""
    rounds = [{"round": k, "accuracy": 0.5 + 0.2 * k, "loss": 1.0, "seconds": k} for k in range(3)]
    for name, status in (("fedavg", "completed"), ("fedadmm", "failed")):
        document = {"run": name, "status": status, "reason": "diverged", "rounds": rounds}
        (tmp_path / f"{name}-seed0.json").write_text(json.dumps(document))
    command = [sys.executable, str(QUICKSTART / "compare.py"), "--report-only", "--seeds", "0"]
    command += ["--rounds", "2", "--strategies", "fedavg,fedadmm", "--output-dir", str(tmp_path)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 1, done.stderr  # the failed record
    assert "| fedavg | 0.900 | 2 |" in done.stdout  # 0.5, 0.7, 0.9: 90 % at round 2
    assert "FAILED fedadmm seed 0: failed: diverged" in done.stderr
    assert (tmp_path / "quickstart_pytorch.png").exists()
