"""Shared fixtures: one private local SuperLink for every `flwr run` test of the session."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest


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
