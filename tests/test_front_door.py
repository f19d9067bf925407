"""The front door: top-level names are the Message API's; each name is exported once.

`from flwr_admm import FedADMM` gives the Message-API strategy (it has ``start``), as
Flower's current API is `flwr.serverapp.strategy`; the legacy classes stay in
`flwr_admm.server` and `flwr_admm.client`. A subpackage exports only what it owns, the
top-level hub re-exports a few of those and exports the option values of its own
module `flwr_admm.options`, and the whole package exports at most `MAX_EXPORTS` names.
"""

from __future__ import annotations

import importlib
from pathlib import Path

import flwr.server.strategy
import flwr.serverapp.strategy
from flwr.client import NumPyClient

import flwr_admm
import flwr_admm.client
import flwr_admm.server
import flwr_admm.serverapp

PACKAGE = Path(flwr_admm.__file__).resolve().parent
STRATEGIES = ("FedADMM", "FedADMMClientDuals", "SCAFFOLD", "FedDyn", "FedNova")
MAX_EXPORTS = 55  # __all__ entries over every __init__.py (house issue 24)


def exporting_packages() -> list[str]:
    """Every subpackage of `flwr_admm` (not the hub) whose ``__init__`` has ``__all__``."""
    names = sorted(
        ".".join(("flwr_admm", *path.parent.relative_to(PACKAGE).parts))
        for path in PACKAGE.rglob("__init__.py")
        if path.parent != PACKAGE
    )
    return [name for name in names if hasattr(importlib.import_module(name), "__all__")]


def test_top_level_fedadmm_is_the_message_api_one_and_has_start() -> None:
    assert flwr_admm.FedADMM is flwr_admm.serverapp.FedADMM
    assert callable(flwr_admm.FedADMM.start)


def test_every_top_level_strategy_is_the_message_api_one() -> None:
    for name in STRATEGIES:
        strategy = getattr(flwr_admm, name)
        assert strategy is getattr(flwr_admm.serverapp, name), name
        assert issubclass(strategy, flwr.serverapp.strategy.Strategy), name
        legacy = getattr(flwr_admm.server, name)
        assert issubclass(legacy, flwr.server.strategy.Strategy), name
        assert not issubclass(legacy, flwr.serverapp.strategy.Strategy), name
    assert issubclass(flwr_admm.client.ADMMClient, NumPyClient)
    assert not hasattr(flwr_admm, "ADMMClient")  # the legacy client: flwr_admm.client


def test_a_subpackage_exports_only_what_it_owns() -> None:
    foreign = {
        f"{package}.{name}": owner.__module__
        for package in exporting_packages()
        for name in importlib.import_module(package).__all__
        if hasattr(owner := getattr(importlib.import_module(package), name), "__module__")
        and not owner.__module__.startswith(f"{package}.")
    }
    assert foreign == {}


def test_the_hub_reexports_subpackage_names_and_the_count_stays_small() -> None:
    exported = {
        id(getattr(importlib.import_module(package), name))
        for package in exporting_packages()
        for name in importlib.import_module(package).__all__
    }
    owned = {  # the hub owns what its top-level modules (flwr_admm.options) define
        name
        for name in flwr_admm.__all__
        if (PACKAGE / f"{getattr(flwr_admm, name).__module__.split('.')[-1]}.py").is_file()
        and getattr(flwr_admm, name).__module__.count(".") == 1
    }
    assert owned == {"Checkpointing", "ClientPolicy", "Convergence", "Uplink"}
    assert [
        name
        for name in flwr_admm.__all__
        if id(getattr(flwr_admm, name)) not in exported and name not in owned
    ] == []
    entries = len(flwr_admm.__all__) + sum(
        len(importlib.import_module(p).__all__) for p in exporting_packages()
    )
    assert entries <= MAX_EXPORTS
