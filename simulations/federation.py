"""A real Flower deployment: one SuperLink, N SuperNodes, `flwr run`, optionally secured.

`LoopbackDeployment` starts ``flower-superlink`` on a free port and N
``flower-supernode --node-config "partition-id=i num-partitions=N"``, each on its own
port, in its own session (process group), with its own working directory and
FLWR_HOME under a private temporary home whose ``config.toml`` names the connection.
Telemetry and runtime dependency installation are off: `flwr_admm` must be installed
in this environment, as on a real SuperNode; when this process imports it from a
source checkout, every process started gets that checkout on PYTHONPATH (`env`), so a
deployment tests the code under test. Options:

- ``tls=True``: a CA and a SuperLink certificate are made for the run
  (`simulations.credentials`); the SuperLink starts with ``--ssl-ca-certfile
  --ssl-certfile --ssl-keyfile``, the SuperNodes with ``--root-certificates`` and the
  connection in config.toml with ``root-certificates`` (no ``--insecure`` anywhere).
- ``auth=True`` (needs TLS): SuperLink ``--enable-supernode-auth``; a P-384 key pair
  per SuperNode, registered with ``flwr supernode register``; SuperNodes start with
  ``--auth-supernode-private-key``. ``unregistered=k`` adds k SuperNodes (claiming
  partition-id 0) whose keys were never registered: the SuperLink must refuse them.
- ``network``: ``"loopback"`` (127.0.0.1), ``"netns"`` (the SuperLink and every
  SuperNode in their own network namespace, bridged by veth pairs, `simulations.netns`;
  an error if impossible) or ``"auto"`` (netns where possible, else loopback; the
  reason is in `network_note`).
- ``poll_seconds=s`` (the tests' deployments): Flower's fixed 3 s polls (the
  ServerApp's grid, an idle SuperNode) last `s` seconds instead, through
  `simulations/fast_polls/sitecustomize.py`; the same messages, pulled sooner.

`submit` / `run` call ``flwr run <app> <connection> --stream``; `kill_supernode` ends
one SuperNode's process group by PID; `restart_supernode` starts it again with the same
partition-id. `stop` (also `__exit__`, also after an error or SIGTERM) ends every
process started, by PID, SIGTERM first and SIGKILL after a grace period, removes the
namespaces, and raises if any process or namespace survives.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from . import netns
from .credentials import NodeKey, TlsFiles, make_node_key, make_tls
from .deploy_process import (
    CONNECTION,
    NODE_ID,
    ProcessGroups,
    SubmittedRun,
    SuperNode,
    received_round,
    tail,
    wait_for_log,
)
from .launcher import (
    APP_DIR,
    TOKEN_VAR,
    RunOutcome,
    StopOnExit,
    free_port,
    toml_value,
)

NETWORKS = ("loopback", "netns", "auto")
FAST_POLLS = Path(__file__).resolve().parent / "fast_polls"  # its sitecustomize.py


def checkout_of(package: str) -> Path | None:
    """Return the source checkout `package` is imported from (its parent directory
    holds a pyproject.toml), or None when it is installed (site-packages) or absent."""
    spec = importlib.util.find_spec(package)
    if spec is None or spec.origin is None:
        return None
    root = Path(spec.origin).resolve().parent.parent
    return root if (root / "pyproject.toml").is_file() else None


HEALTH_PROBE = (
    "import ssl, sys, urllib.request as u\n"
    "ctx = ssl.create_default_context(cafile=sys.argv[2]) if sys.argv[2] else None\n"
    "u.urlopen(sys.argv[1], timeout=0.5, context=ctx).read()\n"
)


class LoopbackDeployment(ProcessGroups, StopOnExit):
    """SuperLink + N SuperNodes under a private FLWR_HOME (TLS, auth, netns optional)."""

    def __init__(
        self,
        num_supernodes: int,
        *,
        home: Path | None = None,
        app_dir: Path = APP_DIR,
        bin_dir: Path | None = None,
        startup_timeout: float = 60.0,
        tls: bool = False,
        auth: bool = False,
        unregistered: int = 0,
        network: str = "loopback",
        poll_seconds: float | None = None,
    ) -> None:
        if type(num_supernodes) is not int or num_supernodes < 1:
            raise ValueError(f"num_supernodes: must be an integer >= 1, got {num_supernodes!r}")
        if network not in NETWORKS:
            raise ValueError(f"network: must be one of {NETWORKS}, got {network!r}")
        if auth and not tls:
            raise ValueError("auth: SuperNode authentication needs tls=True (Flower 1.42)")
        if type(unregistered) is not int or unregistered < 0 or (unregistered and not auth):
            raise ValueError(
                f"unregistered: must be an integer >= 0, and 0 unless auth=True; "
                f"got {unregistered!r} with auth={auth}"
            )
        if poll_seconds is not None and (
            isinstance(poll_seconds, bool)
            or not (isinstance(poll_seconds, int | float) and 0 < poll_seconds <= 3)
        ):
            raise ValueError(f"poll_seconds: must be None or in (0, 3], got {poll_seconds!r}")
        self.num_supernodes = num_supernodes
        self.poll_seconds = poll_seconds
        self.tls, self.auth, self.unregistered = tls, auth, unregistered
        self.network, self.network_used, self.network_note = network, "loopback", ""
        self._own_home = home is None
        self.home = Path(tempfile.mkdtemp(prefix="flwr-loopback-")) if home is None else Path(home)
        self.app_dir = Path(app_dir).resolve()
        self.bin_dir = Path(bin_dir) if bin_dir is not None else Path(sys.executable).parent
        self.startup_timeout = startup_timeout
        self.token = uuid.uuid4().hex
        self.port = 0
        self.host = "127.0.0.1"  # where SuperNodes and the CLI reach the SuperLink
        self.namespaces: netns.Namespaces | None = None
        self.tls_files: TlsFiles | None = None
        self.keys: dict[int, NodeKey] = {}  # by slot
        self.registered_ids: dict[int, int] = {}  # partition-id -> node id (auth)
        self.superlink: subprocess.Popen[bytes] | None = None
        self.supernodes: dict[int, SuperNode] = {}
        self.intruders: list[SuperNode] = []
        self.started: list[subprocess.Popen[bytes]] = []
        self._launches: dict[int, int] = {}

    # ------------------------------------------------------------------ setup
    def env(self, flwr_home: Path) -> dict[str, str]:
        """Return the environment of every process started here (tagged with our token)."""
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
        # The SuperLink, its ServerApps and the SuperNodes' ClientApps import the
        # flwr_admm this process imports (a checkout under test, not the installed one)
        source = checkout_of("flwr_admm")
        paths = [] if source is None else [str(source)]
        if self.poll_seconds is not None:  # Flower's 3 s polls shortened (fast_polls)
            paths.insert(0, str(FAST_POLLS))
            env["FLWR_ADMM_POLL_SECONDS"] = repr(float(self.poll_seconds))
        if paths:
            env["PYTHONPATH"] = os.pathsep.join(paths)
        else:
            env.pop("PYTHONPATH", None)
        return env

    def start(self) -> None:
        """Start the network, credentials, SuperLink, connection, then every SuperNode."""
        self.home.mkdir(parents=True, exist_ok=True)
        self._setup_network()
        if self.tls:
            self.tls_files = make_tls(self.home / "tls", sorted({"127.0.0.1", self.host}))
        self._start_superlink()
        secure = (
            f'root-certificates = "{self.tls_files.ca_cert}"\n'
            if self.tls_files is not None
            else "insecure = true\n"
        )
        (self.home / "config.toml").write_text(
            f'[superlink]\ndefault = "{CONNECTION}"\n\n'
            f'[superlink.{CONNECTION}]\naddress = "{self.host}:{self.port}"\n{secure}'
        )
        if self.auth:
            for slot in range(self.num_supernodes + self.unregistered):
                self.keys[slot] = make_node_key(self.home / "keys", f"supernode-{slot}")
            for partition_id in range(self.num_supernodes):
                self.registered_ids[partition_id] = self.register(self.keys[partition_id])
        for partition_id in range(self.num_supernodes):
            self._launch_supernode(partition_id)
        for extra in range(self.unregistered):
            self.intruders.append(self._launch_supernode(0, slot=self.num_supernodes + extra))
        for partition_id in range(self.num_supernodes):
            self._await_supernode(partition_id)

    def _setup_network(self) -> None:
        if self.network == "loopback":
            self.network_note = "loopback requested"
            return
        ok, why = netns.available()
        if ok:
            namespaces = netns.Namespaces(self.num_supernodes + self.unregistered, self.token[:6])
            try:
                namespaces.create()
            except (subprocess.CalledProcessError, OSError) as error:
                ok, why = False, f"creating the namespaces failed: {error}"
            else:
                self.namespaces, self.network_used = namespaces, "netns"
                self.host = netns.LINK_ADDRESS
                self.network_note = f"network namespaces ({why})"
                return
        if self.network == "netns":
            raise RuntimeError(f"network='netns': network namespaces unavailable: {why}")
        self.network_note = f"loopback (network namespaces unavailable: {why})"

    def _wrap(self, command: list[str], slot: int | None) -> list[str]:
        """`command` inside the SuperLink's (slot None) or a SuperNode's namespace."""
        if self.namespaces is None:
            return command
        name = self.namespaces.link if slot is None else self.namespaces.nodes[slot]
        return self.namespaces.wrap(name, command)

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
            bind = "0.0.0.0" if self.namespaces is not None else "127.0.0.1"
            flags = f"--host {bind} --port {self.port} --disable-runtime-dependency-installation"
            if self.tls_files is None:
                flags += " --insecure"
            else:
                flags += f" --ssl-ca-certfile {self.tls_files.ca_cert}"
                flags += f" --ssl-certfile {self.tls_files.server_cert}"
                flags += f" --ssl-keyfile {self.tls_files.server_key}"
            if self.auth:
                flags += " --enable-supernode-auth"
            command = self._wrap([str(self.bin_dir / "flower-superlink"), *flags.split()], None)
            self.superlink = self._spawn(command, runtime, self.home, self.home / "superlink.log")
            if self._superlink_healthy():
                return
            self.end_group(self.superlink)  # the port was taken meanwhile: try another
        raise RuntimeError(
            f"flower-superlink did not start (log {self.home / 'superlink.log'}):\n"
            + tail(self.home / "superlink.log")
        )

    def _superlink_healthy(self) -> bool:
        """Poll ``/health`` (over TLS with the run's CA if on) from the SuperLink's
        network namespace until it answers 200."""
        assert self.superlink is not None
        scheme = "https" if self.tls_files is not None else "http"
        url = f"{scheme}://{self.host}:{self.port}/health"
        ca = str(self.tls_files.ca_cert) if self.tls_files is not None else ""
        probe = self._wrap([sys.executable, "-c", HEALTH_PROBE, url, ca], None)
        deadline = time.monotonic() + self.startup_timeout
        while time.monotonic() < deadline and self.superlink.poll() is None:
            done = subprocess.run(probe, capture_output=True, timeout=30, check=False)
            if done.returncode == 0:
                return True
            time.sleep(0.2)
        return False

    def register(self, key: NodeKey) -> int:
        """Register `key`'s public key with the SuperLink; return the node id."""
        done = self.flwr("supernode", "register", str(key.public), CONNECTION, "--format", "json")
        try:
            return int(json.loads(done.stdout[done.stdout.index("{") :])["node-id"])
        except (ValueError, KeyError) as error:
            raise RuntimeError(
                f"flwr supernode register failed ({done.returncode}):\n{done.stdout}{done.stderr}"
            ) from error

    def _launch_supernode(self, partition_id: int, slot: int | None = None) -> SuperNode:
        slot = partition_id if slot is None else slot
        generation = self._launches.get(slot, 0)
        self._launches[slot] = generation + 1
        port = free_port()
        node_home = self.home / f"supernode-{slot}"
        log_path = self.home / f"supernode-{slot}.{generation}.log"
        command = [
            str(self.bin_dir / "flower-supernode"),
            *f"--superlink {self.host}:{self.port} --port {port}".split(),
            "--node-config",
            f"partition-id={partition_id} num-partitions={self.num_supernodes}",
        ]
        if self.tls_files is None:
            command.append("--insecure")
        else:
            command += ["--root-certificates", str(self.tls_files.ca_cert)]
        if self.auth:
            command += ["--auth-supernode-private-key", str(self.keys[slot].private)]
        process = self._spawn(self._wrap(command, slot), node_home, node_home, log_path)
        registered = slot < self.num_supernodes
        node = SuperNode(partition_id, port, process, log_path, slot, registered)
        if registered:
            self.supernodes[partition_id] = node
        return node

    def _await_supernode(self, partition_id: int) -> int:
        node = self.supernodes[partition_id]
        match = wait_for_log(node.log_path, NODE_ID, self.startup_timeout, watch=node.process)
        node.node_id = int(match.group(1))
        return node.node_id

    # -------------------------------------------------------------------- run
    def submit(self, run_config: dict[str, Any], log_path: Path) -> SubmittedRun:
        """Start ``flwr run <app> <connection> --stream`` with `run_config` as overrides."""
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
        process = self._spawn(self._wrap(command, None), self.home / "cli", self.home, log_path)
        return SubmittedRun(process, log_path, time.perf_counter(), self)

    def run(
        self, run_config: dict[str, Any], log_path: Path, timeout: float = 3600.0
    ) -> RunOutcome:
        """`submit` and wait for the run to end."""
        return self.submit(run_config, log_path).wait(timeout)

    def flwr(self, *args: str, timeout: float = 60.0) -> subprocess.CompletedProcess[str]:
        """Run another `flwr` command against this deployment (e.g. ``supernode list``)."""
        cwd = self.home / "cli"
        cwd.mkdir(parents=True, exist_ok=True)
        return subprocess.run(
            self._wrap([str(self.bin_dir / "flwr"), *args], None),
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
        wait_for_log(node.log_path, pattern, timeout, watch=(node.process, run.process))
        return self.kill_supernode(partition_id, sig)

    def restart_supernode(
        self, partition_id: int, retry_for: float = 0.0, pause: float = 5.0
    ) -> SuperNode:
        """Start SuperNode `partition_id` again (same partition-id and key; without auth
        a new node id).

        Under authentication the SuperLink refuses a SuperNode whose key is still
        registered to a live node ("Failed to activate SuperNode", exit 305): after a
        SIGKILL it releases the old registration only once the heartbeats stop (about
        60 s in Flower 1.42). With `retry_for` > 0 a SuperNode that exits before it
        registers is started again every `pause` seconds until `retry_for` seconds
        have passed; then the last failure is raised.
        """
        if self.supernodes[partition_id].process.poll() is None:
            raise RuntimeError(f"SuperNode {partition_id} is still running; kill it first")
        deadline = time.monotonic() + retry_for
        while True:
            self._launch_supernode(partition_id)
            try:
                self._await_supernode(partition_id)
                return self.supernodes[partition_id]
            except RuntimeError:  # exited before registering: the old registration holds
                if time.monotonic() + pause > deadline:
                    raise
            time.sleep(pause)

    # ------------------------------------------------------------------- stop
    def stop(self, grace: float = 15.0) -> None:
        """Stop everything started here, by PID, and remove the namespaces; raise if
        anything survives.

        One SIGTERM per process group, `grace` seconds to exit, then SIGKILL.
        """
        try:
            self._stop_processes(grace)
        finally:
            failed = self.namespaces.remove() if self.namespaces is not None else []
        if failed:
            raise RuntimeError(f"network namespaces left after stop: {failed}")
        if self._own_home:
            shutil.rmtree(self.home, ignore_errors=True)
