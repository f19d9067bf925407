"""Legacy API: a reply far larger than the model is refused before it is deserialized.

Issue 25, item 7: a 1e8-element reply for a 10-parameter model was deserialized
(+763 MiB) before it was rejected. Every legacy strategy now screens the tensor count
and each tensor's ``.npy`` header and byte length (`flwr_admm.uplink.wire`) before
`parameters_to_ndarrays`; the reply itself was allocated by the transport, so the
test bounds what the strategy allocates on top of it (tracemalloc).
"""

from __future__ import annotations

import io
import tracemalloc
from typing import Any

import numpy as np
import pytest
from fit_replies import fit_res
from flwr.common import Code, FitRes, Parameters, Status, ndarrays_to_parameters
from flwr.server.client_manager import SimpleClientManager

from flwr_admm.server import SCAFFOLD, FedADMM, FedADMMClientDuals, FedDyn, FedNova
from flwr_admm.testing import make_proxies

D = 10
BIG = 4_000_000  # float64 entries of the hostile tensor: 32 MB (the was 1e8)
DUALS = {"admm-previous-round": 0, "admm-examples-change": 10}
DUALS_NORMS = {"admm-w-sq-norm": 1.0, "admm-u-sq-norm": 0.0}


def _unused_client_fn(context: Any) -> Any:  # pragma: no cover - never called
    raise AssertionError("client_fn must not be called in these tests")


def npy(array: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, array, allow_pickle=False)
    return buffer.getvalue()


def lying(shape: tuple[int, ...]) -> bytes:
    """A .npy whose header says `shape` and whose payload is BIG float64 entries."""
    header = npy(np.zeros(shape))[: -8 * int(np.prod(shape))]
    return header + bytes(8 * BIG)


STRATEGIES = {
    "FedADMM": lambda: FedADMM(rho=0.1),
    "FedADMMClientDuals": lambda: FedADMMClientDuals(rho=0.1),
    "SCAFFOLD": lambda: SCAFFOLD(),
    "FedDyn": lambda: FedDyn(alpha=0.1),
    "FedNova": lambda: FedNova(),
}


def honest(name: str) -> FitRes:
    """A well-formed reply of node 2 (so that the round has something to fold)."""
    arrays = [np.full(D, 0.5)] * (2 if name == "SCAFFOLD" else 1)
    metrics: dict[str, Any] = {"partition-id": 1, "local_steps": 5}
    if name == "FedADMMClientDuals":
        metrics.update({**DUALS, **DUALS_NORMS})
    return fit_res(arrays, 10, metrics)


@pytest.mark.parametrize("form", ["declared", "lying"])
@pytest.mark.parametrize("name", list(STRATEGIES))
def test_an_oversized_reply_is_rejected_without_deserializing_it(name: str, form: str) -> None:
    strategy = STRATEGIES[name]()
    proxies = make_proxies(_unused_client_fn, 2)
    manager = SimpleClientManager()
    for proxy in proxies:
        manager.register(proxy)
    strategy.configure_fit(1, ndarrays_to_parameters([np.zeros(D)]), manager)
    blocks = 2 if name == "SCAFFOLD" else 1
    tensor = npy(np.zeros(BIG)) if form == "declared" else lying((D,))
    big = Parameters([tensor] * blocks, "numpy.ndarray")
    metrics = {**honest(name).metrics, "partition-id": 0}
    hostile = FitRes(Status(Code.OK, ""), big, 10, metrics)
    results = [(proxies[0], hostile), (proxies[1], honest(name))]
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        _, round_metrics = strategy.aggregate_fit(1, results, [])
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert round_metrics["num_rejected"] == 1
    assert peak < len(tensor) / 20, f"{name} allocated {peak} bytes for a {len(tensor)}-byte reply"
