"""Make the repository root importable, so tests can import `simulations` (the Flower
App and its commands live next to the package, not inside it) under a bare `pytest`."""

import sys
from pathlib import Path

ROOT = str(Path(__file__).resolve().parents[1])
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)
