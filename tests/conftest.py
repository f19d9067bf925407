"""Shared fixtures: one private local SuperLink for every `flwr run` test of the session.

`scripts/check.sh` runs the suite on three pytest-xdist workers (on 2 cores), one BLAS /
torch thread each: one runs the deployments (`WAITING`: mostly idle, waiting on Flower's
polls) while the other two start on the largest modules. `ModuleScheduling` keeps every
test module on one worker, in its order (its module fixtures, such as a deployment,
start once), and every module that uses `local_flower` on the one worker that holds
the one local SuperLink. (pytest 9.2 ignores the node-id suffix that xdist's own
``--dist loadgroup`` relies on, so the grouping is a scheduler here.)
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from typing import Any

import pytest

if "PYTEST_XDIST_WORKER" in os.environ:  # one BLAS / torch thread per worker (and child)
    for _threads in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ.setdefault(_threads, "1")

TESTS = Path(__file__).parent
LOCAL_SUPERLINK = "local-superlink"
# The deployments: minutes each, mostly waiting on Flower's processes. One scope, run
# first by one worker, one module after the other, while the others take the CPU-bound
# tests.
WAITING = ("tests/apps/test_deployment.py", "tests/apps/test_secure_deployment.py")
DEPLOYMENTS = "deployments"


@cache
def _superlink_modules() -> frozenset[str]:
    return frozenset(
        str(path.relative_to(TESTS.parent))
        for path in TESTS.rglob("test_*.py")
        if "local_flower" in path.read_text()
    )


def scope_of(nodeid: str) -> str:
    """A test's unit of scheduling: its module, the deployments', or the local SuperLink's."""
    module = nodeid.split("::", 1)[0]
    if module in WAITING:
        return DEPLOYMENTS
    return LOCAL_SUPERLINK if module in _superlink_modules() else module


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """On an xdist worker, order the scopes as `ModuleScheduling` hands them out.

    The deployments first, then the largest scopes (xdist's own order). Every worker
    orders its collection the same way, as xdist requires.
    """
    if not hasattr(config, "workerinput"):
        return
    scopes: dict[str, list[pytest.Item]] = {}
    for item in items:
        scopes.setdefault(scope_of(item.nodeid), []).append(item)
    order = sorted(scopes, key=lambda s: (s != DEPLOYMENTS, -len(scopes[s])))
    items[:] = [item for scope in order for item in scopes[scope]]


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """Schedule whole scopes (`scope_of`) in the collection's order."""
    from xdist.scheduler import LoadScopeScheduling

    config.option.loadscopereorder = False  # the workers ordered the scopes already

    class ModuleScheduling(LoadScopeScheduling):  # type: ignore[misc]
        def _split_scope(self, nodeid: str) -> str:
            return scope_of(nodeid)

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
