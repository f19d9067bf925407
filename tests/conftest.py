"""Shared fixtures: one private local SuperLink for every `flwr run` test of the session.

`scripts/check.sh` runs the suite on two pytest-xdist workers. `ModuleScheduling` keeps
every test module on one worker, in its order (its module fixtures, such as a
deployment, start once), and every module that uses `local_flower` on the one worker
that holds the one local SuperLink. (pytest 9.2 ignores the node-id suffix that
xdist's own ``--dist loadgroup`` relies on, so the grouping is a scheduler here.)
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

TESTS = Path(__file__).parent
LOCAL_SUPERLINK = "local-superlink"


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """Schedule whole modules, and every `flwr run` module on one worker."""
    from xdist.scheduler import LoadScopeScheduling

    users = {
        str(path.relative_to(TESTS.parent))
        for path in TESTS.rglob("test_*.py")
        if "local_flower" in path.read_text()
    }

    class ModuleScheduling(LoadScopeScheduling):  # type: ignore[misc]
        def _split_scope(self, nodeid: str) -> str:
            module = nodeid.split("::", 1)[0]
            return LOCAL_SUPERLINK if module in users else module

    return ModuleScheduling(config, log)


@pytest.fixture(scope="session")
def local_flower(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """A `simulations.launcher.LocalFlower` (private FLWR_HOME, free port), started once.

    Tests call ``local_flower.run(...)`` on it; at the end of the session it is stopped
    by PID (LocalFlower's own stop), and everything it started must be gone.
    """
    from simulations.launcher import LocalFlower, process_table

    home = tmp_path_factory.mktemp("flwr-home")
    flower = LocalFlower(home=home)
    with flower:
        assert flower.superlink is not None
        assert flower.port != 39091  # never `flwr run`'s shared default port
        superlink_pid = flower.superlink.pid
        yield flower
        pids = flower.owned_pids()
    # everything it started is gone, by PID, and nothing else carries its token
    for pid in {superlink_pid, *pids}:
        assert not os.path.exists(f"/proc/{pid}") or _is_zombie(pid), pid
    assert not any(token == flower.token for _, _, token in process_table().values())
    assert (home / "local-superlink" / "superlink.log").exists()


def _is_zombie(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat[stat.rindex(")") + 2] == "Z"
