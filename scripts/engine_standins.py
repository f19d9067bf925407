"""Run the simulations app on the mnist / cifar10 stand-ins in Flower's Ray engine.

The real image tasks download from the Hugging Face hub, which this machine cannot
reach, and the run config has no key for an in-memory data set. This script runs the
app's own ServerApp and ClientApp (both APIs' code paths, chosen by ``api``) through
``flwr.simulation.run_simulation`` with the small in-memory stand-ins of
tests/standins.py installed where the app loads its task, in the ServerApp process
and in every Ray worker (the wrappers below are pickled by value, as this file runs
as ``__main__``). Usage::

    python scripts/engine_standins.py --api message --rounds 2 --output-dir outputs-standins

Prints one line per (task, strategy): rounds, final objective, relative gap, accuracy.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))  # standins
sys.path.insert(0, str(ROOT))  # simulations

from flwr.app import Context, Message  # noqa: E402
from flwr.clientapp import ClientApp  # noqa: E402
from flwr.serverapp import Grid, ServerApp  # noqa: E402
from flwr.simulation import run_simulation  # noqa: E402
from standins import image_standin  # noqa: E402

IMAGES = {"mnist": ((28, 28), "image"), "cifar10": ((32, 32, 3), "img")}
NUM_CLIENTS = 4


def install_standin(task: str) -> None:
    """Make the app's `load_task` use the in-memory stand-in of `task` (this process)."""
    import simulations.admm_app.evaluation as evaluation

    if getattr(evaluation, "_standin_task", None) == task:
        return
    shape, column = IMAGES[task]
    standin = image_standin(shape, column, n_train=200)
    real = getattr(evaluation, "_real_load_task", evaluation.load_task)
    evaluation._real_load_task = real  # type: ignore[attr-defined]
    evaluation.load_task = lambda name, **options: real(name, dataset=standin, **options)
    evaluation._cached_task.cache_clear()
    evaluation._standin_task = task  # type: ignore[attr-defined]


def make_apps(run_config: dict[str, Any]) -> tuple[ServerApp, ClientApp]:
    """Return the app's ServerApp and ClientApp with `run_config` and the stand-in set."""
    server = ServerApp()

    @server.main()
    def main(grid: Grid, context: Context) -> None:
        from simulations.admm_app.server_app import main as app_main

        install_standin(run_config["task"])
        context.run_config = dict(run_config)
        app_main(grid, context)

    class StandinClientApp(ClientApp):
        def __call__(self, message: Message, context: Context) -> Message:
            from simulations.admm_app.client_app import app

            install_standin(run_config["task"])
            # the engine forbids changing context.run_config: a copy sharing the state
            with_config = Context(
                run_id=context.run_id,
                node_id=context.node_id,
                node_config=context.node_config,
                state=context.state,
                run_config=dict(run_config),
            )
            return app(message, with_config)

    return server, StandinClientApp()


def main() -> int:
    """Run every (task, strategy) for `--rounds` rounds; 1 if any run is incomplete."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--api", default="message", choices=["message", "legacy"])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--tasks", default="mnist,cifar10")
    parser.add_argument("--strategies", default="fedadmm,fedavg,fedprox,fednova")
    parser.add_argument("--output-dir", default="outputs-standins")
    args = parser.parse_args()
    # Ray workers import the app too: they inherit this process's environment
    os.environ["PYTHONPATH"] = os.pathsep.join(
        [str(ROOT), str(ROOT / "tests"), *filter(None, [os.environ.get("PYTHONPATH")])]
    )
    output_dir = Path(args.output_dir).resolve()
    failed = 0
    for task in args.tasks.split(","):
        for strategy in args.strategies.split(","):
            run_config = {
                "api": args.api,
                "task": task,
                "strategy": strategy,
                "num-server-rounds": args.rounds,
                "num-clients": NUM_CLIENTS,
                "partitioner": "iid",
                "output-dir": str(output_dir),
                "run-tag": args.api,
            }
            server, client = make_apps(run_config)
            started = time.monotonic()
            run_simulation(
                server_app=server,
                client_app=client,
                num_supernodes=NUM_CLIENTS,
                backend_config={
                    "client_resources": {"num_cpus": 1, "num_gpus": 0.0},
                    "init_args": {"num_cpus": 2, "include_dashboard": False},
                },
            )
            seconds = time.monotonic() - started
            path = output_dir / task / f"{strategy}-{args.api}.json"
            document = json.loads(path.read_text()) if path.exists() else {}
            rounds = document.get("rounds", [])
            last = rounds[-1] if rounds else {}
            ok = document.get("status") == "complete" and last.get("round") == args.rounds
            failed += not ok
            print(
                f"{task} {strategy} api={args.api}: status={document.get('status')} "
                f"rounds={last.get('round')} objective={last.get('objective')} "
                f"relative_gap={last.get('relative_gap')} "
                f"test_accuracy={last.get('test_accuracy')} "
                f"results={last.get('num_results')} failures={last.get('num_failures')} "
                f"({seconds:.1f} s)",
                flush=True,
            )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
