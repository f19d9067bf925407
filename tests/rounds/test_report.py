"""`flwr_admm.rounds.exchange`: the reply metrics a round keeps are bounded."""

from __future__ import annotations

import numpy as np
from message_replies import FakeGrid, configure, named, reply

from flwr_admm.protocol import START_MARK
from flwr_admm.rounds.exchange import MAX_REPLY_METRICS, without_reply_keys
from flwr_admm.serverapp import FedADMM


def test_identity_and_protocol_keys_go_and_the_rest_is_bounded() -> None:
    aggregated = {f"m{i:05d}": float(i) for i in range(20_000)}
    aggregated.update({"partition-id": 4.3, "admm-previous-round": 1.0, "train-loss": 0.5})
    kept = without_reply_keys(aggregated)
    assert len(kept) == MAX_REPLY_METRICS
    assert "partition-id" not in kept and "admm-previous-round" not in kept
    assert list(kept) == sorted(kept)  # the first names in sorted order, deterministic
    assert without_reply_keys({"train-loss": 0.5, "partition-id": 1}) == {"train-loss": 0.5}


def test_a_reply_with_20000_metric_names_leaves_a_bounded_history() -> None:
    strategy = FedADMM(rho=0.5, fraction_evaluate=0.0)
    grid = FakeGrid([11, 12])
    configure(strategy, 1, named({"w": np.zeros(3)}), grid)
    spam = {f"m{i:05d}": 1.0 for i in range(20_000)}
    replies = [
        reply(11, {"w": np.ones(3)}, **{"num-examples": 5, START_MARK: 1, **spam}),
        reply(12, {"w": np.ones(3)}, **{"num-examples": 5, START_MARK: 1}),
    ]
    _, metrics = strategy.aggregate_train(1, replies)
    assert metrics is not None
    assert len(strategy.history[-1]) <= MAX_REPLY_METRICS + 30  # + the round's own metrics
    assert metrics["num_replies"] == 2
