"""simulations/fast_polls: Flower's 3 s polls shortened in test deployments, nothing else."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys

import pytest

from simulations.federation import FAST_POLLS, LoopbackDeployment


def _shim():
    spec = importlib.util.spec_from_file_location(
        "fast_polls_shim", FAST_POLLS / "sitecustomize.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # no FLWR_ADMM_POLL_SECONDS here: installs nothing
    return module


def _call_from(module_name, function, *args):
    """Call `function(*args)` from a frame whose module is `module_name`."""
    scope = {"__name__": module_name, "function": function, "args": args}
    exec("function(*args)", scope)


def test_only_the_3_s_sleeps_of_flowers_polling_modules_are_shortened():
    shim = _shim()
    asked = []
    sleep = shim.poll_sleep(0.2, asked.append)
    _call_from("flwr.superlink.grid.http_grid", sleep, 3)  # the ServerApp's grid
    _call_from("flwr.supernode.start_client_internal", sleep, 3)  # an idle SuperNode
    _call_from("flwr.supernode.start_client_internal", sleep, 0.5)  # another wait there
    _call_from("flwr.server.heartbeat", sleep, 3)  # another module's 3 s
    _call_from("flwr_admm.rounds.layer", sleep, 3)
    assert asked == [0.2, 0.2, 0.5, 3, 3]


def test_a_process_started_with_the_variable_has_the_short_polls():
    env = {**os.environ, "PYTHONPATH": str(FAST_POLLS), "FLWR_ADMM_POLL_SECONDS": "0.25"}
    code = "import time; print(time.sleep.__qualname__)"
    shown = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    )
    assert shown.stdout.strip() == "poll_sleep.<locals>.sleep_polls"
    env.pop("FLWR_ADMM_POLL_SECONDS")  # the directory alone changes nothing
    shown = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    )
    assert shown.stdout.strip() == "sleep"


def test_the_deployment_sets_it_up_only_when_asked(tmp_path):
    plain = LoopbackDeployment(1, home=tmp_path / "plain").env(tmp_path)
    fast = LoopbackDeployment(1, home=tmp_path / "fast", poll_seconds=0.2).env(tmp_path)
    assert "FLWR_ADMM_POLL_SECONDS" not in plain
    assert str(FAST_POLLS) not in plain.get("PYTHONPATH", "")
    assert fast["FLWR_ADMM_POLL_SECONDS"] == "0.2"
    assert fast["PYTHONPATH"].split(os.pathsep)[0] == str(FAST_POLLS)


@pytest.mark.parametrize("bad", [0, -1.0, 3.5, "0.2", float("nan"), True])
def test_a_bad_poll_interval_is_refused_by_name(tmp_path, bad):
    with pytest.raises(ValueError, match="poll_seconds"):
        LoopbackDeployment(1, home=tmp_path, poll_seconds=bad)


def test_flowers_polling_modules_still_sleep_3_s():
    """The shim matches Flower 1.42's literal ``time.sleep(3)``: a Flower whose polls
    change must fail here, not leave the deployments silently on the slow polls."""
    shim = _shim()
    for name in sorted(shim.POLLING_MODULES):
        spec = importlib.util.find_spec(name)
        assert spec is not None and spec.origin is not None, name
        with open(spec.origin, encoding="utf-8") as source:
            assert f"time.sleep({shim.FLOWER_POLL})" in source.read(), name
