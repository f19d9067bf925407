"""Make the examples' app packages importable (they are Flower Apps, not installed)."""

from __future__ import annotations

import sys
from pathlib import Path

QUICKSTART = Path(__file__).resolve().parents[2] / "examples" / "quickstart-pytorch"
if str(QUICKSTART) not in sys.path:
    sys.path.insert(0, str(QUICKSTART))
