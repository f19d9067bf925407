"""Faults for the peer baselines' recovery tests: a lost reply, a NaN reply, a wiped state.

`run_legacy` drives `flwr_admm.server.SCAFFOLD` / `FedDyn` through the in-process
legacy loop with `FaultyProxy` clients, `run_message` the Message-API classes through
`tests.message_duals.FaultyGrid` (the same fault names), both on the ridge clients of
`peer_reference` (4 clients of 5-20 examples, lr 0.1, 5 local steps, full
participation). Both return the relative gap ||x - x*|| / ||x*|| to the pooled optimum.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from flwr.app import ArrayRecord
from flwr.common import Context, FitIns, FitRes, RecordDict, parameters_to_ndarrays
from message_apps import ZRecorder
from message_duals import FaultyGrid
from peer_reference import Ridge, client_fn_for, common_kwargs, pooled_optimum, ridge_clients

import flwr_admm.server
import flwr_admm.serverapp
from flwr_admm.client import ADMMClient
from flwr_admm.clientapp import make_client_app
from flwr_admm.protocol import PARTITION_ID
from flwr_admm.serverapp.testing import run_strategy
from flwr_admm.testing import InProcessClientProxy, make_proxies, run_rounds

SIZES = [5, 12, 8, 20]
D = 4
STEPS, LR = 5, 0.1
ROUNDS = 120
OPTIONS = {"scaffold": {}, "feddyn": {"alpha": 1.0}}
CLASSES = {
    "scaffold": (flwr_admm.server.SCAFFOLD, flwr_admm.serverapp.SCAFFOLD),
    "feddyn": (flwr_admm.server.FedDyn, flwr_admm.serverapp.FedDyn),
}
Faults = dict[int, dict[int, str]]  # client index -> {round: fault}


class FaultyProxy(InProcessClientProxy):
    """A proxy whose scripted rounds misbehave (the names of `FaultyGrid`).

    "lost": the client trains and keeps its state, the reply never arrives; "nan":
    the reply's first tensor carries a NaN; "wipe": the node's ``context.state`` is
    lost before this round (a SuperNode restart without its state).
    """

    faults: dict[int, str]

    def fit(self, ins: FitIns, timeout: float | None, group_id: int | None) -> FitRes:
        fault = self.faults.get(int(ins.config["server_round"]))
        if fault == "wipe":
            self.context.state = RecordDict()
        res = super().fit(ins, timeout, group_id)
        if fault == "lost":
            raise TimeoutError("reply lost after the client trained")
        if fault == "nan":
            data = bytearray(res.parameters.tensors[0])
            data[-8:] = np.array([np.nan]).tobytes()
            res.parameters.tensors[0] = bytes(data)
        return res


def data() -> list[tuple[np.ndarray, np.ndarray]]:
    return ridge_clients(SIZES, d=D, seed=3)


def gap(x: np.ndarray) -> float:
    optimum = pooled_optimum(data())
    return float(np.linalg.norm(x - optimum) / np.linalg.norm(optimum))


def run_legacy(
    peer: str, faults: Faults, rounds: int = ROUNDS, impostor: bool = False, **kwargs: Any
) -> tuple[Any, float, list[InProcessClientProxy]]:
    """Run the legacy strategy with `faults`; return it, the final gap and the proxies.

    `impostor`: a fifth node (`impostor_client_fn`) reports client 1's partition-id.
    """
    client_fn = impostor_client_fn if impostor else client_fn_for(data(), STEPS, LR)
    proxies = make_proxies(client_fn, len(SIZES) + int(impostor))
    for i, proxy in enumerate(proxies):
        proxy.__class__ = FaultyProxy
        proxy.faults = faults.get(i, {})  # type: ignore[attr-defined]
    if impostor:
        proxies[-1].context.node_config[PARTITION_ID] = 1
    strategy = CLASSES[peer][0](**OPTIONS[peer], **common_kwargs(D, min_clients=4), **kwargs)
    result = run_rounds(strategy, proxies, rounds)
    assert result.parameters is not None
    return strategy, gap(parameters_to_ndarrays(result.parameters)[0]), proxies


def run_message(
    peer: str, faults: Faults, rounds: int = ROUNDS, impostor: bool = False, **kwargs: Any
) -> tuple[Any, float, FaultyGrid]:
    """Run the Message-API strategy with `faults` (`FaultyGrid`); return it, gap, grid."""
    strategy = CLASSES[peer][1](
        **OPTIONS[peer],
        fraction_evaluate=0.0,
        min_train_nodes=len(SIZES),
        min_available_nodes=len(SIZES),
        **kwargs,
    )
    client_fn = impostor_client_fn if impostor else client_fn_for(data(), STEPS, LR)
    grid = FaultyGrid(make_client_app(client_fn), len(SIZES) + int(impostor), faults)
    if impostor:
        grid.contexts[len(SIZES) + 1].node_config[PARTITION_ID] = 1
    recorder = ZRecorder()
    run_strategy(strategy, grid, ArrayRecord([np.zeros(D)]), rounds, evaluate_fn=recorder)
    return strategy, gap(recorder.matrix[-1]), grid


def impostor_client_fn(context: Context) -> ADMMClient:
    """Nodes 1-4: the ridge clients; node 5: other data (it reports client 1's key)."""
    other = ridge_clients(SIZES, d=D, seed=99)[1]
    X, y = data()[context.node_id - 1] if context.node_id <= len(SIZES) else other
    return ADMMClient(Ridge(D), X, y, local_steps=STEPS, learning_rate=LR, context=context)
