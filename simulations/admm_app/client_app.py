"""ClientApp: an `ADMMClient` on partition ``partition-id`` of the configured task.

``app`` serves both Flower APIs, chosen per message by the run config's ``api``:
``legacy`` runs ``ClientApp(client_fn=client_fn)``, ``message`` runs
`flwr_admm.clientapp.make_client_app` around the same client (``@app.train()`` /
``@app.evaluate()`` handlers), so both compute the same numbers.
"""

from __future__ import annotations

from flwr.app import MessageType
from flwr.client import Client, ClientApp
from flwr.client.mod import secaggplus_mod
from flwr.common import Context, Message, Scalar

from flwr_admm.client import ADMMClient
from flwr_admm.clientapp import make_client_app
from flwr_admm.clientapp.identity import identity_reply
from flwr_admm.protocol import IDENTITY_QUERY

from .evaluation import get_task
from .run_config import api_of, framework_of, parse_run_config, secure_aggregation_of


class AppClient(ADMMClient):
    """ADMMClient that also tells the server its partition-id (for seeded sampling)."""

    def get_properties(self, config: dict[str, Scalar]) -> dict[str, Scalar]:
        """``{"partition-id": i}``."""
        return {} if self.partition_id is None else {"partition-id": int(self.partition_id)}


def numpy_client_fn(context: Context) -> AppClient:
    """Build the (NumPy) client of this node's partition from the run config."""
    settings = parse_run_config(context.run_config)
    task = get_task(settings.task, settings.seed, settings.task_options())
    settings = parse_run_config(context.run_config, task.defaults)
    num_clients = task.data.num_clients
    partition_id = int(context.node_config["partition-id"])
    num_partitions = int(context.node_config.get("num-partitions", num_clients))
    if num_partitions != num_clients or not 0 <= partition_id < num_clients:
        raise ValueError(
            f"partition-id {partition_id} of num-partitions {num_partitions}: task "
            f"{settings.task!r} has {num_clients} clients; run with "
            f"num-supernodes={num_clients} (simulation) or node-config "
            f"'partition-id=0..{num_clients - 1} num-partitions={num_clients}' (deployment)"
        )
    data = task.data
    has_test = data.X_test is not None and data.y_test is not None
    return AppClient(
        task.make_model(),
        data.X[partition_id],
        data.y[partition_id],
        local_steps=settings.local_steps,
        local_epochs=settings.local_epochs,
        learning_rate=settings.learning_rate,
        batch_size=settings.batch_size,
        local_init=settings.local_init,  # type: ignore[arg-type]
        prox_step=settings.prox_step,  # type: ignore[arg-type]
        context=context,
        X_val=data.X_test[partition_id] if has_test else None,  # type: ignore[index]
        y_val=data.y_test[partition_id] if has_test else None,  # type: ignore[index]
        seed=settings.seed,
    )


def client_fn(context: Context) -> Client:
    """Build the legacy client of this node's partition (numpy or torch) from the run config."""
    if framework_of(context.run_config) == "torch":
        from .torch_client import torch_client  # imports torch

        return torch_client(context).to_client()
    return numpy_client_fn(context).to_client()


legacy_app = ClientApp(client_fn=client_fn)
secure_app = ClientApp(client_fn=client_fn, mods=[secaggplus_mod])  # secure-aggregation
message_app = make_client_app(numpy_client_fn)


def is_identity_query(message: Message) -> bool:
    """Return whether `message` is the strategies' identity query (partition-id)."""
    return (
        message.metadata.message_type == MessageType.QUERY
        and IDENTITY_QUERY in message.content.config_records
    )


class ApiClientApp(ClientApp):
    """A ClientApp that hands each message to the legacy or the Message-API app."""

    def __call__(self, message: Message, context: Context) -> Message:
        """Answer the identity query; else dispatch on secure-aggregation, api, framework."""
        if is_identity_query(message):
            return identity_reply(message, context)
        if secure_aggregation_of(context.run_config):
            return secure_app(message, context)
        message_api = api_of(context.run_config) == "message"
        if framework_of(context.run_config) == "torch":
            from .torch_client import torch_message_app  # imports torch

            chosen = torch_message_app if message_api else legacy_app
        else:
            chosen = message_app if message_api else legacy_app
        return chosen(message, context)


app = ApiClientApp()
