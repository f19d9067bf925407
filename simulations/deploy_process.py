"""Processes of a deployment: SuperNode records, a submitted `flwr run`, log polling.

`SuperNode` is one ``flower-supernode`` process (a restart is a new record);
`SubmittedRun` is a ``flwr run --stream`` in progress that can be waited for or
cancelled on the SuperLink; `wait_for_log` polls a log file for a pattern and fails
as soon as the process that should write it has exited.
"""

from __future__ import annotations

import os
import re
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from .launcher import RunOutcome

if TYPE_CHECKING:
    from .federation import LoopbackDeployment

CONNECTION = "loopback"
NODE_ID = re.compile(r"SuperNode ID: (\d+)")
RUN_ID = re.compile(r"Successfully started run (\d+)")


def received_round(run_id: int, server_round: int) -> re.Pattern[str]:
    """Match a SuperNode log's lines saying it received the train message of
    `server_round` of run `run_id`."""
    return re.compile(
        rf"\[RUN {run_id}, ROUND {server_round}\][^\n]*\n[^\n]*Receiving: train message"
    )


@dataclass
class SuperNode:
    """One SuperNode process (a restart is a new `SuperNode`).

    `slot` is its network slot (its namespace under netns), `registered` whether its
    public key was registered with the SuperLink (always True without auth).
    """

    partition_id: int
    port: int
    process: subprocess.Popen[bytes]
    log_path: Path
    slot: int = 0
    registered: bool = True
    node_id: int | None = None


@dataclass
class SubmittedRun:
    """A `flwr run --stream` in progress; `wait` ends it and reports."""

    process: subprocess.Popen[bytes]
    log_path: Path
    started: float
    deployment: LoopbackDeployment

    def run_id(self, timeout: float = 60.0) -> int:
        """Return the run id the SuperLink gave this run (from the streamed log)."""
        return int(wait_for_log(self.log_path, RUN_ID, timeout, watch=self.process).group(1))

    def wait(self, timeout: float = 3600.0) -> RunOutcome:
        """Wait for `flwr run` to exit; `cancel` the run after `timeout` seconds."""
        try:
            returncode = self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.cancel()
            returncode = -1
        return RunOutcome(returncode, time.perf_counter() - self.started, self.log_path)

    def cancel(self) -> None:
        """Stop the run on the SuperLink (`flwr stop`), then end `flwr run` (no-op once
        it has exited): killing `flwr run` alone would leave the ServerApp running."""
        if self.process.poll() is not None:
            return
        match = RUN_ID.search(read_log(self.log_path))
        if match is not None:
            self.deployment.flwr("stop", match.group(1), CONNECTION)
        self.deployment.end_group(self.process)


def wait_for_log(
    path: Path,
    pattern: re.Pattern[str],
    timeout: float,
    *,
    watch: subprocess.Popen[bytes] | Sequence[subprocess.Popen[bytes]] = (),
) -> re.Match[str]:
    """Poll the log at `path` until `pattern` matches; fail as soon as a process in
    `watch` has exited first."""
    watched = [watch] if isinstance(watch, subprocess.Popen) else list(watch)
    deadline = time.monotonic() + timeout
    while True:
        match = pattern.search(read_log(path))
        if match is not None:
            return match
        for process in watched:
            if process.poll() is not None:
                raise RuntimeError(
                    f"pid {process.pid} exited ({process.returncode}) before "
                    f"{pattern.pattern!r} appeared in {path}:\n{tail(path)}"
                )
        if time.monotonic() > deadline:
            raise TimeoutError(
                f"{pattern.pattern!r} did not appear in {path} within {timeout} s:\n{tail(path)}"
            )
        time.sleep(0.2)


def signal_group(pgid: int, sig: int) -> None:
    """Send `sig` to process group `pgid` (nothing if it is gone)."""
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        pass


def read_log(path: Path) -> str:
    """Return the text of the log at `path` ("" if it does not exist yet)."""
    return path.read_text(errors="replace") if path.exists() else ""


def tail(path: Path, chars: int = 3000) -> str:
    """Return the last `chars` characters of the log at `path`."""
    return read_log(path)[-chars:] or "(empty log)"
