"""In-process Message-API grid: run a strategy against a ClientApp without Ray.

`InProcessGrid` implements Flower's `Grid` by calling the `ClientApp` directly, node
by node in the order the strategy sent the messages, so a run is deterministic and
fast. As in Flower's simulation engine, each node keeps one `Context` whose ``state``
persists across rounds (``partition-id`` / ``num-partitions`` in its node config), a
handler that raises returns an error reply and loses its ``state`` changes, and
messages are copies (a handler never sees the server's objects). `run_strategy` runs
``strategy.start`` on it: users can test their own handlers the same way.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from flwr.app import ArrayRecord, ConfigRecord, Context, Error, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from flwr.common.constant import SUPERLINK_NODE_ID, ErrorCode
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Result, Strategy
from flwr.supercore.run import Run
from flwr.supercore.task_identity import TaskIdentity

from flwr_admm.protocol import NUM_PARTITIONS, PARTITION_ID

__all__ = ["InProcessGrid", "flower_task_identity", "run_strategy"]


class InProcessGrid(Grid):
    """A Grid whose nodes run `client_app` in this process.

    Parameters
    ----------
    client_app : ClientApp
        The app every node runs (``@app.train()`` / ``@app.evaluate()`` handlers).
    num_nodes : int
        Number of nodes; node i has partition-id i.
    node_ids : sequence of int, optional
        Their node ids (default 1, ..., num_nodes, the legacy driver's cids).

    Attributes
    ----------
    contexts : dict
        node id -> its `Context` (state persists across rounds).
    offline : set of int
        Nodes whose replies never arrive (a late reply is simply absent in Flower).
    sent : list of Message
        Every message delivered, in order (the copies the nodes received).

    """

    def __init__(
        self, client_app: ClientApp, num_nodes: int, *, node_ids: Sequence[int] | None = None
    ) -> None:
        ids = list(node_ids) if node_ids is not None else list(range(1, num_nodes + 1))
        if len(ids) != num_nodes or len(set(ids)) != num_nodes:
            raise ValueError(f"node_ids: need {num_nodes} distinct ids, got {ids}")
        self.client_app = client_app
        self._run = Run.create_empty(run_id=1)
        self.contexts = {
            node_id: Context(
                run_id=self._run.run_id,
                node_id=node_id,
                node_config={PARTITION_ID: i, NUM_PARTITIONS: num_nodes},
                state=RecordDict(),
                run_config={},
            )
            for i, node_id in enumerate(ids)
        }
        self.offline: set[int] = set()
        self.sent: list[Message] = []
        self._replies: dict[str, Message] = {}

    def set_run(self, run: Run) -> None:
        """Use `run`'s id for the nodes' contexts from now on."""
        self._run = run

    @property
    def run(self) -> Run:
        """Return the run this grid operates in."""
        return self._run

    def create_message(
        self,
        content: RecordDict,
        message_type: str,
        dst_node_id: int,
        group_id: str,
        ttl: float | None = None,
    ) -> Message:
        """Return a new instruction message (Flower deprecates this; use `Message`)."""
        return Message(content, dst_node_id, message_type, ttl=ttl, group_id=group_id)

    def get_node_ids(self) -> list[int]:
        """Return the ids of the connected nodes."""
        return list(self.contexts)

    def push_messages(self, messages: Iterable[Message]) -> list[str]:
        """Deliver the messages now; return ids to pull their replies with."""
        ids = []
        for message in list(messages):
            reply = self._deliver(message)
            ids.append(str(len(self.sent)))
            if reply is not None:
                self._replies[ids[-1]] = reply
        return ids

    def pull_messages(self, message_ids: Iterable[str]) -> list[Message]:
        """Return (once) the replies of `message_ids` that arrived."""
        return [self._replies.pop(i) for i in message_ids if i in self._replies]

    def send_and_receive(
        self, messages: Iterable[Message], *, timeout: float | None = None
    ) -> list[Message]:
        """Deliver the messages in order and return the replies that arrived."""
        return self.pull_messages(self.push_messages(messages))

    def _deliver(self, message: Message) -> Message | None:
        """Run the node's app on a copy of `message`; an exception becomes an error reply."""
        node_id = message.metadata.dst_node_id
        received = Message(  # type: ignore[call-overload]
            content=copy.deepcopy(message.content), metadata=copy.deepcopy(message.metadata)
        )
        self.sent.append(received)
        if node_id not in self.contexts:
            return Message(Error(ErrorCode.NODE_UNAVAILABLE, "unknown node"), reply_to=received)
        context = self.contexts[node_id]
        working = copy.copy(context)
        working.state = copy.deepcopy(context.state)  # kept only if the handler succeeds
        try:
            reply = self.client_app(received, working)
        except Exception as error:  # Flower turns handler exceptions into error replies
            reason = f"{type(error).__name__}: {error}"
            return Message(Error(ErrorCode.CLIENT_APP_RAISED_EXCEPTION, reason), reply_to=received)
        context.state = working.state
        if node_id in self.offline:
            return None
        if reply.has_error():
            return Message(reply.error, reply_to=received)
        return Message(copy.deepcopy(reply.content), reply_to=received)


@contextmanager
def flower_task_identity(run_id: int = 1) -> Iterator[None]:
    """Set Flower's task identity for building `Message`s outside a Flower runtime.

    (``Message(content, dst_node_id, message_type)`` reads the run id from it; a
    Flower runtime sets it, a unit test has to.) The previous identity is restored.
    """
    saved = {name: vars(TaskIdentity).get(name) for name in ("_task_id", "_run_id", "_node_id")}
    TaskIdentity.task_id, TaskIdentity.run_id = 1, run_id
    TaskIdentity.node_id = SUPERLINK_NODE_ID
    try:
        yield
    finally:
        for name, value in saved.items():
            setattr(TaskIdentity, name, value)


def run_strategy(
    strategy: Strategy,
    grid: InProcessGrid,
    initial_arrays: ArrayRecord,
    num_rounds: int,
    *,
    train_config: ConfigRecord | None = None,
    evaluate_config: ConfigRecord | None = None,
    evaluate_fn: Callable[[int, ArrayRecord], MetricRecord | None] | None = None,
    **start_kwargs: Any,
) -> Result:
    """Run ``strategy.start`` on `grid` (what an ``@app.main()`` would do)."""
    with flower_task_identity(grid.run.run_id):
        return strategy.start(
            grid,
            initial_arrays,
            num_rounds=num_rounds,
            train_config=train_config,
            evaluate_config=evaluate_config,
            evaluate_fn=evaluate_fn,
            **start_kwargs,
        )
