"""flwr_admm.clientapp.make_client_app: ADMMClient's numbers behind Message-API handlers."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from flower_run import D, admm_client_fn
from flwr.app import ConfigRecord, Context, Message, MessageType, RecordDict
from message_replies import metadata, named

from flwr_admm.clientapp import make_client_app
from flwr_admm.clientapp.identity import identity_reply
from flwr_admm.protocol import IDENTITY_QUERY
from flwr_admm.serverapp.testing import flower_task_identity

CLIENT = {"local_steps": 20, "learning_rate": 1.0}


def message(arrays: np.ndarray, message_type: str = MessageType.TRAIN, **config: Any) -> Message:
    meta = metadata(1, message_type)
    meta.dst_node_id = 3
    content = RecordDict({"arrays": named({"0": arrays}), "config": ConfigRecord(config)})
    return Message(content=content, metadata=meta)


def context(partition_id: int = 2) -> Context:
    return Context(
        run_id=1,
        node_id=3,
        node_config={"partition-id": partition_id, "num-partitions": 10},
        state=RecordDict(),
        run_config={},
    )


def legacy_fit(ctx: Context, w: np.ndarray, config: dict[str, Any], **client: Any) -> Any:
    return admm_client_fn(**{**CLIENT, **client})(ctx).fit([w], config)


def rounds() -> list[tuple[np.ndarray, dict[str, Any], dict[str, Any]]]:
    """(received, Message-API config, the same config as a legacy FitIns carries)."""
    rng = np.random.default_rng(0)
    v1, v2, v3 = (rng.normal(size=D) for _ in range(3))
    return [
        (
            v1,
            {"rho": 0.1, "proximal-mu": 0.1, "server-round": 1},
            {"rho": 0.1, "proximal_mu": 0.1, "server_round": 1},
        ),
        (
            v2,
            {"rho": 0.1, "proximal-mu": 0.1, "server-round": 2, "batch_size": 50},
            {"rho": 0.1, "proximal_mu": 0.1, "server_round": 2, "batch_size": 50},
        ),
        (
            v3,
            {"rho": 0.0, "proximal-mu": 0.0, "server-round": 3},
            {"rho": 0.0, "proximal_mu": 0.0, "server_round": 3},
        ),
        (v3, {"proximal-mu": 0.2, "server-round": 4}, {"proximal_mu": 0.2, "server_round": 4}),
    ]


def test_train_handler_computes_what_admm_client_computes() -> None:
    app = make_client_app(admm_client_fn(**CLIENT))
    ours, theirs = context(), context()
    for received, config, legacy_config in rounds():  # warm start, minibatches, rho 0, FedProx
        reply = app(message(received, **config), ours)
        arrays, n, metrics = legacy_fit(theirs, received, legacy_config)
        np.testing.assert_array_equal(reply.content["arrays"]["0"].numpy(), arrays[0])
        # + the mark of a client that solves FedADMM's step (from its own last w_i)
        mark = {"admm-started-at-z": 0} if "rho" in config else {}
        assert dict(reply.content["metrics"]) == {**metrics, "num-examples": n, **mark}
        assert reply.metadata.dst_node_id == 1


def test_rho_zero_starts_at_the_received_arrays() -> None:
    app, ctx = make_client_app(admm_client_fn(**CLIENT)), context()
    received = np.full(D, 0.3)
    app(message(np.zeros(D), rho=0.1, **{"server-round": 1}), ctx)  # leaves a warm start
    reply = app(message(received, rho=0.0, **{"server-round": 2}), ctx)
    fresh = app(message(received, rho=0.0, **{"server-round": 2}), context())
    np.testing.assert_array_equal(
        reply.content["arrays"]["0"].numpy(), fresh.content["arrays"]["0"].numpy()
    )


def test_dtypes_and_names_of_the_received_record_are_kept() -> None:
    app = make_client_app(admm_client_fn(**CLIENT))
    received = np.linspace(-1, 1, D).astype(np.float32)
    reply = app(message(received, rho=0.1, **{"server-round": 1}), context())
    sent = reply.content["arrays"]["0"].numpy()
    assert sent.dtype == np.float32 and sent.shape == (D,)


def test_evaluate_handler_reports_loss_accuracy_and_weight() -> None:
    app = make_client_app(admm_client_fn(**CLIENT))
    reply = app(message(np.zeros(D), MessageType.EVALUATE, **{"server-round": 1}), context())
    metrics = dict(reply.content["metrics"])
    assert metrics["num-examples"] == 500
    assert metrics["loss"] == pytest.approx(np.log(2.0))  # logistic loss at w = 0
    assert 0.0 <= metrics["accuracy"] <= 1.0


def test_a_text_client_key_is_refused_a_numeric_one_is_sent() -> None:
    ctx = context()
    numeric = make_client_app(admm_client_fn(**CLIENT, client_key="17"))
    reply = numeric(message(np.zeros(D), rho=0.1), ctx)
    assert reply.content["metrics"]["client-key"] == 17
    text = make_client_app(admm_client_fn(**CLIENT, client_key="bank-a"))
    with pytest.raises(ValueError, match="client-key"):
        text(message(np.zeros(D), rho=0.1), context())


def test_the_identity_reply_names_the_node_config_key_and_refuses_other_queries():
    context = Context(
        run_id=1, node_id=5, node_config={"partition-id": 4}, state=RecordDict(), run_config={}
    )
    with flower_task_identity(1):
        asked = Message(
            RecordDict({IDENTITY_QUERY: ConfigRecord()}),
            dst_node_id=5,
            message_type=MessageType.QUERY,
        )
        other = Message(
            RecordDict({"mine": ConfigRecord()}), dst_node_id=5, message_type=MessageType.QUERY
        )
    reply = identity_reply(asked, context)
    assert dict(reply.content.metric_records[IDENTITY_QUERY]) == {"partition-id": 4}
    with pytest.raises(ValueError, match=r"^message: .*admm-identity"):
        identity_reply(other, context)
