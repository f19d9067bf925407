"""The ClientApp: one train handler for FedAvg, FedProx, FedADMM, SCAFFOLD and FedDyn.

What the message says picks the local objective (the user's optimizer in every case):

- ``peer-algorithm = "scaffold"`` (`flwr_admm.serverapp.SCAFFOLD`): steps on
  grad f_i - c_i + c, then c_i+ = the mean of the raw minibatch gradients;
- ``peer-algorithm = "feddyn"`` (`flwr_admm.serverapp.FedDyn`): f_i - <grad_i, w>
  + alpha/2 ||w - x||^2, then grad_i -= alpha (w_i - x);
- ``rho`` (`flwr_admm.serverapp.FedADMM`) with run-config handler = "torchadmm":
  `flwr_admm.torch.TorchADMM`'s w-step (warm start, proximal step after each step);
  ``admm-form = "linearized"`` (``FedADMM(form="linearized")``): the same helper, the
  same loop, in its linearized form (start at z, <y_i, w> in the loss, the step budget);
- ``proximal-mu`` (Flower's FedProx, or FedADMM with handler = "fedprox"): the stock
  FedProx handler of Flower's FedProx docstring;
- otherwise (FedAvg): plain local training.

SCAFFOLD's c_i and FedDyn's grad_i stay in ``context.state``, written last (a handler
that raises leaves them as they were), with their round.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from numpy.typing import NDArray

from flwr_admm.clientapp import build_reply, build_scaffold_reply, received_arrays, received_control
from flwr_admm.clientapp.identity import identity_reply
from flwr_admm.torch import TorchADMM, state_arrays
from quickstart_admm.task import (
    Net,
    Settings,
    make_optimizer,
    node_loaders,
    round_seed,
    test,
)
from quickstart_admm.task import train as train_epochs

app = ClientApp()

SCAFFOLD_C = "quickstart.scaffold.c"  # context.state: c_i
FEDDYN_GRAD = "quickstart.feddyn.grad"  # context.state: grad_i
STATE_ROUND = "quickstart.state.round"  # context.state: the round that wrote them

Named = dict[str, NDArray[Any]]


class Node:
    """One node's round: settings, partition, loaders and a fresh model."""

    def __init__(self, msg: Message, context: Context) -> None:
        torch.set_num_threads(1)
        self.msg, self.context = msg, context
        self.settings = Settings.from_run_config(context.run_config)
        self.config = msg.content.config_records.get("config", ConfigRecord())
        self.partition_id = int(context.node_config["partition-id"])
        nodes = int(context.node_config["num-partitions"])
        if nodes != self.settings.num_partitions:
            raise ValueError(
                f"num-partitions: the run config says {self.settings.num_partitions}, the "
                f"federation has {nodes} nodes (set num-supernodes to the same number)"
            )
        self.server_round = int(self.config.get("server-round", 0))  # type: ignore[arg-type]
        torch.manual_seed(round_seed(self.settings.seed, self.server_round, self.partition_id))
        self.train_loader, self.val_loader = node_loaders(
            self.settings, self.partition_id, self.server_round
        )
        self.num_examples = len(self.train_loader.dataset)  # type: ignore[arg-type]
        self.model = Net(self.settings.batch_norm)

    def load_received(self) -> None:
        """Load the received arrays into the model."""
        self.model.load_state_dict(self.msg.content.array_records["arrays"].to_torch_state_dict())

    def reply(self, loss: float) -> Message:
        """Return the quickstart's reply: the model's state_dict and its metrics."""
        metrics = MetricRecord({"train-loss": loss, "num-examples": self.num_examples})
        content = RecordDict({"arrays": ArrayRecord(self.model.state_dict()), "metrics": metrics})
        return Message(content=content, reply_to=self.msg)

    def keep(self, name: str, arrays: Named) -> None:
        """Save `arrays` (float64) in ``context.state`` under `name`, with the round."""
        record = ArrayRecord({n: Array(np.asarray(a, dtype=np.float64)) for n, a in arrays.items()})
        self.context.state.array_records[name] = record
        self.context.state.config_records[STATE_ROUND] = ConfigRecord({name: self.server_round})

    def kept(self, name: str, like: Named) -> Named:
        """Return the arrays kept under `name`, or zeros shaped as `like`."""
        record = self.context.state.array_records.get(name)
        if record is None or list(record.keys()) != list(like):
            return {n: np.zeros(np.shape(a)) for n, a in like.items()}
        return {n: record[n].numpy() for n in like}


@app.train()
def train(msg: Message, context: Context) -> Message:
    """Train on the local partition under whichever strategy sent the message."""
    node = Node(msg, context)
    peer = node.config.get("peer-algorithm")
    if peer == "scaffold":
        return scaffold_train(node)
    if peer == "feddyn":
        return feddyn_train(node)
    if peer is not None:
        raise ValueError(f"peer-algorithm: must be 'scaffold' or 'feddyn', got {peer!r}")
    linearized = node.config.get("admm-form") == "linearized"
    if ("rho" in node.config or linearized) and node.settings.handler == "torchadmm":
        return admm_train(node)
    if "proximal-mu" in node.config:
        return fedprox_train(node)
    return fedavg_train(node)


def fedavg_train(node: Node) -> Message:
    """FedAvg: the quickstart's local training from the received model."""
    node.load_received()
    optimizer = make_optimizer(node.model, node.settings)
    loss, _ = train_epochs(node.model, node.train_loader, node.settings.local_epochs, optimizer)
    return node.reply(loss)


