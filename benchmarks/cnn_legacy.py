"""The CNN task on Flower's legacy API: ``flwr.server.strategy`` and a ``NumPyClient``.

The same workload as `benchmarks.cnn` (the quickstart's CNN on offline digits, the
user's momentum SGD or a BatchNorm layer, 10 nodes, Dirichlet(0.1), 30 rounds), with
the example's data, model and training loop, but through the legacy API: Flower's
``FedAvg`` against `flwr_admm.server.FedADMM` (its defaults) with a ``NumPyClient``
that wraps the loop in `flwr_admm.torch.TorchADMM.from_parameters`, on the in-process
driver `flwr_admm.testing.run_rounds`. Every node trains every round; the global
model is tested on the central test set after each round.

    python -m benchmarks.cnn_legacy [--quick] [--tasks cnn-sgd,cnn-bn] [--seeds 0,1,2]
"""

from __future__ import annotations

import random
import time
from typing import Any

import numpy as np

from benchmarks.cnn import (
    TASKS,
    example_on_path,
    print_table,
    run_cli,
    run_config,
    run_record,
    summary,
)

ROWS = ("FedAvg (legacy)", "FedADMM (defaults, legacy), TorchADMM")


def run_one(config: dict[str, Any], row: str) -> list[float]:
    """Run `row` on the legacy in-process driver; return the central accuracies."""
    example_on_path()
    import torch
    from flwr.client import NumPyClient
    from flwr.common import Context, ndarrays_to_parameters
    from flwr.server.strategy import FedAvg
    from quickstart_admm.task import (
        Net,
        Settings,
        central_test_loader,
        initial_model,
        make_optimizer,
        node_loaders,
        round_seed,
        test,
        train,
    )

    from flwr_admm.server import FedADMM
    from flwr_admm.testing import make_proxies, run_rounds
    from flwr_admm.torch import TorchADMM

    torch.set_num_threads(1)
    settings = Settings.from_run_config(config)
    names = list(Net(settings.batch_norm).state_dict())
    loader = central_test_loader()
    accuracies: list[float] = []

    def load(model: torch.nn.Module, arrays: list[Any]) -> None:
        state = {n: torch.as_tensor(np.asarray(a)) for n, a in zip(names, arrays, strict=True)}
        model.load_state_dict(state)

    def central(server_round: int, arrays: list[Any], _: dict[str, Any]) -> tuple[float, Any]:
        model = Net(settings.batch_norm)
        if not all(np.all(np.isfinite(a)) for a in arrays):
            accuracies.append(float("nan"))
            raise RuntimeError(f"round {server_round}: the global model is not finite")
        load(model, arrays)
        loss, accuracy = test(model, loader)
        accuracies.append(accuracy)
        return loss, {"accuracy": accuracy}

    class Node(NumPyClient):
        def __init__(self, context: Context) -> None:
            self.context = context
            self.partition_id = int(context.node_config["partition-id"])

        def fit(
            self, parameters: list[Any], config: dict[str, Any]
        ) -> tuple[list[Any], int, dict[str, Any]]:
            server_round = int(config["server_round"])
            torch.manual_seed(round_seed(settings.seed, server_round, self.partition_id))
            train_loader, _ = node_loaders(settings, self.partition_id, server_round)
            num_examples = len(train_loader.dataset)  # type: ignore[arg-type]
            model = Net(settings.batch_norm)
            epochs = settings.local_epochs
            if "rho" not in config:  # FedAvg
                load(model, parameters)
                train(model, train_loader, epochs, make_optimizer(model, settings))
                return [t.numpy() for t in model.state_dict().values()], num_examples, {}
            admm = TorchADMM.from_parameters(model, parameters, config, self.context)
            admm.start()
            optimizer = make_optimizer(model, settings)
            train(
                model,
                train_loader,
                epochs,
                optimizer,
                penalty=admm.penalty_term,
                after_step=lambda: admm.after_step(optimizer),
            )
            return admm.fit_result(num_examples)

    n = settings.num_partitions
    common: dict[str, Any] = {
        "fraction_fit": 1.0,
        "fraction_evaluate": 0.0,
        "min_fit_clients": n,
        "min_available_clients": n,
        "evaluate_fn": central,
    }
    strategy = (
        FedAvg(on_fit_config_fn=lambda r: {"server_round": r}, **common)
        if row.startswith("FedAvg")
        else FedADMM(tensor_names=names, **common)
    )
    arrays = [t.numpy() for t in initial_model(settings).state_dict().values()]
    proxies = make_proxies(lambda context: Node(context).to_client(), n)
    # Flower's ClientManager.sample orders the clients with Python's random; FedAvg's
    # mean then sums in that order, and momentum SGD turns the last-bit differences
    # into final accuracies 0.08 apart: seeded, a run is the same whatever ran before
    random.seed(settings.seed)
    central(0, arrays, {})  # round 0, as the Message API's evaluate_fn is called
    try:
        run_rounds(
            strategy,
            proxies,
            settings.num_server_rounds,
            initial_parameters=ndarrays_to_parameters(arrays),
        )
    except Exception as error:  # a diverged run: its rounds so far, then it failed
        print(f"  {row}, seed {settings.seed}: {type(error).__name__}: {error}")
    return accuracies


def run_task(task: str, seeds: list[int], rounds: int) -> dict[str, Any]:
    """Run both rows on `task` over `seeds`; print the table."""
    rows: dict[str, Any] = {}
    for row in ROWS:
        runs = []
        for seed in seeds:
            started = time.perf_counter()
            config = run_config({**TASKS[task], "seed": seed, "num-server-rounds": rounds})
            runs.append(run_record(seed, run_one(config, row), rounds, started))
        rows[row] = summary(runs)
    print_table(f"{task} (legacy API): final central accuracy after {rounds} rounds", rows, seeds)
    return {"task": task, "rounds": rounds, "seeds": seeds, "rows": rows}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Run the rows on the CNN tasks, print the tables, write JSON."""
    return run_cli(argv, __doc__, "cnn_legacy", "cnn-sgd,cnn-bn", run_task)


if __name__ == "__main__":
    main()
