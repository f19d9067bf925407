"""Test helper: SecAgg+'s arithmetic without the cryptography, for in-process runs.

`SecureSumEmulation` wraps a legacy strategy: before ``aggregate_fit`` it replaces
every result's parameters by what Flower's SecAggPlusWorkflow would hand over, computed
with Flower's own functions (weight num_examples / max_weight, `quantize` with its
stochastic rounding, the sum modulo M, `dequantize`, the offset and the division by the
summed weights). The pairwise and private masks cancel exactly modulo M, so they are
left out. ``individual`` keeps each round's clients' own arrays for the tests.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from flwr.common import FitIns, FitRes, RecordDict, ndarrays_to_parameters, parameters_to_ndarrays
from flwr.common.secure_aggregation.quantization import dequantize, quantize

from flwr_admm.protocol import STEP_BUDGET
from flwr_admm.testing import InProcessClientProxy, make_proxies


def secure_sum(
    replies: list[tuple[list[np.ndarray], int]],
    *,
    clipping_range: float = 8.0,
    quantization_range: int = 1 << 22,
    modulus_range: int = 1 << 32,
    max_weight: float = 1000.0,
) -> list[np.ndarray]:
    """Return SecAgg+'s aggregate of (arrays, num_examples) replies (flwr 1.42 arithmetic)."""
    total: list[np.ndarray] | None = None
    weights = 0
    for arrays, num_examples in replies:
        q_ratio = round(num_examples / max_weight * quantization_range)
        scaled = [a * (q_ratio / quantization_range) for a in arrays]
        levels = [q.astype(np.int64) for q in quantize(scaled, clipping_range, quantization_range)]
        total = levels if total is None else [t + q for t, q in zip(total, levels, strict=True)]
        weights += q_ratio
    assert total is not None
    total = [t % modulus_range for t in total]
    aggregate = dequantize(total, clipping_range, quantization_range)
    offset = -(len(replies) - 1) * clipping_range
    return [(a + offset) * (quantization_range / weights) for a in aggregate]


class SecureSumEmulation:
    """Wrap `strategy`: its aggregate_fit sees SecAgg+'s aggregate in every result."""

    def __init__(self, strategy: Any, **settings: Any) -> None:
        self.strategy = strategy
        self.settings = settings
        self.individual: list[list[list[np.ndarray]]] = []
        self.received: list[list[FitRes]] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self.strategy, name)

    def aggregate_fit(self, server_round: int, results: list[Any], failures: list[Any]) -> Any:
        """Replace every result's parameters by the aggregate, then aggregate."""
        replies = [(parameters_to_ndarrays(res.parameters), res.num_examples) for _, res in results]
        self.individual.append([arrays for arrays, _ in replies])
        if results:  # new FitRes objects: a replayed reply must keep its own arrays
            shared = ndarrays_to_parameters(secure_sum(replies, **self.settings))
            results = [
                (proxy, FitRes(res.status, shared, res.num_examples, res.metrics))
                for proxy, res in results
            ]
        self.received.append([res for _, res in results])
        return self.strategy.aggregate_fit(server_round, results, failures)


class FaultyProxy(InProcessClientProxy):
    """A proxy whose scripted rounds misbehave: "lost" (the reply never arrives after
        the client trained and saved its state), "replay" (the previous round's reply
        arrives instead), "wipe" (the node's state is lost before the round), "steal" (the
        reply claims the next partition's key, which another node holds), "no-budget" (the
    reply leaves out the linearized form's ``admm-step-budget``)."""

    faults: dict[int, str]
    last: FitRes | None = None

    def fit(self, ins: FitIns, timeout: float | None, group_id: int | None) -> FitRes:
        fault = self.faults.get(int(ins.config["server_round"]))
        if fault == "wipe":
            self.context.state = RecordDict()
        res = super().fit(ins, timeout, group_id)
        previous, self.last = self.last, res
        if fault == "steal":
            res.metrics["partition-id"] = (int(res.metrics["partition-id"]) + 1) % 10
        if fault == "no-budget":
            res.metrics.pop(STEP_BUDGET, None)
        if fault == "lost":
            raise TimeoutError("reply lost after the client trained")
        return previous if fault == "replay" and previous is not None else res


def faulty_proxies(
    client_fn: Any, num_clients: int, faults: dict[int, dict[int, str]]
) -> list[InProcessClientProxy]:
    """`make_proxies` whose client i follows the script faults[i] = {round: fault}."""
    proxies = make_proxies(client_fn, num_clients)
    for i, proxy in enumerate(proxies):
        proxy.__class__ = FaultyProxy
        proxy.faults = faults.get(i, {})  # type: ignore[attr-defined]
    return proxies