def fedprox_train(node: Node) -> Message:
    """Run a stock FedProx handler, as Flower's FedProx docstring writes it.

    loss + mu/2 sum_k ||w_k - received_k|| (the norm, not its square, as users copy it).
    """
    node.load_received()
    global_params = [p.detach().clone() for p in node.model.parameters()]  # a list
    mu = float(node.config["proximal-mu"])  # type: ignore[arg-type]

    def proximal_term() -> torch.Tensor:
        term = torch.zeros(())
        for local_weights, global_weights in zip(
            node.model.parameters(), global_params, strict=True
        ):
            term = term + (local_weights - global_weights).norm(2)
        return (mu / 2) * term

    optimizer = make_optimizer(node.model, node.settings)
    loss, _ = train_epochs(
        node.model, node.train_loader, node.settings.local_epochs, optimizer, penalty=proximal_term
    )
    return node.reply(loss)


def admm_train(node: Node) -> Message:
    """FedADMM: `TorchADMM` around the same loop (flwr_admm/torch/step.py's recipe)."""
    admm = TorchADMM.from_message(node.model, node.msg, node.context)
    admm.start()  # the warm start (or the received center v_i) into the model
    optimizer = make_optimizer(node.model, node.settings)
    loss, _ = train_epochs(
        node.model,
        node.train_loader,
        node.settings.local_epochs,
        optimizer,
        penalty=admm.penalty_term,
        after_step=lambda: admm.after_step(optimizer),
    )
    return admm.reply(num_examples=node.num_examples, metrics={"train-loss": loss})


def scaffold_train(node: Node) -> Message:
    """SCAFFOLD: K steps on grad f_i - c_i + c; c_i+ = the mean raw gradient of the K steps.

    With plain SGD of step lr, x - y_i = lr sum_k (g_k - c_i + c), so option II's
    c_i+ = c_i - c + (x - y_i) / (K lr) is exactly mean_k g_k. The mean of the
    gradients is computed directly so that momentum and Adam, which do not move
    x - y_i by lr per step, still give the average local gradient.
    """
    node.load_received()
    c = received_control(node.msg)
    c_i = node.kept(SCAFFOLD_C, c)
    named = dict(node.model.named_parameters())
    correction = {n: torch.as_tensor(c[n] - c_i[n], dtype=p.dtype) for n, p in named.items()}
    gradient_sum = {n: torch.zeros_like(p) for n, p in named.items()}

    def correct() -> None:
        for name, p in named.items():
            if p.grad is not None:
                gradient_sum[name] += p.grad
                p.grad += correction[name]  # grad f_i(y) - c_i + c

    optimizer = make_optimizer(node.model, node.settings)
    loss, steps = train_epochs(
        node.model, node.train_loader, node.settings.local_epochs, optimizer, before_step=correct
    )
    c_plus = dict(c_i)
    if steps:
        c_plus.update({n: gradient_sum[n].double().numpy() / steps for n in named})
    change = {n: c_plus[n] - c_i[n] for n in c}
    reply = build_scaffold_reply(
        node.msg,
        state_arrays(node.model),
        change,
        node.num_examples,
        {"train-loss": loss},
        node.context,
    )
    node.keep(SCAFFOLD_C, c_plus)  # last: a failure above leaves c_i as it was
    return reply


def feddyn_train(node: Node) -> Message:
    """FedDyn: f_i - <grad_i, w> + alpha/2 ||w - x||^2 from x; then grad_i -= alpha (w_i - x)."""
    node.load_received()
    alpha = node.config.get("feddyn-alpha")
    if (
        isinstance(alpha, bool)
        or not isinstance(alpha, int | float)
        or not (math.isfinite(alpha) and alpha > 0)
    ):
        raise ValueError(f"feddyn-alpha: must be a finite number > 0, got {alpha!r}")
    x = received_arrays(node.msg)
    grad_i = node.kept(FEDDYN_GRAD, x)
    named = dict(node.model.named_parameters())
    x_t = {n: torch.as_tensor(x[n], dtype=p.dtype) for n, p in named.items()}
    g_t = {n: torch.as_tensor(grad_i[n], dtype=p.dtype) for n, p in named.items()}

    def dynamic_term() -> torch.Tensor:
        term = torch.zeros(())
        for name, p in named.items():
            term = term - torch.sum(g_t[name] * p) + alpha / 2 * torch.sum((p - x_t[name]) ** 2)
        return term

    optimizer = make_optimizer(node.model, node.settings)
    loss, _ = train_epochs(
        node.model, node.train_loader, node.settings.local_epochs, optimizer, penalty=dynamic_term
    )
    w = state_arrays(node.model)
    reply = build_reply(node.msg, w, node.num_examples, {"train-loss": loss})
    new_grad = {n: grad_i[n] - alpha * (np.asarray(w[n], np.float64) - x[n]) for n in x}
    node.keep(FEDDYN_GRAD, new_grad)  # last: a failure above leaves grad_i as it was
    return reply


@app.query()
def query(msg: Message, context: Context) -> Message:
    """Name this node's partition-id to a strategy with ``ClientPolicy(identify=True)``."""
    return identity_reply(msg, context)


@app.evaluate()
def evaluate(msg: Message, context: Context) -> Message:
    """Evaluate the received model on the node's validation rows."""
    node = Node(msg, context)
    node.load_received()
    loss, accuracy = test(node.model, node.val_loader)
    metrics = MetricRecord(
        {
            "eval-loss": loss,
            "eval-acc": accuracy,
            "num-examples": len(node.val_loader.dataset),  # type: ignore[arg-type]
        }
    )
    return Message(content=RecordDict({"metrics": metrics}), reply_to=msg)
