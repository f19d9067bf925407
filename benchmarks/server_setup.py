"""The server side of `benchmarks.server_cost`: a FedADMM that knows N clients.

Replies are random float64 models of P parameters in four tensors. Every client of
the setup has its own reply bytes, and the timed rounds alternate between two sets of
ten more: FedADMM keeps read-only views into the bytes it received (no copy), so
shared or reused bytes would make its cached state smaller, and its "remove the old
share" reads cheaper, than in a real run. Both strategies aggregate the identical
`FitRes` lists (FedAvg mutates only what it deserializes).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
from flwr.common import Code, FitIns, FitRes, Parameters, Status, ndarrays_to_parameters
from flwr.server.client_manager import SimpleClientManager
from flwr.server.client_proxy import ClientProxy

from flwr_admm import HealthCheck
from flwr_admm.server import FedADMM

SAMPLED = 10
FLOAT = 8  # bytes of a float64


class _Proxy(ClientProxy):
    """A client the server can address; aggregate_fit never calls it."""

    def _unused(self, *args: object) -> Any:
        raise NotImplementedError("benchmark proxies are never called")

    get_properties = get_parameters = fit = evaluate = reconnect = _unused  # type: ignore[assignment]


class ScriptedClientManager(SimpleClientManager):
    """A ClientManager whose ``sample`` returns the clients the benchmark chose."""

    def __init__(self) -> None:
        super().__init__()
        self.next_sample: list[ClientProxy] = []

    def sample(
        self, num_clients: int, min_num_clients: int | None = None, criterion: Any = None
    ) -> list[ClientProxy]:
        """Return the scripted clients (exactly `num_clients` of them)."""
        assert len(self.next_sample) == num_clients, (len(self.next_sample), num_clients)
        return list(self.next_sample)


def layer_shapes(num_parameters: int) -> list[tuple[int, ...]]:
    """Four tensors like a small network's: two weight blocks, a head and a bias."""
    half, quarter = num_parameters // 2, num_parameters // 4
    return [(half,), (quarter,), (num_parameters - half - quarter - 10,), (10,)]


def state_bytes(num_parameters: int, num_clients: int) -> int:
    """FedADMM's float64 server state: w_i and y_i per client, plus z and two sums."""
    return (2 * num_clients + 3) * num_parameters * FLOAT


def peak_need_bytes(num_parameters: int, num_clients: int) -> int:
    """State, the two timed reply sets and FedAvg's transient copies (generous)."""
    return state_bytes(num_parameters, num_clients) + (2 * SAMPLED + 6) * num_parameters * FLOAT


def make_replies(num_parameters: int, seed: int, count: int = SAMPLED) -> list[Parameters]:
    """`count` serialized models, each its own bytes (random, then shifted copies).

    Only one model is drawn at random; the others add a distinct constant to it, so
    building hundreds of replies costs little, while no two share memory.
    """
    rng = np.random.default_rng(seed)
    base = [rng.standard_normal(s) for s in layer_shapes(num_parameters)]
    return [ndarrays_to_parameters([t + 1e-3 * k for t in base]) for k in range(count)]


def fit_results(
    proxies: list[ClientProxy], payloads: list[Parameters]
) -> list[tuple[ClientProxy, FitRes]]:
    """One FitRes per proxy; ``partition-id`` keys FedADMM's per-client state."""
    return [
        (
            proxy,
            FitRes(
                status=Status(Code.OK, ""),
                parameters=payloads[j % len(payloads)],
                num_examples=100 + int(proxy.cid) % 7,
                metrics={"partition-id": int(proxy.cid), "loss": 0.5},
            ),
        )
        for j, proxy in enumerate(proxies)
    ]


def known_clients(
    num_clients: int, factory: Callable[..., Any]
) -> tuple[Any, list[ClientProxy], ScriptedClientManager]:
    """`factory(rho=1, ...)` sampling 10 of `num_clients` proxies registered in a manager."""
    proxies: list[ClientProxy] = [_Proxy(str(i)) for i in range(num_clients)]
    manager = ScriptedClientManager()
    for proxy in proxies:
        manager.register(proxy)
    strategy = factory(
        rho=1.0,
        # random replies around z = 0: the default watchdog would call round 1 an
        # explosion (||z'|| > 1000 max(1, ||z||)); it still runs, with looser thresholds
        health=HealthCheck(explosion=1e12, growth=1e12),
        sampling_seed=None,
        fraction_fit=SAMPLED / num_clients,
        min_fit_clients=SAMPLED,
        min_available_clients=num_clients,
        fraction_evaluate=0.0,
    )
    return strategy, proxies, manager


def prepared_fedadmm(
    num_parameters: int,
    num_clients: int,
    factory: Callable[..., FedADMM] = FedADMM,
) -> tuple[FedADMM, list[list[tuple[ClientProxy, FitRes]]]]:
    """FedADMM (built by `factory`) that has seen all N clients, and two timed reply sets.

    Every client's setup reply is its own bytes; the two timed sets (the same 10
    clients, different bytes) are meant to alternate. `factory` takes FedADMM's
    keywords; pass a subclass to measure a variant.
    """
    strategy, proxies, manager = known_clients(num_clients, factory)
    parameters = ndarrays_to_parameters([np.zeros(s) for s in layer_shapes(num_parameters)])
    for server_round, start in enumerate(range(0, num_clients, SAMPLED), start=1):
        manager.next_sample = proxies[start : start + SAMPLED]
        strategy.configure_fit(server_round, parameters, manager)
        payloads = make_replies(num_parameters, seed=start, count=SAMPLED)
        aggregated, _ = strategy.aggregate_fit(
            server_round, fit_results(manager.next_sample, payloads), []
        )
        del payloads
        assert aggregated is not None
        parameters = aggregated
    # The timed sample: 10 clients spread over the N known ones.
    sample = proxies[:: num_clients // SAMPLED][:SAMPLED]
    manager.next_sample = sample
    instructions: list[tuple[ClientProxy, FitIns]] = strategy.configure_fit(
        num_clients // SAMPLED + 1, parameters, manager
    )
    assert len(instructions) == SAMPLED
    timed = [
        fit_results(sample, make_replies(num_parameters, seed=num_clients + k)) for k in range(2)
    ]
    return strategy, timed


def cached_state_bytes(strategy: FedADMM) -> int:
    """Bytes FedADMM holds between rounds (z, running sums, every w_i and y_i).

    `state_dict` hands out references to the live arrays, so nothing is copied.
    """
    assert strategy.admm is not None
    arrays, _ = strategy.admm.state_dict()
    return int(sum(np.asarray(a).nbytes for a in arrays.values()))
