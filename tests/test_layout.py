"""The package's layout rules, read from its source: what a reviewer would check by hand.

- `flwr_admm.core` imports nothing from `flwr` (and, run alone, loads no `flwr` module);
- the legacy API's package (`server`) and the Message API's (`serverapp`) import
  nothing from each other; what they share is the wire-neutral round layer
  (`rounds`), which imports neither API: only the core, the protocol, the option
  values (`flwr_admm.options`) and Flower's shared type aliases and logger;
- on the node side, the wire-neutral `node` imports no front end, and `clientapp`
  (Message API) nothing from `client` (legacy);
- no module of `flwr_admm` is longer than 450 lines;
- no class is built from two or more of the package's own classes (composition, not
  mixins).
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "flwr_admm"
MAX_LINES = 450


def modules() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


def imported_modules(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


def test_core_imports_nothing_from_flwr() -> None:
    offenders = {
        str(path.relative_to(PACKAGE)): sorted(
            name for name in imported_modules(path) if name == "flwr" or name.startswith("flwr.")
        )
        for path in sorted((PACKAGE / "core").rglob("*.py"))
    }
    assert {k: v for k, v in offenders.items() if v} == {}


def package_arrows(package: str) -> dict[str, set[str]]:
    """Each module of `package` with the other `flwr_admm` subpackages it imports."""
    arrows: dict[str, set[str]] = {}
    for path in sorted((PACKAGE / package).rglob("*.py")):
        targets = {
            name.split(".")[1] if "." in name else "flwr_admm"
            for name in imported_modules(path)
            if name == "flwr_admm" or name.startswith("flwr_admm.")
        }
        arrows[str(path.relative_to(PACKAGE))] = targets - {package}
    return arrows


def test_server_and_serverapp_import_nothing_from_each_other() -> None:
    crossing = {
        module: sorted(targets & {"server", "serverapp", "flwr_admm"})
        for package, other in (("server", "serverapp"), ("serverapp", "server"))
        for module, targets in package_arrows(package).items()
        if targets & {other, "flwr_admm"}
    }
    assert crossing == {}


NODE_FRONT_ENDS = {"client", "clientapp", "torch", "server", "serverapp", "testing", "flwr_admm"}


def test_node_imports_no_front_end_and_clientapp_not_the_legacy_client() -> None:
    crossing = {
        module: sorted(targets & NODE_FRONT_ENDS)
        for module, targets in package_arrows("node").items()
        if targets & NODE_FRONT_ENDS
    }
    crossing.update(
        {
            module: sorted(targets & {"client", "flwr_admm"})
            for module, targets in package_arrows("clientapp").items()
            if targets & {"client", "flwr_admm"}
        }
    )
    assert crossing == {}


# What the round layer may take from Flower: the type aliases and the logger both APIs
# use, and `Parameters`, the bytes container (one buffer per tensor) in which both
# translators hand over a reply's blocks and the uplink decodes its payloads.
ROUNDS_FLWR_NAMES = {
    "flwr.common": {"NDArrays", "Parameters", "Scalar"},
    "flwr.common.logger": {"log"},
}


def test_rounds_imports_neither_api() -> None:
    # the uplink decodes bytes, wire neutral; options are the strategies' checked values
    allowed = {"core", "options", "protocol", "uplink"}
    offenders: dict[str, list[str]] = {}
    for path in sorted((PACKAGE / "rounds").rglob("*.py")):
        bad = sorted(
            name
            for name in imported_modules(path)
            if (name.startswith("flwr_admm.") and name.split(".")[1] not in {*allowed, "rounds"})
            or name == "flwr_admm"
        )
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                bad += [a.name for a in node.names if a.name.split(".")[0] == "flwr"]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                if node.module.split(".")[0] == "flwr":
                    allowed_names = ROUNDS_FLWR_NAMES.get(node.module, set())
                    bad += [
                        f"{node.module}.{a.name}" for a in node.names if a.name not in allowed_names
                    ]
        if bad:
            offenders[str(path.relative_to(PACKAGE))] = bad
    assert offenders == {}


def test_options_import_no_strategy_code() -> None:
    """The option values sit below the round layer and both APIs: no import cycle."""
    imported = imported_modules(PACKAGE / "options.py")
    ours = sorted(name for name in imported if name.startswith("flwr_admm."))
    assert [name for name in ours if name.split(".")[1] not in {"core", "uplink"}] == []


def test_core_runs_without_flwr_installed() -> None:
    code = (
        "import sys\n"
        "class Block:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name == 'flwr' or name.startswith('flwr.'):\n"
        "            raise ImportError('flwr blocked')\n"
        "sys.meta_path.insert(0, Block())\n"
        "import importlib.util, pathlib, types\n"
        f"root = pathlib.Path({str(PACKAGE)!r})\n"
        "pkg = types.ModuleType('flwr_admm'); pkg.__path__ = [str(root)]\n"
        "sys.modules['flwr_admm'] = pkg\n"
        "import numpy as np\n"
        "from flwr_admm.core import ConsensusADMM\n"
        "from flwr_admm.core.types import Reply\n"
        "admm = ConsensusADMM([np.zeros(2)], 1.0)\n"
        "admm.step([Reply('a', [np.ones(2)], 3)], 1)\n"
        "print(admm.z[0].tolist())\n"
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "[1.0, 1.0]"  # z = w of the only client


def test_importing_the_package_imports_no_torch() -> None:
    code = (
        "import sys\n"
        "import flwr_admm, flwr_admm.client, flwr_admm.clientapp, flwr_admm.server\n"
        "import flwr_admm.serverapp, flwr_admm.core, flwr_admm.uplink, flwr_admm.models\n"
        "import flwr_admm.rounds\n"
        "import flwr_admm.testing\n"
        "print(sorted(m for m in sys.modules if m == 'torch' or m.startswith('torch.')))\n"
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "[]"


def test_only_flwr_admm_torch_imports_torch() -> None:
    offenders = sorted(
        str(path.relative_to(PACKAGE))
        for path in modules()
        if path.parent.name != "torch"
        and any(n == "torch" or n.startswith("torch.") for n in imported_modules(path))
    )
    assert offenders == []


def test_no_module_is_longer_than_450_lines() -> None:
    lengths = {str(p.relative_to(PACKAGE)): len(p.read_text().splitlines()) for p in modules()}
    assert {name: n for name, n in lengths.items() if n > MAX_LINES} == {}


def test_no_class_has_two_bases_from_the_package() -> None:
    ours: set[str] = set()
    bases_of: dict[str, list[str]] = {}
    for path in modules():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef):
                ours.add(node.name)
                bases_of[f"{path.relative_to(PACKAGE)}:{node.name}"] = [
                    base.id if isinstance(base, ast.Name) else ast.unparse(base)
                    for base in node.bases
                ]
    mixed = {
        name: bases
        for name, bases in bases_of.items()
        if sum(base.split(".")[-1] in ours for base in bases) >= 2
    }
    assert mixed == {}
