"""In-process driver: run a legacy Flower strategy against NumPyClients without Ray.

It follows the round loop of Flower's legacy ``Server`` but calls clients directly
and in a fixed order, so it is deterministic and fast. As in Flower, each node keeps
one `Context` whose ``state`` persists across rounds, and the client is rebuilt from
``client_fn(context)`` for every message.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from flwr.client import Client, NumPyClient
from flwr.common import (
    Code,
    Context,
    DisconnectRes,
    EvaluateIns,
    EvaluateRes,
    FitIns,
    FitRes,
    GetParametersIns,
    GetParametersRes,
    GetPropertiesIns,
    GetPropertiesRes,
    Parameters,
    ReconnectIns,
    RecordDict,
    Scalar,
    Status,
)
from flwr.server.client_manager import SimpleClientManager
from flwr.server.client_proxy import ClientProxy
from flwr.server.strategy import Strategy

from flwr_admm.protocol import NUM_PARTITIONS, PARTITION_ID

ClientFn = Callable[[Context], Client | NumPyClient]


class InProcessClientProxy(ClientProxy):
    """A ClientProxy that builds the client from `client_fn(context)` per message."""

    def __init__(self, cid: str, client_fn: ClientFn, context: Context) -> None:
        super().__init__(cid)
        self.node_id = int(cid) if cid.isdigit() else 0
        self.client_fn = client_fn
        self.context = context

    def _client(self) -> Client:
        client = self.client_fn(self.context)
        return client.to_client() if isinstance(client, NumPyClient) else client

    def get_properties(
        self, ins: GetPropertiesIns, timeout: float | None, group_id: int | None
    ) -> GetPropertiesRes:
        """Forward to the client."""
        return self._client().get_properties(ins)

    def get_parameters(
        self, ins: GetParametersIns, timeout: float | None, group_id: int | None
    ) -> GetParametersRes:
        """Forward to the client."""
        return self._client().get_parameters(ins)

    def fit(self, ins: FitIns, timeout: float | None, group_id: int | None) -> FitRes:
        """Forward to the client."""
        return self._client().fit(ins)

    def evaluate(
        self, ins: EvaluateIns, timeout: float | None, group_id: int | None
    ) -> EvaluateRes:
        """Forward to the client."""
        return self._client().evaluate(ins)

    def reconnect(
        self, ins: ReconnectIns, timeout: float | None, group_id: int | None
    ) -> DisconnectRes:
        """Nothing to disconnect in process."""
        return DisconnectRes(reason="")


@dataclass
class RunResult:
    """What `run_rounds` observed, round by round."""

    parameters: Parameters | None
    fit_metrics: list[dict[str, Scalar]] = field(default_factory=list)
    evaluate_losses: list[float | None] = field(default_factory=list)
    evaluate_metrics: list[dict[str, Scalar]] = field(default_factory=list)
    centralized: list[tuple[float, dict[str, Scalar]] | None] = field(default_factory=list)


def make_proxies(
    client_fn: ClientFn, num_clients: int, *, node_ids: list[int] | None = None
) -> list[InProcessClientProxy]:
    """One proxy per partition, with ``partition-id`` / ``num-partitions`` node config."""
    ids = node_ids if node_ids is not None else list(range(1, num_clients + 1))
    return [
        InProcessClientProxy(
            str(ids[i]),
            client_fn,
            Context(
                run_id=0,
                node_id=ids[i],
                node_config={PARTITION_ID: i, NUM_PARTITIONS: num_clients},
                state=RecordDict(),
                run_config={},
            ),
        )
        for i in range(num_clients)
    ]


def run_rounds(
    strategy: Strategy,
    proxies: Sequence[InProcessClientProxy],
    num_rounds: int,
    *,
    initial_parameters: Parameters | None = None,
    evaluate: bool = False,
    client_manager: SimpleClientManager | None = None,
) -> RunResult:
    """Run `num_rounds` of the legacy server loop; client exceptions become failures.

    `client_manager` (default: a new `SimpleClientManager`) is what the strategy
    samples from, as a ``ServerAppComponents.client_manager`` is in Flower.
    """
    manager = SimpleClientManager() if client_manager is None else client_manager
    for proxy in proxies:
        manager.register(proxy)
    parameters = strategy.initialize_parameters(manager)
    if parameters is None:
        parameters = initial_parameters
    if parameters is None:
        parameters = proxies[0].get_parameters(GetParametersIns(config={}), None, None).parameters
    result = RunResult(parameters=parameters)
    for server_round in range(1, num_rounds + 1):
        instructions = strategy.configure_fit(server_round, parameters, manager)
        results: list[tuple[ClientProxy, FitRes]] = []
        failures: list[tuple[ClientProxy, FitRes] | BaseException] = []
        for client, ins in instructions:
            try:
                res = client.fit(ins, None, server_round)
            except Exception as error:  # Flower turns client errors into failures too
                failures.append(error)
                continue
            if res.status.code == Code.OK:
                results.append((client, res))
            else:
                failures.append((client, res))
        aggregated, metrics = strategy.aggregate_fit(server_round, results, failures)
        if aggregated is not None:
            parameters = aggregated
        result.fit_metrics.append(metrics)
        result.centralized.append(strategy.evaluate(server_round, parameters))
        if evaluate:
            _evaluate_round(strategy, manager, parameters, server_round, result)
    result.parameters = parameters
    return result


def _evaluate_round(
    strategy: Strategy,
    manager: SimpleClientManager,
    parameters: Parameters,
    server_round: int,
    result: RunResult,
) -> None:
    instructions = strategy.configure_evaluate(server_round, parameters, manager)
    replies = [(proxy, proxy.evaluate(ins, None, server_round)) for proxy, ins in instructions]
    loss, metrics = strategy.aggregate_evaluate(server_round, replies, [])
    result.evaluate_losses.append(loss)
    result.evaluate_metrics.append(metrics)


__all__ = ["InProcessClientProxy", "RunResult", "Status", "make_proxies", "run_rounds"]
