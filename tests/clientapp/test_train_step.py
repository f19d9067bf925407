"""flwr_admm.clientapp helpers for a user's own @app.train() handler."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from flwr.app import ConfigRecord, Context, Message, MessageType, RecordDict
from message_replies import metadata, named

from flwr_admm.clientapp import ADMMTrainStep, build_reply
from flwr_admm.clientapp.step import warm_start
from flwr_admm.core.client_duals import restore_payload
from flwr_admm.node.records import load_states
from flwr_admm.uplink import LocalDP

CENTER = {
    "fc.weight": np.arange(6, dtype=np.float32).reshape(2, 3),
    "fc.bias": np.array([0.25, -0.5]),
    "bn.num_batches_tracked": np.array(3, dtype=np.int64),
}


def train_message(arrays: dict[str, np.ndarray] = CENTER, **config: Any) -> Message:
    """An instruction message from the server (node 1) to node 5."""
    meta = metadata(1, MessageType.TRAIN)
    meta.dst_node_id = 5
    content = RecordDict({"arrays": named(arrays), "config": ConfigRecord(config)})
    return Message(content=content, metadata=meta)


def context(partition_id: int | None = 4) -> Context:
    node_config = {} if partition_id is None else {"partition-id": partition_id}
    return Context(run_id=1, node_id=5, node_config=node_config, state=RecordDict(), run_config={})


def trained(offset: float) -> dict[str, np.ndarray]:
    return {name: np.asarray(a, dtype=np.float64) + offset for name, a in CENTER.items()}


def test_reads_center_rho_round_and_config() -> None:
    msg = train_message(rho=0.3, **{"proximal-mu": 0.3, "server-round": 4, "lr": 0.1})
    step = ADMMTrainStep.from_message(msg, context())
    assert list(step.center) == list(CENTER)
    for name, a in CENTER.items():
        assert step.center[name].dtype == np.float64 and step.center[name].shape == a.shape
        np.testing.assert_array_equal(step.center[name], a)
    assert (step.rho, step.admm, step.server_round) == (0.3, True, 4)
    assert step.config["lr"] == 0.1 and step.previous is None


def test_reply_keeps_names_and_dtypes_and_reports_weight_and_key() -> None:
    msg = train_message(rho=0.3, **{"server-round": 2})
    reply = build_reply(msg, trained(1.0), 17, {"loss": np.float32(0.5), "done": True}, context())
    arrays = reply.content["arrays"]
    assert list(arrays.keys()) == list(CENTER)
    for name, a in CENTER.items():
        sent = arrays[name].numpy()
        assert sent.dtype == a.dtype and sent.shape == a.shape
        np.testing.assert_array_equal(sent, (np.asarray(a, dtype=np.float64) + 1.0).astype(a.dtype))
    metrics = dict(reply.content["metrics"])
    assert metrics == {"partition-id": 4, "loss": 0.5, "done": 1, "num-examples": 17}
    assert reply.metadata.dst_node_id == 1 and reply.metadata.src_node_id == 5


def test_reply_refuses_what_the_server_would_reject() -> None:
    msg = train_message(rho=0.3)
    with pytest.raises(ValueError, match="num_examples"):
        build_reply(msg, trained(0.0), 0)
    with pytest.raises(ValueError, match="arrays"):
        build_reply(msg, list(trained(0.0).values())[:2], 3)
    with pytest.raises(ValueError, match="metrics\\['note'\\]"):
        build_reply(msg, trained(0.0), 3, {"note": "text"})


def test_warm_start_is_the_last_reply_under_fedadmm_only() -> None:
    ctx = context()
    first = ADMMTrainStep.from_message(train_message(rho=0.3, **{"server-round": 1}), ctx)
    for name, a in first.start().items():
        np.testing.assert_array_equal(a, CENTER[name])  # nothing kept yet: the center
    first.reply(trained(2.0), 10, context=ctx)
    assert ctx.state.config_records["flwr_admm.message.meta"]["round"] == 1
    second = ADMMTrainStep.from_message(train_message(trained(5.0), rho=0.3), ctx)
    for name, a in second.start().items():
        np.testing.assert_array_equal(a, trained(2.0)[name])  # float64, not rounded to int
    assert second.start(init="center")["fc.bias"][0] == 5.25
    # FedProx (proximal-mu only), rho = 0: start at the received arrays.
    for config in ({"proximal-mu": 0.3}, {"rho": 0.0, "proximal-mu": 0.0}):
        step = ADMMTrainStep.from_message(train_message(trained(5.0), **config), ctx)
        assert step.previous is not None
        np.testing.assert_array_equal(step.start()["fc.bias"], trained(5.0)["fc.bias"])


def test_warm_start_needs_the_same_names_and_shapes() -> None:
    ctx = context()
    build_reply(train_message(rho=0.3), trained(1.0), 3, context=ctx)
    assert warm_start(ctx, CENTER) is not None
    renamed = {("x." + k): v for k, v in CENTER.items()}
    assert warm_start(ctx, renamed) is None
    reshaped = {**CENTER, "fc.bias": np.zeros(3)}
    assert warm_start(ctx, reshaped) is None


def test_a_non_finite_w_is_not_kept_as_warm_start() -> None:
    ctx = context()
    build_reply(train_message(rho=0.3), trained(1.0), 3, context=ctx)
    poisoned = {**trained(1.0), "fc.bias": np.array([np.nan, 0.0])}
    build_reply(train_message(rho=0.3), poisoned, 3, context=ctx)  # still replied
    kept = warm_start(ctx, CENTER)
    assert kept is not None
    np.testing.assert_array_equal(kept["fc.bias"], trained(1.0)["fc.bias"])


# ------------------------------------------------------------- client-held duals
def duals_message(server_round: int, ack: int, rebuild: int = 0, **extra: Any) -> Message:
    config = {"rho": 0.5, "admm-duals": "client", "server-round": server_round}
    config.update({"admm-ack-round": ack, "admm-rebuild": rebuild, **extra})
    return train_message(**config)


def test_client_held_duals_round_trip_by_hand() -> None:
    """Round 1 fresh, round 2 acknowledged: u = w1 - z2, Delta = n(w2 + u) - n(w1 + 0)."""
    ctx = context()
    z = {n: np.asarray(a, dtype=np.float64) for n, a in CENTER.items()}
    first = ADMMTrainStep.from_message(duals_message(1, 0), ctx)
    assert first.duals is not None and first.previous is None
    w1 = trained(1.0)
    reply = first.reply(w1, 10, {"loss": 0.5}, ctx)
    metrics = reply.content["metrics"]
    assert metrics["admm-previous-round"] == 0 and metrics["admm-examples-change"] == 10
    assert metrics["num-examples"] == 10 and metrics["partition-id"] == 4
    assert "admm-share" not in reply.content.array_records
    for name in CENTER:
        sent = reply.content["arrays"][name].numpy()
        assert sent.dtype == np.float64  # a change of a sum, never cast to float32/int64
        np.testing.assert_array_equal(sent, 10 * w1[name])
    second = ADMMTrainStep.from_message(duals_message(2, 1, rebuild=1), ctx)
    assert second.previous is not None
    for name in CENTER:
        u = w1[name] - z[name]  # u += w1 - z^2 (z unchanged here)
        np.testing.assert_array_equal(second.center[name], z[name] - u)
        np.testing.assert_array_equal(second.start()[name], z[name])  # "auto": z here
        np.testing.assert_array_equal(second.start(init="previous")[name], w1[name])
        np.testing.assert_array_equal(second.start(init="center")[name], z[name] - u)
        np.testing.assert_array_equal(second.start(init="consensus")[name], z[name])
    w2 = trained(2.0)
    reply = second.reply(w2, 10, None, ctx)
    assert reply.content["metrics"]["admm-previous-round"] == 1
    assert "admm-delayed-sq-residual" in reply.content["metrics"]
    for name in CENTER:
        u = w1[name] - z[name]
        change = reply.content["arrays"][name].numpy()
        np.testing.assert_allclose(change, 10 * (w2[name] + u) - 10 * w1[name], rtol=1e-12)
        share = reply.content["admm-share"][name].numpy()
        np.testing.assert_allclose(share, 10 * (w2[name] + u), rtol=1e-12)


def test_a_node_that_lost_its_state_trains_from_the_offered_share() -> None:
    """Round 2 with ``admm-restore`` c = w1 (u was 0): the same center and Delta as kept.

    The node restored from the offer says so (``admm-restored``, no d2: it has no w1 of
    its own) and keeps no committed state (the offer comes again if the reply is lost).
    """
    kept_ctx, z = context(), {n: np.asarray(a, dtype=np.float64) for n, a in CENTER.items()}
    w1, w2 = trained(1.0), trained(2.0)
    ADMMTrainStep.from_message(duals_message(1, 0), kept_ctx).reply(w1, 10, None, kept_ctx)
    offer = {
        "admm-restore": restore_payload([10 * w1[n] for n in CENTER], 10),
        "admm-restore-examples": 10,
    }
    kept = ADMMTrainStep.from_message(duals_message(2, 1, **offer), kept_ctx)
    lost_ctx = context()  # the SuperNode restarted: context.state is empty
    lost = ADMMTrainStep.from_message(duals_message(2, 1, **offer), lost_ctx)
    assert lost.previous is None and kept.previous is not None
    for name in CENTER:
        np.testing.assert_array_equal(lost.center[name], kept.center[name])
        np.testing.assert_array_equal(lost.center[name], z[name] - (w1[name] - z[name]))
    from_kept, from_offer = kept.reply(w2, 10, None, kept_ctx), lost.reply(w2, 10, None, lost_ctx)
    for name in CENTER:
        np.testing.assert_array_equal(
            from_offer.content["arrays"][name].numpy(), from_kept.content["arrays"][name].numpy()
        )
    metrics = from_offer.content["metrics"]
    assert metrics["admm-restored"] == 1 and metrics["admm-previous-round"] == 1
    assert metrics["admm-resync"] == 0 and "admm-delayed-sq-residual" not in metrics
    assert "admm-restored" not in from_kept.content["metrics"]
    duals = load_states(lost_ctx.state, [t.shape for t in z.values()])
    assert duals.committed is None and duals.pending is not None
    without = ADMMTrainStep.from_message(duals_message(2, 1), context())  # no offer: resync
    assert without.duals is not None and without.duals.resync and without.duals.state is None


def test_a_malformed_offer_is_refused_naming_the_field() -> None:
    ctx, good = context(), restore_payload([np.zeros(np.size(a)) for a in CENTER.values()], 1)
    cases = {
        "admm-restore-examples": {"admm-restore": good, "admm-restore-examples": 0},
        "admm-restore: must be .npy": {"admm-restore": b"junk", "admm-restore-examples": 1},
        "admm-restore: not offered with admm-dual-step": {
            "admm-restore": good,
            "admm-restore-examples": 1,
            "admm-dual-step": 0.5,
        },
    }
    for match, extra in cases.items():
        with pytest.raises(ValueError, match=match):
            ADMMTrainStep.from_message(duals_message(2, 1, **extra), ctx)
    short = restore_payload([np.zeros(1)], 1)
    with pytest.raises(ValueError, match="finite float64 numbers"):
        ADMMTrainStep.from_message(
            duals_message(2, 1, **{"admm-restore": short, "admm-restore-examples": 1}), ctx
        )


def test_client_held_duals_refuse_what_they_cannot_do() -> None:
    with pytest.raises(ValueError, match="rho > 0"):
        ADMMTrainStep.from_message(duals_message(1, 0, rho=0.0), context())
    with pytest.raises(ValueError, match="admm-ack-round"):
        ADMMTrainStep.from_message(duals_message(1, -1), context())
    step = ADMMTrainStep.from_message(duals_message(1, 0), context())
    with pytest.raises(ValueError, match="context"):
        step.reply(trained(1.0), 10)


def test_start_names_the_init_and_needs_z_for_consensus() -> None:
    """init = ADMMClient's local_init; z only from client duals."""
    ctx = context()
    step = ADMMTrainStep.from_message(train_message(rho=0.3, **{"server-round": 1}), ctx)
    step.reply(trained(2.0), 10, context=ctx)
    second = ADMMTrainStep.from_message(train_message(trained(5.0), rho=0.3), ctx)
    assert second.consensus is None  # no admm-start record: only v_i = z - u_i arrived
    assert second.start(init="previous")["fc.bias"][0] == trained(2.0)["fc.bias"][0]
    assert second.start(init="center")["fc.bias"][0] == 5.25
    with pytest.raises(ValueError, match=r"local_init / init: 'consensus'.*'admm-start'"):
        second.start(init="consensus")
    with pytest.raises(ValueError, match=r"init: must be one of \['auto', 'previous', 'center'"):
        second.start(init="zero")  # type: ignore[arg-type]
    # FedProx / rho = 0: the received arrays are the model itself, as ADMMClient starts
    for config in ({"proximal-mu": 0.3}, {"rho": 0.0}):
        step = ADMMTrainStep.from_message(train_message(trained(5.0), **config), ctx)
        assert step.start(init="consensus")["fc.bias"][0] == 5.25


