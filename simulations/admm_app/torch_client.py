"""``framework = "torch"`` clients: `flwr_admm.torch.TorchADMM` in both Flower APIs.

The local loop is the numpy client's (`flwr_admm.core.local_solver`): the same
minibatches (`LocalPlan.batches`, generator seeded with [seed, partition-id, round]),
plain SGD of step lr, and after each step the decoupled proximal step of
`TorchADMM.after_step` (the numpy ``prox_step="exact"``). Each fit builds a fresh
module (seeded), runs one torch thread with deterministic algorithms, and replies
with the module's ``state_dict`` (BatchNorm statistics included). The legacy client
is a `NumPyClient` (`TorchAppClient`); the Message-API app (`torch_message_app`)
calls `TorchADMM.from_message` and `TorchADMM.reply` in its own ``@app.train()``.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from flwr.app import Context, Message, MetricRecord, RecordDict
from flwr.client import NumPyClient
from flwr.clientapp import ClientApp

from flwr_admm.core.local_solver import LocalPlan
from flwr_admm.data import Task
from flwr_admm.torch import TorchADMM, load_arrays

from .evaluation import get_task
from .run_config import RunSettings, parse_run_config
from .torch_task import TorchTaskModel, module_of, torch_task


def deterministic_torch() -> None:
    """One thread, deterministic kernels (a simulation runs one client per core)."""
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)


class TorchAppClient(NumPyClient):
    """A legacy client training this node's partition with `TorchADMM`."""

    def __init__(self, settings: RunSettings, task: Task, context: Context) -> None:
        deterministic_torch()
        self.settings, self.context = settings, context
        self.partition_id = int(context.node_config["partition-id"])
        self.model: TorchTaskModel = module_of(task)
        data = task.data
        self.X, self.y = (
            data.X[self.partition_id],
            self.model.encode_labels(data.y[self.partition_id]),
        )
        has_test = data.X_test is not None and data.y_test is not None
        self.X_val = data.X_test[self.partition_id] if has_test else self.X  # type: ignore[index]
        y_val = data.y_test[self.partition_id] if has_test else data.y[self.partition_id]  # type: ignore[index]
        self.y_val = self.model.encode_labels(y_val)

    def get_properties(self, config: dict[str, Any]) -> dict[str, Any]:
        """``{"partition-id": i}`` (the app's seeded sampling)."""
        return {"partition-id": self.partition_id}

    def fit(
        self, parameters: list[Any], config: dict[str, Any]
    ) -> tuple[list[Any], int, dict[str, Any]]:
        """Run the local loop from the warm start; reply with the ``state_dict``."""
        module = self.model.factory()
        admm = TorchADMM.from_parameters(module, parameters, config, self.context)
        metrics = self.train(admm, config)
        return admm.fit_result(int(self.X.shape[0]), metrics)

    def train(self, admm: TorchADMM, config: dict[str, Any]) -> dict[str, Any]:
        """Run ``local_steps`` / ``local_epochs`` SGD steps with the ADMM penalty.

        The loop starts where ``local-init`` says (`TorchADMM.start`'s ``init``).
        """
        admm.start(init=self.settings.local_init)  # type: ignore[arg-type]
        plan = plan_of(config, self.settings)
        module = admm.model
        optimizer = torch.optim.SGD(module.parameters(), lr=plan.learning_rate)
        X, y = torch.as_tensor(self.X, dtype=torch.float32), torch.as_tensor(self.y)
        server_round = int(config.get("server_round", config.get("server-round", 0)))
        rng = np.random.default_rng([self.settings.seed, self.partition_id, server_round])
        module.train()
        steps = 0
        for index in plan.batches(X.shape[0], rng):
            xb, yb = (X, y) if index is None else (X[index], y[index])
            if xb.shape[0] < 2 and any(
                isinstance(m, torch.nn.BatchNorm2d) for m in module.modules()
            ):
                continue  # BatchNorm cannot train on a batch of one
            optimizer.zero_grad()
            loss = module.loss(xb, yb)  # type: ignore[operator]
            # the prox term: in the loss or by the prox step below; the linearized form's
            # <y_i, w> is always in the loss
            if admm.penalty == "loss" or admm.form == "linearized":
                loss = loss + admm.penalty_term()
            loss.backward()
            optimizer.step()
            admm.after_step(optimizer)
            steps += 1
        module.eval()
        with torch.no_grad():
            loss = float(module.loss(X, y))  # type: ignore[operator]
        return {"loss": loss, "local_steps": steps}

    def evaluate(
        self, parameters: list[Any], config: dict[str, Any]
    ) -> tuple[float, int, dict[str, Any]]:
        """Loss and accuracy of the received model on the validation rows."""
        module = self.model.factory()
        load_arrays(module, dict(zip(self.model.tensor_names, parameters, strict=True)))
        module.eval()
        X, y = torch.as_tensor(self.X_val, dtype=torch.float32), torch.as_tensor(self.y_val)
        with torch.no_grad():
            logits = module(X)
            loss = float(module.loss(X, y))  # type: ignore[operator]
        accuracy = float((logits.argmax(dim=1) == y).double().mean())
        return loss, int(X.shape[0]), {"accuracy": accuracy}


def plan_of(config: dict[str, Any], settings: RunSettings) -> LocalPlan:
    """Return the local plan of the fit config (the numpy client's keys and defaults)."""
    epochs = config.get("local_epochs", settings.local_epochs)
    steps = None if epochs else config.get("local_steps", settings.local_steps)
    batch = config.get("batch_size", settings.batch_size) or None
    return LocalPlan(
        learning_rate=float(config.get("learning_rate", settings.learning_rate)),
        steps=None if steps is None else int(steps),
        epochs=None if not epochs else int(epochs),
        batch_size=None if batch is None else int(batch),
    )


def torch_client(context: Context) -> TorchAppClient:
    """Build this node's torch client from the run config."""
    settings = parse_run_config(context.run_config)
    task = get_task(settings.task, settings.seed, settings.task_options())
    settings = parse_run_config(context.run_config, task.defaults)
    return TorchAppClient(settings, torch_task(task, settings.model, settings.seed), context)


torch_message_app = ClientApp()


@torch_message_app.train()
def train(message: Message, context: Context) -> Message:
    """Run `TorchADMM` from the message: center, rho, warm start; reply with w_i."""
    client = torch_client(context)
    admm = TorchADMM.from_message(client.model.factory(), message, context)
    metrics = client.train(admm, admm.config)
    return admm.reply(int(client.X.shape[0]), metrics)


@torch_message_app.evaluate()
def evaluate(message: Message, context: Context) -> Message:
    """Evaluate the received model on this node's validation rows."""
    client = torch_client(context)
    record = next(iter(message.content.array_records.values()))
    loss, n, metrics = client.evaluate([a.numpy() for a in record.values()], {})
    reported = {**metrics, "loss": loss, "num-examples": n}
    return Message(RecordDict({"metrics": MetricRecord(reported)}), reply_to=message)
