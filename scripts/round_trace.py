"""Count the library code the server side of one Message-API FedADMM round runs.

One round of ``flwr_admm.FedADMM()`` (its defaults) on seed 000's task, 10 numpy
clients (`ADMMClient` behind `make_client_app`), Flower's ``strategy.start`` on the
in-process grid. Round 1 fills the client records; round 2's four strategy methods
(configure / aggregate, train / evaluate) are traced. A Python call
counts when its code is in ``flwr_admm/`` and no frame of Flower's ClientApp is below
it (the client side is left out), and the grid stand-in itself
(``flwr_admm/serverapp/testing.py``, Flower's Grid in a deployment) is left out too:

    python scripts/round_trace.py            # files, functions, call edges
    python scripts/round_trace.py --files    # and the files, by number of calls

Prints the number of library files run, of distinct functions, of distinct
caller -> callee edges between library functions (the "hops"), and of calls.
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from pathlib import Path
from types import FrameType
from typing import Any

import numpy as np
from flwr.app import ArrayRecord, Context

import flwr_admm
from flwr_admm.client import ADMMClient
from flwr_admm.clientapp import make_client_app
from flwr_admm.data.seed_logreg import seed_logreg
from flwr_admm.models import LogisticRegression
from flwr_admm.serverapp.testing import InProcessGrid, run_strategy

PACKAGE = str(Path(flwr_admm.__file__).resolve().parent)
GRID = str(Path(PACKAGE, "serverapp", "testing.py"))
TRACED_ROUND = 2
METHODS = ("configure_train", "aggregate_train", "configure_evaluate", "aggregate_evaluate")


def client_app() -> Any:
    """Return the numpy client of the seed task (its default settings) as a ClientApp."""
    data = seed_logreg()

    def client_fn(context: Context) -> ADMMClient:
        i = int(context.node_config["partition-id"])
        model = LogisticRegression(20, l2=0.01, fit_intercept=False)
        return ADMMClient(model, data.X[i], data.y[i], context=context)

    return make_client_app(client_fn)


def on_client_side(frame: FrameType | None) -> bool:
    """Whether Flower's ClientApp, or the grid's delivery to it, is on the stack below `frame`."""
    while frame is not None:
        name = frame.f_code.co_filename
        if (name == GRID and frame.f_code.co_name == "_deliver") or name.endswith(
            "flwr/clientapp/client_app.py"
        ):
            return True
        frame = frame.f_back
    return False


class Trace:
    """A ``sys.setprofile`` hook recording library calls while `active`."""

    def __init__(self) -> None:
        self.active = False
        self.calls: Counter[tuple[str, str]] = Counter()
        self.edges: set[tuple[tuple[str, str], tuple[str, str]]] = set()

    def __call__(self, frame: FrameType, event: str, arg: object) -> None:
        """Record one call event (``sys.setprofile`` calls this for every event)."""
        if not self.active or event != "call":
            return
        name = frame.f_code.co_filename
        if not name.startswith(PACKAGE) or name == GRID or on_client_side(frame):
            return
        callee = (str(Path(name).relative_to(PACKAGE)), frame.f_code.co_qualname)
        self.calls[callee] += 1
        caller = frame.f_back
        while caller is not None and not caller.f_code.co_filename.startswith(PACKAGE):
            caller = caller.f_back  # through numpy / flwr frames to the library caller
        if caller is not None:
            origin = str(Path(caller.f_code.co_filename).relative_to(PACKAGE))
            self.edges.add(((origin, caller.f_code.co_qualname), callee))


def main(argv: list[str] | None = None) -> int:
    """Run two rounds, trace the second; print the counts."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", action="store_true", help="list the files run")
    args = parser.parse_args(argv)
    trace = Trace()
    strategy = flwr_admm.FedADMM()
    for name in METHODS:
        bound = getattr(strategy, name)

        def traced(server_round: int, *rest: Any, _bound: Any = bound, **kw: Any) -> Any:
            trace.active = server_round == TRACED_ROUND
            try:
                return _bound(server_round, *rest, **kw)
            finally:
                trace.active = False

        setattr(strategy, name, traced)
    grid = InProcessGrid(client_app(), 10)
    sys.setprofile(trace)
    try:
        run_strategy(strategy, grid, ArrayRecord([np.zeros(20)]), TRACED_ROUND)
    finally:
        sys.setprofile(None)
    files = Counter(file for file, _ in trace.calls.elements())
    print(
        f"server side of round {TRACED_ROUND} ({', '.join(METHODS)}): "
        f"{len(files)} library files, {len(trace.calls)} functions, "
        f"{len(trace.edges)} call edges, {sum(trace.calls.values())} calls"
    )
    if args.files:
        for file, count in files.most_common():
            print(f"{count:6d}  {file}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
