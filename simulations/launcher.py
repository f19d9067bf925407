"""A private local Flower runtime for `flwr run`: own FLWR_HOME, own port, own SuperLink.

`flwr run` on Flower 1.42 would start a detached ``flower-superlink`` on the fixed
port 39091 shared by every user of the machine and leave it running. `LocalFlower`
instead starts that SuperLink itself, from a neutral working directory inside a
private FLWR_HOME, on a free port (``FLWR_LOCAL_SUPERLINK_HTTP_API_PORT``, which is
also what `flwr run` probes, so it reuses ours), with runtime dependency
installation and telemetry off. `stop()` ends exactly what it started, by PID: the
SuperLink's process tree plus any process that carries this runtime's private token
in its environment (Ray workers that outlive their parent), SIGTERM first, then
SIGKILL. Use it as a context manager so that happens even on errors.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
import uuid
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, Self

TOKEN_VAR = "FLWR_ADMM_RUNTIME_TOKEN"
APP_DIR = Path(__file__).resolve().parent


def free_port() -> int:
    """A port the OS reports free on 127.0.0.1 right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def toml_value(value: Any) -> str:
    """A scalar as TOML (strings double-quoted, bools lowercase)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    escaped = str(value).replace("\\", "\\\\").replace('"', '\\"')
    return f'"{escaped}"'


@dataclass
class RunOutcome:
    """What one `flwr run` did: its exit code, wall time and log file."""

    returncode: int
    seconds: float
    log_path: Path


class StopOnExit:
    """Context manager base: `start()` on enter, `stop()` on exit, errors and SIGTERM.

    SIGTERM would end Python without unwinding; inside the block it raises SystemExit
    so that `stop()` still stops, by PID, everything the subclass started.
    """

    _previous_sigterm: Any = None

    def start(self) -> None:
        """Start the processes."""
        raise NotImplementedError

    def stop(self) -> None:
        """Stop every process started, by PID."""
        raise NotImplementedError

    def __enter__(self) -> Self:
        if threading.current_thread() is threading.main_thread():
            self._previous_sigterm = signal.signal(signal.SIGTERM, _raise_system_exit)
        try:
            self.start()
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        try:
            self.stop()
        finally:
            if self._previous_sigterm is not None:
                signal.signal(signal.SIGTERM, self._previous_sigterm)
                self._previous_sigterm = None


class LocalFlower(StopOnExit):
    """Private FLWR_HOME + SuperLink on a free port; stop() kills only what it started."""

    def __init__(
        self,
        home: Path | None = None,
        *,
        bin_dir: Path | None = None,
        startup_timeout: float = 60.0,
    ) -> None:
        self._own_home = home is None
        self.home = Path(tempfile.mkdtemp(prefix="flwr-home-")) if home is None else Path(home)
        self.bin_dir = Path(bin_dir) if bin_dir is not None else Path(sys.executable).parent
        self.startup_timeout = startup_timeout
        self.token = uuid.uuid4().hex
        self.port = 0
        self.superlink: subprocess.Popen[bytes] | None = None
        self.started_pids: set[int] = set()

    # ------------------------------------------------------------------ setup
    @property
    def env(self) -> dict[str, str]:
        """Environment of every process this runtime starts."""
        env = dict(os.environ)
        env.update(
            {
                "FLWR_HOME": str(self.home),
                "FLWR_LOCAL_SUPERLINK_HTTP_API_PORT": str(self.port),
                "FLWR_LOCAL_CONTROL_API_PORT": str(self.port),
                "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1",
                "FLWR_TELEMETRY_ENABLED": "0",
                "FLWR_DISABLE_UPDATE_CHECK": "1",
                # the SuperExec starts a run's process 0.2 s after it is submitted, not 1 s
                "FLWR_SUPEREXEC_TASK_POLL_INTERVAL": "0.2",
                "RAY_USAGE_STATS_ENABLED": "0",
                "PATH": f"{self.bin_dir}{os.pathsep}{os.environ.get('PATH', '')}",
                TOKEN_VAR: self.token,
            }
        )
        env.pop("PYTHONPATH", None)  # the SuperLink must not see the repository
        return env

    def start(self, attempts: int = 3) -> None:
        """Start the SuperLink (retrying on a port taken in the meantime)."""
        runtime = self.home / "local-superlink"
        runtime.mkdir(parents=True, exist_ok=True)
        for attempt in range(attempts):
            self.port = free_port()
            self.superlink = subprocess.Popen(
                [
                    str(self.bin_dir / "flower-superlink"),
                    "--insecure",
                    "--simulation",
                    "--isolation",
                    "subprocess",
                    "--host",
                    "127.0.0.1",
                    "--port",
                    str(self.port),
                    "--database",
                    str(runtime / "state.db"),
                    "--log-file",
                    str(runtime / "superlink.log"),
                ],
                cwd=runtime,
                env=self.env,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=(runtime / "superlink.stderr").open("ab"),
                start_new_session=True,
            )
            self.started_pids.add(self.superlink.pid)
            if self._wait_healthy():
                return
            self.stop_superlink()
            if attempt == attempts - 1:
                log = (runtime / "superlink.stderr").read_text(errors="replace")[-2000:]
                raise RuntimeError(
                    f"flower-superlink did not start on 127.0.0.1:{self.port}"
                    f" (see {runtime}):\n{log}"
                )

    def _wait_healthy(self) -> bool:
        assert self.superlink is not None
        deadline = time.monotonic() + self.startup_timeout
        while time.monotonic() < deadline:
            if self.superlink.poll() is not None:
                return False
            try:
                with urllib.request.urlopen(
                    f"http://127.0.0.1:{self.port}/health", timeout=0.5
                ) as response:
                    if response.status == 200:
                        return True
            except OSError:
                pass
            time.sleep(0.2)
        return False

    # -------------------------------------------------------------------- run
    def run(
        self,
        app_dir: Path,
        run_config: dict[str, Any],
        *,
        num_supernodes: int,
        log_path: Path,
        num_cpus_per_client: int = 1,
        timeout: float = 3600.0,
    ) -> RunOutcome:
        """`flwr run app_dir --stream` with the run config as a TOML override file."""
        if self.superlink is None or self.superlink.poll() is not None:
            raise RuntimeError("LocalFlower.run: the SuperLink is not running (call start())")
        overrides = self.home / f"run-config-{uuid.uuid4().hex[:8]}.toml"
        overrides.write_text(
            "".join(f"{key} = {toml_value(value)}\n" for key, value in run_config.items())
        )
        command = [
            str(self.bin_dir / "flwr"),
            "run",
            str(Path(app_dir).resolve()),
            "--stream",
            "--run-config",
            str(overrides),
            "--federation-config",
            f"num-supernodes={num_supernodes} "
            f"client-resources-num-cpus={toml_value(num_cpus_per_client)}",
        ]
        log_path.parent.mkdir(parents=True, exist_ok=True)
        start = time.perf_counter()
        with log_path.open("wb") as log:
            process = subprocess.Popen(
                command,
                cwd=self.home,
                env=self.env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
            self.started_pids.add(process.pid)
            try:
                returncode = process.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                _terminate([process.pid])
                process.wait()
                returncode = -1
        self.started_pids.discard(process.pid)  # reaped: the PID may be reused
        return RunOutcome(returncode, time.perf_counter() - start, log_path)

    # ------------------------------------------------------------------- stop
    def owned_pids(self) -> set[int]:
        """Live processes we started: descendants of our PIDs or carrying our token."""
        return owned_processes(self.started_pids, self.token)

    def stop_superlink(self) -> None:
        """Stop the SuperLink and everything it spawned (Ray may spawn while dying)."""
        for _ in range(5):
            pids = sorted(self.owned_pids())
            if not pids:
                break
            _terminate(pids)
        if self.superlink is not None:
            try:
                self.superlink.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass
        self.superlink = None

    def stop(self) -> None:
        """Stop everything this runtime started; remove a temporary FLWR_HOME."""
        self.stop_superlink()
        leftover = self.owned_pids()
        if self._own_home and not leftover:
            shutil.rmtree(self.home, ignore_errors=True)
        if leftover:
            raise RuntimeError(f"processes still alive after stop: {sorted(leftover)}")


def _raise_system_exit(signum: int, frame: Any) -> None:
    raise SystemExit(128 + signum)


def owned_processes(roots: set[int], token: str, *, groups: bool = False) -> set[int]:
    """Live PIDs among `roots`, (with `groups`) the members of their process groups,
    all their descendants, and every process carrying `token` in its environment
    (which catches those that outlived their parent). Never this process."""
    table = process_table()
    owned = {pid for pid in roots if pid in table}
    if groups:
        leaders = set(owned)
        owned |= {pid for pid, (_, pgid, _) in table.items() if pgid in leaders}
    changed = True
    while changed:
        children = {pid for pid, (ppid, _, _) in table.items() if ppid in owned} - owned
        changed = bool(children)
        owned |= children
    owned |= {pid for pid, (_, _, mark) in table.items() if mark == token}
    owned.discard(os.getpid())
    return owned


def process_table() -> dict[int, tuple[int, int, str | None]]:
    """pid -> (ppid, pgid, value of TOKEN_VAR or None) for this user's live processes."""
    table: dict[int, tuple[int, int, str | None]] = {}
    marker = TOKEN_VAR.encode() + b"="
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            fields = stat[stat.rindex(")") + 2 :].split()
            if fields[0] == "Z":
                continue  # zombies are gone already; their parent reaps them
            token = None
            for item in (entry / "environ").read_bytes().split(b"\0"):
                if item.startswith(marker):
                    token = item[len(marker) :].decode()
            table[int(entry.name)] = (int(fields[1]), int(fields[2]), token)
        except (OSError, ValueError, IndexError):
            continue
    return table


def _terminate(pids: list[int], grace: float = 10.0) -> None:
    """SIGTERM each PID, wait up to `grace` seconds, SIGKILL the survivors."""
    for pid in pids:
        _signal(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    alive = list(pids)
    while alive and time.monotonic() < deadline:
        time.sleep(0.1)
        alive = [pid for pid in alive if _alive(pid)]
    for pid in alive:
        _signal(pid, signal.SIGKILL)


def _signal(pid: int, sig: signal.Signals) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    if stat[stat.rindex(")") + 2] == "Z":
        try:  # reap our own zombie children so they do not linger
            os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            pass
        return False
    return True
