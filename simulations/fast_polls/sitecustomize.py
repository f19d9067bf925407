"""Shorten Flower's fixed 3 s polls in the processes of a test deployment.

Flower 1.42 waits ``time.sleep(3)`` between two pulls of the ServerApp's grid
(``flwr.superlink.grid.http_grid``) and between two empty pulls of an idle SuperNode
(``flwr.supernode.start_client_internal``); a round of a loopback deployment spent
about half its time there. `simulations.federation.LoopbackDeployment(poll_seconds=s)`
puts this directory first on the PYTHONPATH of every process it starts and sets
``FLWR_ADMM_POLL_SECONDS``: Python imports this module at start-up, and the 3 s sleeps
of those two modules (and only theirs) then last `s` seconds. Nothing else changes: the
same messages, in the same order, are pulled sooner. In those processes this module
takes the place of any other ``sitecustomize`` (the test environments have none).
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable

POLLING_MODULES = frozenset(
    {"flwr.superlink.grid.http_grid", "flwr.supernode.start_client_internal"}
)
FLOWER_POLL = 3  # the seconds Flower 1.42 sleeps between pulls in those modules
VARIABLE = "FLWR_ADMM_POLL_SECONDS"


def poll_sleep(seconds: float, sleep: Callable[[float], None]) -> Callable[[float], None]:
    """Return `sleep`, but lasting `seconds` when a polling module asks for 3 s."""

    def sleep_polls(duration: float) -> None:
        caller = sys._getframe(1).f_globals.get("__name__")
        sleep(seconds if duration == FLOWER_POLL and caller in POLLING_MODULES else duration)

    return sleep_polls


if os.environ.get(VARIABLE):
    time.sleep = poll_sleep(float(os.environ[VARIABLE]), time.sleep)  # type: ignore[assignment]