def start_message(
    center: dict[str, np.ndarray], z: dict[str, np.ndarray], **config: Any
) -> Message:
    """A FedADMM message: v_i under arrays, z under admm-start."""
    message = train_message(center, **config)
    message.content.array_records["admm-start"] = named(z)
    return message


def test_auto_starts_at_the_received_z_and_marks_the_reply() -> None:
    """FedADMM sends z next to v_i: auto starts there; the reply says so (admm-started-at-z)."""
    ctx, z = context(), trained(1.0)
    step = ADMMTrainStep.from_message(start_message(trained(5.0), z, rho=0.3), ctx)
    assert step.consensus is not None
    np.testing.assert_array_equal(step.start()["fc.bias"], z["fc.bias"])  # not v_i (5.25)
    np.testing.assert_array_equal(step.center["fc.bias"], trained(5.0)["fc.bias"])
    assert step.reply(trained(2.0), 10, context=ctx).content["metrics"]["admm-started-at-z"] == 1
    step.start(init="center")  # the user's own choice: still a helper's reply, mark 0
    assert step.reply(trained(2.0), 10, context=ctx).content["metrics"]["admm-started-at-z"] == 0
    # FedProx / FedAvg replies carry no mark: only FedADMM reads it
    fedprox = ADMMTrainStep.from_message(train_message(**{"proximal-mu": 0.3}), ctx)
    fedprox.start()
    assert "admm-started-at-z" not in fedprox.reply(trained(2.0), 10).content["metrics"]


def test_a_start_record_with_other_tensors_is_refused() -> None:
    z = trained(1.0)
    with pytest.raises(ValueError, match=r"admm-start: expected tensors"):
        ADMMTrainStep.from_message(
            start_message(CENTER, {"fc.bias": z["fc.bias"]}, rho=0.3), context()
        )
    bad = {**z, "fc.bias": np.zeros(3)}
    with pytest.raises(ValueError, match=r"admm-start\['fc.bias'\]: expected shape \(2,\)"):
        ADMMTrainStep.from_message(start_message(CENTER, bad, rho=0.3), context())


@pytest.mark.parametrize(
    "asked",
    [LocalDP(clip=0.01, noise_multiplier=1.0).config(), {"uplink": "topk"}],
    ids=["local_dp", "uplink"],
)
def test_a_handler_that_cannot_clip_or_compress_refuses_to_reply_plainly(
    asked: dict[str, Any],
) -> None:
    """The server would otherwise report a privacy (or a compression) it did not get."""
    msg = train_message(rho=0.3, **{"server-round": 1, **asked})
    with pytest.raises(ValueError, match=f"{next(iter(asked))}: the strategy asks for"):
        ADMMTrainStep.from_message(msg, context())
