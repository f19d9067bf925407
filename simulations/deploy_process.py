"""Processes of a deployment: SuperNode records, a submitted `flwr run`, log polling.

`SuperNode` is one ``flower-supernode`` process (a restart is a new record);
`SubmittedRun` is a ``flwr run --stream`` in progress that can be waited for or
cancelled on the SuperLink; `wait_for_log` polls a log file for a pattern and fails
as soon as the process that should write it has exited; `ProcessGroups` ends the
processes a deployment started, by PID (a group at a time, then any stray carrying
the deployment's token), SIGTERM first and SIGKILL after a grace period.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from .launcher import RunOutcome, _signal, owned_processes, process_table

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


class ProcessGroups:
    """Mixin: processes started in their own groups, tagged with `token`, ended by PID.

    The subclass sets `token` (the value of the environment marker every process it
    starts carries) and appends every process it starts to `started`.
    """

    token: str
    started: list[subprocess.Popen[bytes]]

    def end_group(
        self, process: subprocess.Popen[bytes], sig: int = signal.SIGTERM, grace: float = 15.0
    ) -> None:
        """Signal the process group `process` leads, once; SIGKILL what is left of it
        after `grace` seconds (a second SIGTERM would cut Flower's graceful exit short)."""
        if process.poll() is None:
            signal_group(process.pid, sig)
        deadline = time.monotonic() + grace
        while self._members(process) and time.monotonic() < deadline:
            time.sleep(0.1)
        for pid in self._members(process):
            _signal(pid, signal.SIGKILL)
        process.wait()

    def _members(self, process: subprocess.Popen[bytes]) -> list[int]:
        """Return our live processes in the group `process` leads (or led)."""
        process.poll()  # reap the leader once it has exited
        return [
            pid
            for pid, (_, pgid, token) in process_table().items()
            if pgid == process.pid and token == self.token
        ]

    def owned_pids(self) -> set[int]:
        """Return the live processes we started: our groups' leaders, their
        descendants, and anything carrying our token (those that outlived their parent)."""
        roots = {p.pid for p in self.started if p.poll() is None}  # unreaped: still ours
        return owned_processes(roots, self.token, groups=True)

    def _stop_processes(self, grace: float) -> None:
        """End every process started: one SIGTERM per group, `grace` s, SIGKILL."""
        groups = set()
        for process in reversed(self.started):  # flwr run, SuperNodes, then SuperLink
            if process.poll() is None:
                groups.add(process.pid)
                signal_group(process.pid, signal.SIGTERM)
        table = process_table()
        for pid in self.owned_pids():  # strays that left our groups
            if pid in table and table[pid][1] not in groups:
                _signal(pid, signal.SIGTERM)
        deadline = time.monotonic() + grace
        while self.owned_pids() and time.monotonic() < deadline:
            time.sleep(0.1)
        for _ in range(3):
            for pid in self.owned_pids():
                _signal(pid, signal.SIGKILL)
            for process in self.started:
                try:
                    process.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    pass
        leftover = self.owned_pids()
        if leftover:
            raise RuntimeError(f"processes still alive after stop: {sorted(leftover)}")
