"""A real Flower deployment on loopback: one SuperLink, N SuperNodes, `flwr run`.

    python -m simulations.deployment --supernodes 3 --rounds 10 [--strategy fedadmm] \
        [--task seed-logreg] [--run-config 'rho=0.5 ...'] [--kill-node 2 --kill-round 3]

`LoopbackDeployment` starts ``flower-superlink --insecure`` on a free 127.0.0.1 port
and N ``flower-supernode --insecure --node-config "partition-id=i num-partitions=N"``,
each on its own free port, in its own session (process group), with its own working
directory and FLWR_HOME under a private temporary home whose ``config.toml`` names
the connection. Telemetry and runtime dependency installation are off: `flwr_admm`
must be installed in this environment, as on a real SuperNode. `submit` / `run` call
``flwr run <app> <connection> --stream``. `kill_supernode` ends one SuperNode's
process group by PID (mid-run if you like); `restart_supernode` starts it again with
the same partition-id: a new process, hence a new node id. `stop` (also `__exit__`,
also after an error or SIGTERM) ends every process it started, by PID, SIGTERM first
and SIGKILL after a grace period, and raises if any survives.

SIGTERM is the default kill: the SuperNode then deactivates itself and the SuperLink
answers its pending messages with NODE_UNAVAILABLE at once. After SIGKILL the
SuperLink notices only when two heartbeats are missed (60 s in Flower 1.42).
"""

from __future__ import annotations

import argparse
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .admm_app.evaluation import get_task
from .admm_app.run_config import accepted_options, parse_run_config
from .compare import parse_overrides
from .launcher import (
    APP_DIR,
    TOKEN_VAR,
    RunOutcome,
    StopOnExit,
    _signal,
    free_port,
    owned_processes,
    process_table,
    toml_value,
)
from .report import check_result

CONNECTION = "loopback"
NODE_ID = re.compile(r"SuperNode ID: (\d+)")
RUN_ID = re.compile(r"Successfully started run (\d+)")


def received_round(run_id: int, server_round: int) -> re.Pattern[str]:
    """SuperNode log lines: it received the train message of `server_round` of run
    `run_id`."""
    return re.compile(
        rf"\[RUN {run_id}, ROUND {server_round}\][^\n]*\n[^\n]*Receiving: train message"
    )


@dataclass
class SuperNode:
    """One SuperNode process (a restart is a new `SuperNode`)."""

    partition_id: int
    port: int
    process: subprocess.Popen[bytes]
    log_path: Path
    node_id: int | None = None


@dataclass
class SubmittedRun:
    """A `flwr run --stream` in progress; `wait` ends it and reports."""

    process: subprocess.Popen[bytes]
    log_path: Path
    started: float
    deployment: LoopbackDeployment

    def run_id(self, timeout: float = 60.0) -> int:
        """The run id the SuperLink gave this run (from the streamed log)."""
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
        match = RUN_ID.search(_read(self.log_path))
        if match is not None:
            self.deployment.flwr("stop", match.group(1), CONNECTION)
        self.deployment.end_group(self.process)


