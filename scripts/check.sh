#!/usr/bin/env bash
# The project's one test command: lint, format, types, then the test suite.
# pytest exits 5 when it collects no test; `set -e` turns that into a failure.
set -euo pipefail
cd "$(dirname "$0")/.."
python -m ruff check .
python -m ruff format --check .
python -m mypy flwr_admm benchmarks simulations
python -m pytest -q "$@"
