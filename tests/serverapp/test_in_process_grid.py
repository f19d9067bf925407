"""flwr_admm.serverapp.testing.InProcessGrid behaves like Flower's simulation engine."""

from __future__ import annotations

import numpy as np
from flwr.app import ConfigRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from message_apps import ZRecorder, plain_app, zeros

from flwr_admm.serverapp import FedADMM
from flwr_admm.serverapp.testing import InProcessGrid, run_strategy

flaky_app = ClientApp()


@flaky_app.train()
def flaky_train(msg: Message, context: Context) -> Message:
    """Count calls in state; node 2 raises after touching its state."""
    calls = int(context.state.config_records.get("calls", ConfigRecord({"n": 0}))["n"]) + 1
    context.state.config_records["calls"] = ConfigRecord({"n": calls})
    if context.node_id == 2:
        raise RuntimeError("node 2 fails")
    metrics = MetricRecord({"num-examples": 1, "partition-id": context.node_config["partition-id"]})
    return Message(RecordDict({"arrays": msg.content["arrays"], "metrics": metrics}), reply_to=msg)


def test_errors_become_error_replies_and_lose_their_state_changes() -> None:
    grid = InProcessGrid(flaky_app, 3)
    grid.offline.add(3)  # its reply is late: absent
    strategy = FedADMM(rho=0.1, fraction_evaluate=0.0, min_available_nodes=3)
    result = run_strategy(strategy, grid, zeros(), 2)
    metrics = result.train_metrics_clientapp[2]
    assert metrics["num_failures"] == 1 and metrics["num_replies"] == 1
    calls = {n: c.state.config_records.get("calls") for n, c in grid.contexts.items()}
    assert calls[1] is not None and calls[1]["n"] == 2
    assert calls[2] is None  # raised: state dropped, as in simulation
    assert calls[3] is not None and calls[3]["n"] == 2  # worked, reply lost
    assert [m.metadata.dst_node_id for m in grid.sent] == [1, 2, 3, 1, 2, 3]


def test_runs_are_deterministic() -> None:
    def run() -> np.ndarray:
        recorder = ZRecorder()
        strategy = FedADMM(rho=0.1, fraction_train=0.5, fraction_evaluate=0.0)
        run_strategy(strategy, InProcessGrid(plain_app, 10), zeros(), 5, evaluate_fn=recorder)
        return recorder.matrix

    np.testing.assert_array_equal(run(), run())