class LoopbackDeployment(StopOnExit):
    """SuperLink + N SuperNodes on 127.0.0.1 under a private FLWR_HOME."""

    def __init__(
        self,
        num_supernodes: int,
        *,
        home: Path | None = None,
        app_dir: Path = APP_DIR,
        bin_dir: Path | None = None,
        startup_timeout: float = 60.0,
    ) -> None:
        if type(num_supernodes) is not int or num_supernodes < 1:
            raise ValueError(f"num_supernodes: must be an integer >= 1, got {num_supernodes!r}")
        self.num_supernodes = num_supernodes
        self._own_home = home is None
        self.home = Path(tempfile.mkdtemp(prefix="flwr-loopback-")) if home is None else Path(home)
        self.app_dir = Path(app_dir).resolve()
        self.bin_dir = Path(bin_dir) if bin_dir is not None else Path(sys.executable).parent
        self.startup_timeout = startup_timeout
        self.token = uuid.uuid4().hex
        self.port = 0
        self.superlink: subprocess.Popen[bytes] | None = None
        self.supernodes: dict[int, SuperNode] = {}
        self.started: list[subprocess.Popen[bytes]] = []
        self._launches: dict[int, int] = {}

    # ------------------------------------------------------------------ setup
    def env(self, flwr_home: Path) -> dict[str, str]:
        """Environment of every process started here (tagged with our token)."""
        env = dict(os.environ)
        env.update(
            {
                "FLWR_HOME": str(flwr_home),
                "FLWR_TELEMETRY_ENABLED": "0",
                "FLWR_DISABLE_UPDATE_CHECK": "1",
                "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1",
                # SuperExecs start App processes 0.2 s after a task arrives, not 1 s
                "FLWR_SUPEREXEC_TASK_POLL_INTERVAL": "0.2",
                "PATH": f"{self.bin_dir}{os.pathsep}{os.environ.get('PATH', '')}",
                TOKEN_VAR: self.token,
            }
        )
        env.pop("PYTHONPATH", None)  # nodes see the installed package, not the checkout
        return env

    def start(self) -> None:
        """SuperLink, the connection in config.toml, then every SuperNode, connected."""
        self._start_superlink()
        (self.home / "config.toml").write_text(
            f'[superlink]\ndefault = "{CONNECTION}"\n\n'
            f'[superlink.{CONNECTION}]\naddress = "127.0.0.1:{self.port}"\ninsecure = true\n'
        )
        for partition_id in range(self.num_supernodes):
            self._launch_supernode(partition_id)
        for partition_id in range(self.num_supernodes):
            self._await_supernode(partition_id)

    def _spawn(
        self, command: list[str], cwd: Path, flwr_home: Path, log: Path
    ) -> subprocess.Popen[bytes]:
        cwd.mkdir(parents=True, exist_ok=True)
        with log.open("ab") as handle:
            process = subprocess.Popen(
                command,
                cwd=cwd,
                env=self.env(flwr_home),
                stdin=subprocess.DEVNULL,
                stdout=handle,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # its own process group, ended as a whole
            )
        self.started.append(process)
        return process

    def _start_superlink(self, attempts: int = 3) -> None:
        runtime = self.home / "superlink"
        for _ in range(attempts):
            self.port = free_port()
            flags = f"--insecure --host 127.0.0.1 --port {self.port}"
            flags += " --disable-runtime-dependency-installation"
            command = [str(self.bin_dir / "flower-superlink"), *flags.split()]
            self.superlink = self._spawn(command, runtime, self.home, self.home / "superlink.log")
            if self._superlink_healthy():
                return
            self.end_group(self.superlink)  # the port was taken meanwhile: try another
        raise RuntimeError(
            f"flower-superlink did not start (log {self.home / 'superlink.log'}):\n"
            + _tail(self.home / "superlink.log")
        )

    def _superlink_healthy(self) -> bool:
        assert self.superlink is not None
        deadline = time.monotonic() + self.startup_timeout
        while time.monotonic() < deadline and self.superlink.poll() is None:
            try:
                url = f"http://127.0.0.1:{self.port}/health"
                with urllib.request.urlopen(url, timeout=0.5) as response:
                    if response.status == 200:
                        return True
            except OSError:
                pass
            time.sleep(0.2)
        return False

    def _launch_supernode(self, partition_id: int) -> SuperNode:
        generation = self._launches.get(partition_id, 0)
        self._launches[partition_id] = generation + 1
        port = free_port()
        node_home = self.home / f"supernode-{partition_id}"
        log_path = self.home / f"supernode-{partition_id}.{generation}.log"
        command = [
            str(self.bin_dir / "flower-supernode"),
            *f"--insecure --superlink 127.0.0.1:{self.port} --port {port}".split(),
            "--node-config",
            f"partition-id={partition_id} num-partitions={self.num_supernodes}",
        ]
        process = self._spawn(command, node_home, node_home, log_path)
        node = SuperNode(partition_id, port, process, log_path)
        self.supernodes[partition_id] = node
        return node

    def _await_supernode(self, partition_id: int) -> int:
        node = self.supernodes[partition_id]
        match = wait_for_log(node.log_path, NODE_ID, self.startup_timeout, watch=node.process)
        node.node_id = int(match.group(1))
        return node.node_id

    # -------------------------------------------------------------------- run
    def submit(self, run_config: dict[str, Any], log_path: Path) -> SubmittedRun:
        """Start ``flwr run <app> loopback --stream`` with `run_config` as overrides."""
        if self.superlink is None or self.superlink.poll() is not None:
            raise RuntimeError("LoopbackDeployment.submit: the SuperLink is not running")
        overrides = self.home / f"run-config-{uuid.uuid4().hex[:8]}.toml"
        overrides.write_text(
            "".join(f"{key} = {toml_value(value)}\n" for key, value in run_config.items())
        )
        log_path.parent.mkdir(parents=True, exist_ok=True)
        log_path.unlink(missing_ok=True)
        command = [str(self.bin_dir / "flwr"), "run", str(self.app_dir), CONNECTION, "--stream"]
        command += ["--run-config", str(overrides)]
        process = self._spawn(command, self.home / "cli", self.home, log_path)
        return SubmittedRun(process, log_path, time.perf_counter(), self)

    def run(
        self, run_config: dict[str, Any], log_path: Path, timeout: float = 3600.0
    ) -> RunOutcome:
        """`submit` and wait for the run to end."""
        return self.submit(run_config, log_path).wait(timeout)

    def flwr(self, *args: str, timeout: float = 60.0) -> subprocess.CompletedProcess[str]:
        """Another `flwr` command against this deployment (e.g. ``supernode list``)."""
        cwd = self.home / "cli"
        cwd.mkdir(parents=True, exist_ok=True)
        return subprocess.run(
            [str(self.bin_dir / "flwr"), *args],
            cwd=cwd,
            env=self.env(self.home),
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )

    # ----------------------------------------------------------------- faults
    def kill_supernode(self, partition_id: int, sig: int = signal.SIGTERM) -> int:
        """End SuperNode `partition_id`'s process group with `sig`; return its PID."""
        node = self.supernodes[partition_id]
        if node.process.poll() is not None:
            raise RuntimeError(f"SuperNode {partition_id} (pid {node.process.pid}) is not running")
        self.end_group(node.process, sig)
        return node.process.pid

    def kill_during_round(
        self,
        partition_id: int,
        run: SubmittedRun,
        server_round: int,
        timeout: float = 300.0,
        sig: int = signal.SIGTERM,
    ) -> int:
        """Kill SuperNode `partition_id` with `sig` once it received the train message of
        round `server_round` of `run` (its ClientApp is then still starting or training)."""
        node = self.supernodes[partition_id]
        pattern = received_round(run.run_id(timeout), server_round)
        wait_for_log(node.log_path, pattern, timeout, watch=node.process)
        return self.kill_supernode(partition_id, sig)

    def restart_supernode(self, partition_id: int) -> SuperNode:
        """Start SuperNode `partition_id` again (same partition-id, new node id)."""
        if self.supernodes[partition_id].process.poll() is None:
            raise RuntimeError(f"SuperNode {partition_id} is still running; kill it first")
        self._launch_supernode(partition_id)
        self._await_supernode(partition_id)
        return self.supernodes[partition_id]

    # ------------------------------------------------------------------- stop
    def end_group(
        self, process: subprocess.Popen[bytes], sig: int = signal.SIGTERM, grace: float = 15.0
    ) -> None:
        """Signal the process group `process` leads, once; SIGKILL what is left of it
        after `grace` seconds (a second SIGTERM would cut Flower's graceful exit short)."""
        if process.poll() is None:
            _signal_group(process.pid, sig)
        deadline = time.monotonic() + grace
        while self._members(process) and time.monotonic() < deadline:
            time.sleep(0.1)
        for pid in self._members(process):
            _signal(pid, signal.SIGKILL)
        process.wait()

    def _members(self, process: subprocess.Popen[bytes]) -> list[int]:
        """Our live processes in the group `process` leads (or led)."""
        process.poll()  # reap the leader once it has exited
        return [
            pid
            for pid, (_, pgid, token) in process_table().items()
            if pgid == process.pid and token == self.token
        ]

    def owned_pids(self) -> set[int]:
        """Live processes we started: our groups' leaders, their descendants, and
        anything carrying our token (processes that outlived their parent)."""
        roots = {p.pid for p in self.started if p.poll() is None}  # unreaped: still ours
        return owned_processes(roots, self.token, groups=True)

    def stop(self, grace: float = 15.0) -> None:
        """Stop everything started here, by PID; raise if anything survives.

        One SIGTERM per process group, `grace` seconds to exit, then SIGKILL.
        """
        groups = set()
        for process in reversed(self.started):  # flwr run, SuperNodes, then SuperLink
            if process.poll() is None:
                groups.add(process.pid)
                _signal_group(process.pid, signal.SIGTERM)
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
        if self._own_home:
            shutil.rmtree(self.home, ignore_errors=True)


