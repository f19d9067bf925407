"""Network namespaces for a deployment: the SuperLink and each SuperNode on its own stack.

`Namespaces(slots, tag).create()` makes one namespace for the SuperLink holding a
bridge ``br0`` with address 10.77.0.1/24, and one namespace per SuperNode slot, each
joined to the bridge by a veth pair whose node end ``eth0`` has 10.77.0.(slot+2)/24.
Traffic between a SuperNode and the SuperLink therefore leaves one network stack
through a veth interface and enters another: it is not loopback. The subnet is the
same for every deployment because it only exists inside the namespaces made for the
run (the host's routes are untouched), and namespace names carry the run's tag.
`remove()` deletes the namespaces (and with them the veths and the bridge).

`available()` says whether namespaces can be made here (root, ``ip`` present, a probe
namespace with a bridge can be created and removed) and why not otherwise, so the
caller falls back to loopback and says which it used.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import uuid

SUBNET = "10.77.0"
LINK_ADDRESS = f"{SUBNET}.1"


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30, check=check)


def available() -> tuple[bool, str]:
    """Whether network namespaces with veths and a bridge can be made; the reason."""
    if not hasattr(os, "geteuid") or os.geteuid() != 0:
        return False, "not root (network namespaces need CAP_SYS_ADMIN)"
    if shutil.which("ip") is None:
        return False, "the `ip` tool (iproute2) is not installed"
    probe = f"fa-probe-{uuid.uuid4().hex[:8]}"
    try:
        _ip("netns", "add", probe)
        _ip("-n", probe, "link", "add", "br0", "type", "bridge")
        _ip("-n", probe, "link", "add", "v0", "type", "veth", "peer", "name", "v1")
    except (subprocess.CalledProcessError, OSError, subprocess.TimeoutExpired) as error:
        detail = getattr(error, "stderr", "") or str(error)
        return False, f"cannot create a namespace, bridge or veth: {detail.strip()}"
    finally:
        _ip("netns", "del", probe, check=False)
    return True, "root and `ip netns add` works"


class Namespaces:
    """One namespace for the SuperLink and one per SuperNode slot, bridged by veths."""

    def __init__(self, slots: int, tag: str) -> None:
        if slots < 1:
            raise ValueError(f"slots: must be >= 1, got {slots}")
        if slots > 250:
            raise ValueError(f"slots: the /24 subnet holds at most 250 SuperNodes, got {slots}")
        self.slots = slots
        self.link = f"fa-{tag}-l"
        self.nodes = [f"fa-{tag}-n{slot}" for slot in range(slots)]
        self.created: list[str] = []

    def node_address(self, slot: int) -> str:
        """The IPv4 address of SuperNode slot `slot` (10.77.0.(slot+2))."""
        return f"{SUBNET}.{slot + 2}"

    def create(self) -> None:
        """Make the namespaces, the bridge and the veth pairs; undo all on failure."""
        try:
            self._add(self.link)
            _ip("-n", self.link, "link", "add", "br0", "type", "bridge")
            _ip("-n", self.link, "addr", "add", f"{LINK_ADDRESS}/24", "dev", "br0")
            _ip("-n", self.link, "link", "set", "br0", "up")
            for slot, name in enumerate(self.nodes):
                self._add(name)
                port = f"vn{slot}"
                _ip(
                    "-n", self.link, "link", "add", port, "type", "veth",
                    "peer", "name", "eth0", "netns", name,
                )  # fmt: skip
                _ip("-n", self.link, "link", "set", port, "master", "br0", "up")
                _ip("-n", name, "addr", "add", f"{self.node_address(slot)}/24", "dev", "eth0")
                _ip("-n", name, "link", "set", "eth0", "up")
        except BaseException:
            self.remove()
            raise

    def _add(self, name: str) -> None:
        _ip("netns", "add", name)
        self.created.append(name)
        _ip("-n", name, "link", "set", "lo", "up")

    def wrap(self, namespace: str, command: list[str]) -> list[str]:
        """`command` run inside `namespace` (``ip netns exec`` execs it: same PID)."""
        return ["ip", "netns", "exec", namespace, *command]

    def remove(self) -> list[str]:
        """Delete every namespace created (veths and bridge go with them); return the
        names that could not be deleted."""
        failed = []
        for name in reversed(self.created):
            if _ip("netns", "del", name, check=False).returncode != 0:
                failed.append(name)
        self.created = failed
        return failed

    def existing(self) -> list[str]:
        """Namespaces of this deployment the kernel still lists."""
        listed = _ip("netns", "list", check=False).stdout.split()
        ours = {self.link, *self.nodes}
        return [name for name in listed if name in ours]
