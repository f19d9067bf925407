"""The momentum start's steady gate on the CNN task: how often it opens, and what then.

Runs `benchmarks.cnn`'s in-process CNN task (Flower's PyTorch quickstart, our
`TorchADMM` handler) with ``FedADMM(form=Linearized(momentum=beta, steady=tau))`` for
each tau, every node training every round, and prints per seed the final central
accuracy and the rounds whose start the momentum moved (the ``start_momentum`` round
metric). tau = 0.9 is ``FedADMM()``'s default (`flwr_admm.core.linearized`); "none"
is the start without a gate (the restart test alone):

    python scripts/momentum_gate.py --tasks cnn-sgd --seeds 0,1,2 --steady 0.9,0.8,none
    python scripts/momentum_gate.py --tasks cnn-sgd --set learning-rate=0.01   # small steps

The example's ``fedadmm-linearized`` strategy builds ``Linearized(...)`` from its module
namespace; this script binds that name to the gate under test for each run.
"""

from __future__ import annotations

import argparse
import functools
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import cnn
from benchmarks.common import quiet_flower
from flwr_admm.core.linearized import Linearized


def run_config_overrides(text: str) -> dict[str, float]:
    """Return ``key=value`` items (comma-separated numbers) as run-config overrides."""
    known = cnn.run_config({})
    overrides: dict[str, float] = {}
    for item in filter(None, text.split(",")):
        key, _, value = item.partition("=")
        try:
            number: float | None = float(value)
        except ValueError:
            number = None
        if number is None or key not in known:
            raise ValueError(
                f"--set: expected key=number items of the example's config, got {item!r}"
            )
        overrides[key] = number
    return overrides


def main(argv: list[str] | None = None) -> int:
    """Run each gate on each task and seed; print accuracy and the moved rounds."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", default="cnn-sgd")
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--steady", default="0.9,0.8", help='taus, or "none" for no gate')
    parser.add_argument("--momentum", type=float, default=0.9)
    parser.add_argument(
        "--set", default="", help="run-config overrides, e.g. learning-rate=0.01,momentum=0.0"
    )
    args = parser.parse_args(argv)
    overrides = run_config_overrides(args.set)
    quiet_flower()
    cnn.example_on_path()
    import quickstart_admm.server_app as server_app

    for text in args.steady.split(","):
        steady = None if text == "none" else float(text)
        server_app.Linearized = functools.partial(  # type: ignore[misc]
            Linearized, momentum=args.momentum, steady=steady
        )
        for task in args.tasks.split(","):
            finals = []
            for seed in (int(s) for s in args.seeds.split(",")):
                rounds = 30 * cnn.ROUNDS_FACTOR.get(task, 1)
                run = {**cnn.TASKS[task], **overrides, "strategy": "fedadmm-linearized"}
                with tempfile.TemporaryDirectory() as out:
                    config = {**run, "seed": seed, "num-server-rounds": rounds, "output-dir": out}
                    accuracies, moved = cnn.run_one(cnn.run_config(config))
                final = accuracies[-1] if len(accuracies) == rounds + 1 else float("nan")
                finals.append(final)
                print(f"steady {text} {task} seed {seed}: final {final:.3f}, moved {moved}")
            print(f"steady {text} {task}: mean {sum(finals) / len(finals):.3f}", flush=True)
    server_app.Linearized = Linearized  # type: ignore[misc]
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
