"""The simulations app's run config (simulations/admm_app/run_config.py).

References: the app's own pyproject.toml, whose [tool.flwr.app] config must be the
validated DEFAULTS; hand-written expectations for every rejected key and value; and the
ServerConfig that server_fn hands to Flower (round-timeout).
"""

from __future__ import annotations

import tomllib

import pytest
from flwr.common import Context, RecordDict

from simulations.admm_app.evaluation import get_task
from simulations.admm_app.message_server import build_message_strategy
from simulations.admm_app.recorder import RunRecorder
from simulations.admm_app.run_config import DEFAULTS, api_of, fit_config, parse_run_config
from simulations.admm_app.server_app import server_fn
from simulations.launcher import APP_DIR

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
        ({"api": "grpc"}, ["'api'", "'message'", "'legacy'", "'grpc'"]),
        ({"api": 1}, ["'api'", "'message'", "'legacy'"]),
        ({"server-learning-rate": 0.0}, ["'server-learning-rate'", "> 0"]),
        ({"feddyn-alpha": -1.0}, ["'feddyn-alpha'", "> 0"]),
        (
            {"api": "legacy", "strategy": "scaffold", "framework": "torch"},
            ["'framework'", "'numpy'", "'torch'"],
        ),
        (
            {"api": "message", "strategy": "feddyn", "framework": "torch"},
            ["'framework'", "'numpy'", "'torch'"],
        ),
        ({"task": "nope"}, ["'task'", "seed-logreg"]),
        ({"num-server-rounds": 0}, ["'num-server-rounds'", ">= 1"]),
        ({"num-server-rounds": 2.5}, ["'num-server-rounds'"]),
        ({"rho": -1.0}, ["'rho'", ">= 0"]),
        ({"rho-schedule": "cosine"}, ["'rho-schedule'", "residual-balancing"]),
        ({"relaxation": 2.0}, ["'relaxation'", "(0, 2)"]),
        ({"round-timeout": -1.0}, ["'round-timeout'", "0 = no limit"]),
        (
            {
                "api": "legacy",
                "strategy": "fedadmm-client-duals",
                "rho-schedule": "residual-balancing",
            },
            ["'rho-schedule'", "'constant'"],
        ),
        (
            {"api": "legacy", "strategy": "fedadmm-client-duals", "relaxation": 1.6},
            ["'relaxation'", "must be 1"],
        ),
        ({"api": "legacy", "strategy": "fedadmm-client-duals", "rho": 0.0}, ["'rho'", "> 0"]),
        ({"relaxation": 0.0}, ["'relaxation'", "(0, 2)"]),
        ({"local-init": "zero"}, ["'local-init'", "previous", "center", "consensus"]),
        ({"local-init": "consensus"}, ["'local-init'", "fedadmm-client-duals", "'fedadmm'"]),
        (
            {"local-init": "consensus", "framework": "torch"},
            ["'local-init'", "'fedadmm'", "server-held", "'torch'"],
        ),
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
        ({"key-binding": "trust"}, ["'key-binding'", "node", "reported"]),
        ({"form": "scaffnew"}, ["'form'", "prox", "linearized-convex"]),
        ({"form": "linearized", "strategy": "fedavg"}, ["'form'", "fedadmm", "'prox'"]),
        ({"form": "linearized", "rho": 0.5}, ["'rho'", "form='linearized'", "0.1"]),
        ({"form": "linearized", "dual-step": 0.5}, ["'dual-step'", "fixed by"]),
        ({"dual-step": "fast"}, ["'dual-step'", "(0, 1]", '"adaptive"']),
        ({"form": "linearized", "dual-step": "adaptive"}, ["'dual-step'", "fixed by"]),
        ({"form": "linearized-convex", "relaxation": 1.6}, ["'relaxation'", "fixed by"]),
        (
            {"form": "linearized-convex", "strategy": "fedadmm-client-duals"},
            ["'form'", "server-held", "form='linearized'"],
        ),
    ],
)
def test_run_config_errors_name_the_key_and_the_allowed_values(override, words):
    with pytest.raises(ValueError) as info:
        parse_run_config(override)
    for word in words:
        assert word in str(info.value)


def test_local_init_consensus_is_accepted_for_torch_clients_with_client_held_duals():
    # they receive z, and TorchADMM.start(init="consensus") starts there
    config = {"local-init": "consensus", "strategy": "fedadmm-client-duals", "framework": "torch"}
    settings = parse_run_config(config)
    assert (settings.local_init, settings.framework) == ("consensus", "torch")


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


# ----------------------------------------------------- run config in the server app


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


@pytest.mark.parametrize("strategy", ["fedadmm", "fedadmm-client-duals", "scaffold", "feddyn"])
@pytest.mark.parametrize("key_binding", ["node", "reported"])
def test_key_binding_reaches_the_admm_strategies(strategy, key_binding):
    context = Context(
        run_id=0,
        node_id=0,
        node_config={},
        state=RecordDict(),
        run_config={
            "api": "legacy",  # key-binding=reported exists on the legacy API only
            "strategy": strategy,
            "key-binding": key_binding,
            "num-server-rounds": 2,
        },
    )
    inner = server_fn(context).strategy.inner
    assert inner.key_binding == key_binding
    # server_round is the strategy's own fit-config key: the app leaves it out
    assert "server_round" not in inner.on_fit_config_fn(1)


@pytest.mark.parametrize("strategy", ["fedadmm", "fedadmm-client-duals", "scaffold", "feddyn"])
@pytest.mark.parametrize("key_binding", ["node", "reported"])
def test_key_binding_reaches_the_message_api_strategies(strategy, key_binding, tmp_path):
    settings = parse_run_config(
        {"api": "message", "strategy": strategy, "key-binding": key_binding}
    )
    task = get_task(settings.task, settings.seed, settings.task_options())
    recorder = RunRecorder(tmp_path, strategy, {}, 1)
    assert build_message_strategy(settings, task, recorder).key_binding == key_binding


@pytest.mark.parametrize("api", ["message", "legacy"])
def test_api_is_parsed_for_every_strategy_it_serves(api):
    strategies = ["fedadmm", "fedadmm-client-duals", "fedavg", "fedprox", "fednova"]
    strategies += ["scaffold", "feddyn"]  # no strategy is legacy-only
    for strategy in strategies:
        assert parse_run_config({"api": api, "strategy": strategy}).api == api
    assert api_of({"api": api}) == api
    assert api_of({}) == DEFAULTS["api"] == parse_run_config({}).api == "message"