def wait_for_log(
    path: Path,
    pattern: re.Pattern[str],
    timeout: float,
    *,
    watch: subprocess.Popen[bytes] | None = None,
) -> re.Match[str]:
    """Poll the log at `path` until `pattern` matches; fail if `watch` exits first."""
    deadline = time.monotonic() + timeout
    while True:
        match = pattern.search(_read(path))
        if match is not None:
            return match
        if watch is not None and watch.poll() is not None:
            raise RuntimeError(
                f"pid {watch.pid} exited ({watch.returncode}) before {pattern.pattern!r} "
                f"appeared in {path}:\n{_tail(path)}"
            )
        if time.monotonic() > deadline:
            raise TimeoutError(
                f"{pattern.pattern!r} did not appear in {path} within {timeout} s:\n{_tail(path)}"
            )
        time.sleep(0.2)


def _signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        pass


def _read(path: Path) -> str:
    return path.read_text(errors="replace") if path.exists() else ""


def _tail(path: Path, chars: int = 3000) -> str:
    return _read(path)[-chars:] or "(empty log)"


# ----------------------------------------------------------------------- CLI
def build_parser() -> argparse.ArgumentParser:
    """The command line."""
    parser = argparse.ArgumentParser(
        prog="python -m simulations.deployment", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--supernodes", type=int, default=3, help="one per partition")
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--strategy", default="fedadmm")
    parser.add_argument("--task", default="seed-logreg")
    parser.add_argument("--run-config", default="", help="app run-config overrides: 'k=v ...'")
    parser.add_argument("--output-dir", default="outputs")
    parser.add_argument(
        "--kill-node", type=int, default=None, help="partition-id of a SuperNode to kill mid-run"
    )
    parser.add_argument(
        "--kill-round", type=int, default=2, help="kill it while it trains this round"
    )
    parser.add_argument(
        "--kill-signal",
        choices=("TERM", "KILL"),
        default="TERM",
        help="TERM: the node deactivates itself; KILL: a crash (the SuperLink notices "
        "after two missed heartbeats unless the run config sets round-timeout)",
    )
    parser.add_argument(
        "--restart-after",
        type=float,
        default=5.0,
        help="seconds between the kill and the restart (negative: no restart)",
    )
    parser.add_argument(
        "--home", default=None, help="FLWR_HOME and logs (kept); default: temporary, removed"
    )
    parser.add_argument("--timeout", type=float, default=1800.0, help="seconds for the run")
    return parser


def run_config_of(args: argparse.Namespace) -> dict[str, Any]:
    """The app run config of the command line, validated (ValueError names the field)."""
    if args.supernodes < 1:
        raise ValueError(f"--supernodes: must be >= 1, got {args.supernodes}")
    config = {
        **parse_overrides(args.run_config),
        "strategy": args.strategy,
        "task": args.task,
        "num-server-rounds": args.rounds,
        "output-dir": str(Path(args.output_dir).expanduser().resolve()),
    }
    settings = parse_run_config(config)
    if "num-clients" not in config and accepted_options(args.task, {"num_clients": 1}):
        config["num-clients"] = args.supernodes
        settings = parse_run_config(config)
    clients = get_task(settings.task, settings.seed, settings.task_options()).data.num_clients
    if clients != args.supernodes:
        raise ValueError(
            f"--supernodes: task {args.task!r} has {clients} clients here; "
            f"run with --supernodes {clients}"
        )
    if args.kill_node is not None:
        if not 0 <= args.kill_node < args.supernodes:
            raise ValueError(
                f"--kill-node: must be a partition-id in [0, {args.supernodes - 1}], "
                f"got {args.kill_node}"
            )
        if not 1 <= args.kill_round <= args.rounds:
            raise ValueError(f"--kill-round: must be in [1, {args.rounds}], got {args.kill_round}")
    return config


ROUND_COLUMNS = ("num_evicted", "num_key_conflicts", "num_resynced")  # of fit_metrics


def print_rounds(document: dict[str, Any] | None) -> None:
    """Print one line per round: results, failures, the identity counters, time, F, gap.

    ``evicted``: client keys dropped (under key-binding=node a restarted SuperNode's
    key, its old node gone, rejoins fresh); ``conflicts``: replies claiming a key
    bound to a node still connected; ``resynced``: key-binding=reported only.
    """
    print(
        "round  results  failures  evicted  conflicts  resynced  seconds  objective   relative_gap"
    )
    for record in (document or {}).get("rounds", [])[1:]:
        fit = record.get("fit_metrics", {})
        evicted, conflicts, resynced = (fit.get(name, "-") for name in ROUND_COLUMNS)
        print(
            f"{record['round']:5d}  {record.get('num_results', '-'):>7}  "
            f"{record.get('num_failures', '-'):>8}  {evicted:>7}  {conflicts:>9}  "
            f"{resynced:>8}  {record.get('round_seconds', math.nan):7.1f}  "
            f"{record.get('objective', math.nan):<10.6g}  "
            f"{record.get('relative_gap', math.nan):.3e}"
        )


def main(argv: list[str] | None = None) -> int:
    """Deploy, run (with an optional kill and restart), check; 0 if the run is complete."""
    args = build_parser().parse_args(argv)
    try:
        config = run_config_of(args)
    except ValueError as error:
        raise SystemExit(str(error)) from None
    settings = parse_run_config(config)
    log_path = settings.task_dir / f"{settings.stem}.deployment.log"
    home = Path(args.home).resolve() if args.home else None
    with LoopbackDeployment(args.supernodes, home=home) as deployment:
        nodes = ", ".join(
            f"{i}: pid {n.process.pid} node {n.node_id}" for i, n in deployment.supernodes.items()
        )
        print(f"SuperLink 127.0.0.1:{deployment.port}; SuperNodes {nodes}", flush=True)
        run = deployment.submit(config, log_path)
        if args.kill_node is not None:
            sig = signal.SIGKILL if args.kill_signal == "KILL" else signal.SIGTERM
            pid = deployment.kill_during_round(
                args.kill_node, run, args.kill_round, args.timeout, sig
            )
            print(
                f"killed SuperNode {args.kill_node} (pid {pid}, SIG{args.kill_signal}) "
                f"in round {args.kill_round}"
            )
            if args.restart_after >= 0:
                time.sleep(args.restart_after)
                node = deployment.restart_supernode(args.kill_node)
                print(f"restarted it: pid {node.process.pid}, node {node.node_id}", flush=True)
        outcome = run.wait(args.timeout)
    print(f"flwr run: exit code {outcome.returncode}, {outcome.seconds:.1f} s, log {log_path}")
    document, problems = check_result(
        settings.task_dir, settings.stem, args.rounds, allow_failures=args.kill_node is not None
    )
    print_rounds(document)
    for problem in problems:
        print(f"PROBLEM: {problem}", file=sys.stderr)
    return 0 if outcome.returncode == 0 and not problems else 1


if __name__ == "__main__":
    raise SystemExit(main())
