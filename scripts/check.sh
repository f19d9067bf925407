#!/usr/bin/env bash
# The project's one test command: lint, format, types, then the test suite.
# pytest exits 5 when it collects no test; `set -e` turns that into a failure.
# Three xdist workers on the machine's 2 cores: tests/conftest.py starts the first on the
# deployments (mostly waiting on Flower's processes: about 4 minutes at little CPU, their
# 3 s polls shortened by simulations/fast_polls) and keeps a module, and every `flwr run`
# test, on one worker; the other two keep both cores busy meanwhile (552 s on 2 cores).
set -euo pipefail
cd "$(dirname "$0")/.."
python -m ruff check .
python -m ruff format --check .
python -m mypy flwr_admm benchmarks simulations
python -m pytest -q -n 3 "$@"
