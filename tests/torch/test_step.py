"""flwr_admm.torch.TorchADMM: the decoupled prox step, the loop vs numpy's, both APIs."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch
from flwr.app import ConfigRecord, Context, Message, MessageType, RecordDict
from flwr.client import NumPyClient
from flwr.common import ndarrays_to_parameters, parameters_to_ndarrays
from message_replies import metadata, named

from flwr_admm.client import ADMMClient
from flwr_admm.core.client_duals import restore_payload
from flwr_admm.core.local_solver import LocalPlan, penalized_local_solve
from flwr_admm.data import load_task
from flwr_admm.models import LogisticRegression
from flwr_admm.server import FedADMMClientDuals
from flwr_admm.testing import make_proxies, run_rounds
from flwr_admm.torch import TorchADMM, load_arrays, state_arrays
from flwr_admm.torch.models import SmallCNN, TorchLogistic
from flwr_admm.uplink import LocalDP

torch.use_deterministic_algorithms(True)


class Quadratic(torch.nn.Module):
    """f(w) = 1/2 sum_k a_k (w_k - c_k)^2, minimized with f + rho/2 ||w - v||^2 in closed form."""

    def __init__(self, a: np.ndarray, c: np.ndarray) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.zeros(len(a), dtype=torch.float64))
        self.a, self.c = torch.as_tensor(a), torch.as_tensor(c)

    def loss(self) -> torch.Tensor:
        return 0.5 * torch.sum(self.a * (self.w - self.c) ** 2)


def context(partition_id: int = 0) -> Context:
    return Context(
        run_id=1,
        node_id=5,
        node_config={"partition-id": partition_id},
        state=RecordDict(),
        run_config={},
    )


def test_prox_step_is_the_exact_proximal_map_for_any_rho() -> None:
    model = Quadratic(np.ones(3), np.zeros(3))
    v = np.array([1.0, -2.0, 3.0])
    for rho, eta in [(0.1, 0.5), (1e6, 1.0), (3.0, 2.0)]:
        admm = TorchADMM.from_parameters(model, [v], {"rho": rho})  # v is the center
        admm.start()
        w = np.array([0.5, 0.25, -4.0])
        load_arrays(model, {"w": w})
        optimizer = torch.optim.SGD(model.parameters(), lr=eta)
        admm.after_step(optimizer)
        # argmin_x rho/2 ||x - v||^2 + 1/(2 eta) ||x - w||^2, by its optimality condition
        expected = (w / eta + rho * v) / (1 / eta + rho)
        assert np.allclose(state_arrays(model)["w"], expected, rtol=1e-14, atol=1e-14)
        assert np.allclose(state_arrays(model)["w"], v, atol=1e-5) == (rho > 1e5)


@pytest.mark.parametrize("penalty", ["prox", "loss"])
def test_sgd_loop_reaches_the_penalized_minimizer_of_a_quadratic(penalty: str) -> None:
    a, c, v, rho = (
        np.array([1.0, 4.0, 0.5]),
        np.array([2.0, -1.0, 0.0]),
        np.array([0.0, 1.0, 5.0]),
        2.0,
    )
    model = Quadratic(a, c)
    admm = TorchADMM.from_parameters(model, [v], {"rho": rho}, penalty=penalty)  # type: ignore[arg-type]
    admm.start()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(400):
        optimizer.zero_grad()
        (model.loss() + admm.penalty_term()).backward()
        optimizer.step()
        admm.after_step(optimizer)
    expected = (a * c + rho * v) / (a + rho)  # grad f + rho (w - v) = 0
    assert np.allclose(state_arrays(model)["w"], expected, atol=1e-12)


def run_torch_loop(
    model: TorchLogistic,
    admm: TorchADMM,
    X: np.ndarray,
    y: np.ndarray,
    plan: LocalPlan,
    rng: np.random.Generator,
) -> None:
    optimizer = torch.optim.SGD(model.parameters(), lr=plan.learning_rate)
    Xt, yt = torch.as_tensor(X, dtype=model.coef.dtype), torch.as_tensor(y)
    for index in plan.batches(X.shape[0], rng):
        xb, yb = (Xt, yt) if index is None else (Xt[index], yt[index])
        optimizer.zero_grad()
        (model.loss(xb, yb) + admm.penalty_term()).backward()
        optimizer.step()
        admm.after_step(optimizer)


@pytest.mark.parametrize(
    ("dtype", "batch_size", "tol"),
    [(torch.float64, None, 1e-12), (torch.float32, None, 2e-6), (torch.float32, 50, 2e-6)],
)
def test_torch_loop_equals_the_numpy_loop_on_the_logistic_task(
    dtype: torch.dtype, batch_size: int | None, tol: float
) -> None:
    task = load_task("seed-logreg", seed=42)
    X, y = task.data.X[3], task.data.y[3]
    numpy_model = LogisticRegression(20, l2=0.01, fit_intercept=True)
    rng = np.random.default_rng(7)
    start = [0.3 * rng.standard_normal(20), np.array([0.1])]
    center = [0.3 * rng.standard_normal(20), np.array([-0.2])]
    plan = LocalPlan(learning_rate=1.0, steps=20, batch_size=batch_size, prox_step="exact")
    rho = 0.5
    expected = penalized_local_solve(
        numpy_model, start, X, y, plan, center=center, rho=rho, rng=np.random.default_rng(3)
    ).params
    model = TorchLogistic(20, l2=0.01).to(dtype)
    admm = TorchADMM.from_parameters(model, center, {"rho": rho, "server_round": 2})
    admm.previous = dict(zip(["coef", "intercept"], start, strict=True))  # the warm start
    admm.start()
    run_torch_loop(model, admm, X, y, plan, np.random.default_rng(3))
    got = list(state_arrays(model).values())
    scale = max(np.abs(expected[0]).max(), 1.0)
    for g, e in zip(got, expected, strict=True):
        assert np.abs(g - e).max() <= tol * scale


def test_loss_mode_gradient_is_rho_times_w_minus_v() -> None:
    model = TorchLogistic(4)
    v = [np.array([1.0, 2.0, 3.0, 4.0]), np.array([0.5])]
    admm = TorchADMM.from_parameters(model, v, {"rho": 0.7}, penalty="loss")
    admm.start(init="center")
    load_arrays(model, {"coef": np.zeros(4), "intercept": np.zeros(1)})
    admm.penalty_term().backward()
    assert np.allclose(model.coef.grad.numpy(), -0.7 * v[0])  # type: ignore[union-attr]
    assert np.allclose(model.intercept.grad.numpy(), -0.7 * v[1])  # type: ignore[union-attr]


def cnn() -> SmallCNN:
    torch.manual_seed(0)
    return SmallCNN((1, 8, 8), 10, width=4)


def train_message(arrays: dict[str, np.ndarray], **config: object) -> Message:
    meta = metadata(1, MessageType.TRAIN)
    meta.dst_node_id = 5
    return Message(
        RecordDict({"arrays": named(arrays), "config": ConfigRecord(config)}), metadata=meta
    )


def test_message_api_round_trip_keeps_names_dtypes_and_warm_starts_parameters_only() -> None:
    model, ctx = cnn(), context(partition_id=2)
    sent = state_arrays(model)
    assert sent["features.1.num_batches_tracked"].shape == ()
    first = TorchADMM.from_message(model, train_message(sent, rho=0.5, **{"server-round": 1}), ctx)
    first.start()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1.0)
    model.features[1].running_mean.add_(3.0)  # type: ignore[operator]
    reply = first.reply(num_examples=12, metrics={"loss": 0.25})
    record = reply.content.array_records["arrays"]
    assert list(record.keys()) == list(sent)
    assert record["features.1.num_batches_tracked"].dtype == "int64"
    assert record["features.1.num_batches_tracked"].shape == ()
    assert reply.content.metric_records["metrics"]["partition-id"] == 2
    # round 2: parameters from the node's own w_i, buffers from the received model
    second = TorchADMM.from_message(model, train_message(sent, rho=0.5, **{"server-round": 2}), ctx)
    second.start()
    now = state_arrays(model)
    assert np.allclose(now["head.weight"], sent["head.weight"] + 1.0)
    assert np.allclose(now["features.1.running_mean"], sent["features.1.running_mean"])
    # FedAvg / FedProx (no rho): start at the received model
    third = TorchADMM.from_message(model, train_message(sent, **{"proximal-mu": 0.5}), ctx)
    third.start()
    assert np.allclose(state_arrays(model)["head.weight"], sent["head.weight"])
    assert third.rho == 0.5 and not third.admm


def test_refuses_other_tensors_and_bad_settings() -> None:
    model = TorchLogistic(3)
    with pytest.raises(ValueError, match="parameters: expected 2 tensors"):
        TorchADMM.from_parameters(model, [np.zeros(3)], {"rho": 1.0})
    with pytest.raises(ValueError, match=r"arrays\['coef'\]: expected shape"):
        load_arrays(model, {"coef": np.zeros(4), "intercept": np.zeros(1)})
    with pytest.raises(ValueError, match="rho: must be"):
        TorchADMM.from_parameters(model, [np.zeros(3), np.zeros(1)], {"rho": -1.0})
    with pytest.raises(ValueError, match="penalty: must be one of"):
        TorchADMM.from_parameters(model, [np.zeros(3), np.zeros(1)], {}, penalty="l2")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="uplink"):
        TorchADMM.from_parameters(model, [np.zeros(3), np.zeros(1)], {"uplink": "topk"})
    dp = LocalDP(clip=0.01, noise_multiplier=1.0).config()
    message = train_message(state_arrays(model), rho=0.5, **{"server-round": 1, **dp})
    with pytest.raises(ValueError, match="dp-clip: the strategy asks for"):
        TorchADMM.from_message(model, message, context())  # local DP: never a plain reply
    with pytest.raises(ValueError, match="buffers"):
        TorchADMM.from_parameters(
            cnn(),
            list(state_arrays(cnn()).values()),
            {"rho": 1.0, "admm-duals": "client"},
            context(),
        )
    # the Message API refuses a model with buffers under client-held duals alike
    message = train_message(state_arrays(cnn()), **{"rho": 1.0, "admm-duals": "client"})
    message.content["config"]["server-round"] = 1
    with pytest.raises(ValueError, match=r"buffers \['.*running_mean"):
        TorchADMM.from_message(cnn(), message, context())


# ------------------------------------------------- where the local solve starts
Z1 = {"coef": np.array([0.5, -1.0, 2.0]), "intercept": np.array([0.25])}
W1 = {"coef": np.array([1.5, 0.25, -0.5]), "intercept": np.array([-0.75])}  # "trained"
Z2 = {"coef": np.array([1.0, -0.5, 0.75]), "intercept": np.array([0.5])}


def client_duals_round(
    api: str,
    model: TorchLogistic,
    z: dict[str, np.ndarray],
    server_round: int,
    ctx: Context,
    **extra: float,
) -> TorchADMM:
    config: dict[str, Any] = {"rho": 0.5, "admm-duals": "client", **extra}
    if api == "legacy":
        config["server_round"] = server_round
        return TorchADMM.from_parameters(model, list(z.values()), config, ctx)
    message = train_message(z, **config, **{"server-round": server_round})
    return TorchADMM.from_message(model, message, ctx)


@pytest.mark.parametrize("api", ["legacy", "message"])
def test_consensus_starts_at_the_received_z_center_at_z_minus_the_dual(api: str) -> None:
    """Client-held duals, round 2: u = 0 + w1 - z2 != 0, so z2, z2 - u and w1 all differ."""
    model, ctx = TorchLogistic(3).double(), context()
    first = client_duals_round(api, model, Z1, 1, ctx)
    first.start(init="consensus")  # a new client: z1 (= its center, u = 0)
    for name, z in Z1.items():
        np.testing.assert_array_equal(state_arrays(model)[name], z)
    load_arrays(model, W1)
    if api == "legacy":  # keep w1 and u = 0
        first.fit_result(10)
    else:
        first.reply(10)
    starts = {}
    for init in ("consensus", "center", "previous"):
        admm = client_duals_round(api, model, Z2, 2, ctx)  # same kept state each time
        admm.start(init=init)  # type: ignore[arg-type]
        starts[init] = state_arrays(model)
    for name, z in Z2.items():
        u = W1[name] - z  # dyadic numbers: exact
        np.testing.assert_array_equal(starts["consensus"][name], z)
        np.testing.assert_array_equal(starts["center"][name], z - u)
        np.testing.assert_array_equal(starts["previous"][name], W1[name])
        assert np.all(starts["consensus"][name] != starts["center"][name])


@pytest.mark.parametrize("api", ["legacy", "message"])
def test_client_held_duals_take_the_servers_dual_step(api: str) -> None:
    """admm-dual-step gamma: u = 0 + gamma (w1 - z2), the center z2 - u."""
    model, ctx = TorchLogistic(3).double(), context()
    first = client_duals_round(api, model, Z1, 1, ctx, **{"admm-dual-step": 0.5})
    first.start(init="consensus")
    load_arrays(model, W1)
    if api == "legacy":
        first.fit_result(10)
    else:
        first.reply(10)
    admm = client_duals_round(api, model, Z2, 2, ctx, **{"admm-dual-step": 0.5})
    admm.start(init="center")
    for name, z in Z2.items():
        np.testing.assert_array_equal(state_arrays(model)[name], z - 0.5 * (W1[name] - z))


@pytest.mark.parametrize("api", ["legacy", "message"])
def test_a_node_that_lost_its_state_trains_from_the_offered_share(api: str) -> None:
    """Round 2 with ``admm-restore`` c = w1 (its u was 0): the kept node's center and Delta."""
    kept_model, kept_ctx = TorchLogistic(3).double(), context()
    first = client_duals_round(api, kept_model, Z1, 1, kept_ctx)
    first.start(init="consensus")
    load_arrays(kept_model, W1)
    first.fit_result(10) if api == "legacy" else first.reply(10)
    offer = {
        "admm-ack-round": 1,
        "admm-restore": restore_payload([10 * w for w in W1.values()], 10),
        "admm-restore-examples": 10,
    }
    replies = []
    for model, ctx in ((kept_model, kept_ctx), (TorchLogistic(3).double(), context())):
        admm = client_duals_round(api, model, Z2, 2, ctx, **offer)  # type: ignore[arg-type]
        admm.start(init="center")
        for name, z in Z2.items():
            np.testing.assert_array_equal(state_arrays(model)[name], z - (W1[name] - z))
        load_arrays(model, Z1)  # the same "trained" w2 for both
        if api == "legacy":
            arrays, _, metrics = admm.fit_result(10)
        else:
            reply = admm.reply(10)
            names = list(Z2)
            arrays = [reply.content["arrays"][n].numpy() for n in names]
            metrics = dict(reply.content["metrics"])
        replies.append((arrays, metrics))
    (kept_arrays, kept_metrics), (restored_arrays, restored_metrics) = replies
    for a, b in zip(kept_arrays, restored_arrays, strict=True):
        np.testing.assert_array_equal(a, b)
    assert restored_metrics["admm-restored"] == 1 and "admm-restored" not in kept_metrics
    assert "admm-delayed-sq-residual" not in restored_metrics
    assert restored_metrics["admm-previous-round"] == kept_metrics["admm-previous-round"] == 1


def test_consensus_needs_the_z_that_only_client_held_duals_send() -> None:
    model, v = TorchLogistic(3).double(), list(Z2.values())
    legacy = TorchADMM.from_parameters(model, v, {"rho": 0.5, "server_round": 1}, context())
    message = TorchADMM.from_message(
        model, train_message(Z2, rho=0.5, **{"server-round": 1}), context()
    )
    for admm in (legacy, message):  # no admm-start record: v_i = z - u_i is all they got
        assert admm.consensus is None
        with pytest.raises(ValueError, match=r"local_init / init: 'consensus'.*'admm-start'"):
            admm.start(init="consensus")
    with pytest.raises(ValueError, match=r"init: must be one of \['auto', 'previous', 'center'"):
        legacy.start(init="zero")  # type: ignore[arg-type]
    # FedProx, FedAvg, rho = 0: the received model is z; ADMMClient starts there too
    for config in ({"proximal_mu": 0.5}, {}, {"rho": 0.0}):
        admm = TorchADMM.from_parameters(model, v, config, context())
        admm.start(init="consensus")
        np.testing.assert_array_equal(state_arrays(model)["coef"], Z2["coef"])


class TorchLogisticClient(NumPyClient):
    """The numpy ADMMClient's loop with a float64 TorchLogistic (both dual modes)."""

    def __init__(
        self, X: np.ndarray, y: np.ndarray, context: Context, init: str = "previous"
    ) -> None:
        self.X, self.y, self.context, self.init = X, y, context, init

    def fit(self, parameters, config):  # type: ignore[no-untyped-def]
        model = TorchLogistic(X_FEATURES, l2=0.01).double()
        admm = TorchADMM.from_parameters(model, parameters, config, self.context)
        admm.start(init=self.init)  # type: ignore[arg-type]
        plan = LocalPlan(
            learning_rate=float(config["learning_rate"]), steps=int(config["local_steps"])
        )
        pid = int(self.context.node_config["partition-id"])
        rng = np.random.default_rng([0, pid, int(config.get("server_round", 0))])
        run_torch_loop(model, admm, self.X, self.y, plan, rng)
        return admm.fit_result(int(self.X.shape[0]))


X_FEATURES = 20


@pytest.mark.parametrize(
    ("duals", "local_init"),
    [("server", "previous"), ("server", "center"), ("client", "previous"), ("client", "consensus")],
)
def test_torch_client_follows_the_numpy_client_through_a_strategy(
    duals: str, local_init: str
) -> None:
    from flwr_admm.server import FedADMM

    task = load_task("seed-logreg", seed=42)
    data = [(task.data.X[i][:60], task.data.y[i][:60]) for i in range(4)]
    config = {"learning_rate": 0.5, "local_steps": 5}

    def numpy_fn(ctx: Context):  # type: ignore[no-untyped-def]
        X, y = data[int(ctx.node_config["partition-id"])]
        model = LogisticRegression(X_FEATURES, l2=0.01)
        return ADMMClient(model, X, y, context=ctx, local_init=local_init).to_client()  # type: ignore[arg-type]

    def torch_fn(ctx: Context):  # type: ignore[no-untyped-def]
        X, y = data[int(ctx.node_config["partition-id"])]
        return TorchLogisticClient(X, y, ctx, local_init).to_client()

    zs = []
    for fn in (numpy_fn, torch_fn):
        kind = FedADMMClientDuals if duals == "client" else FedADMM
        strategy = kind(rho=0.5, on_fit_config_fn=lambda _: dict(config), min_available_clients=4)
        initial = ndarrays_to_parameters([np.zeros(X_FEATURES), np.zeros(1)])
        result = run_rounds(strategy, make_proxies(fn, 4), 6, initial_parameters=initial)
        zs.append(parameters_to_ndarrays(result.parameters))
    for a, b in zip(*zs, strict=True):
        assert np.allclose(a, b, rtol=1e-10, atol=1e-12)
    assert np.abs(zs[0][0]).max() > 0.01  # it moved


def test_adam_with_the_loss_term_reaches_the_penalized_minimizer_and_prox_stays_stable() -> None:
    a, c, v = np.array([1.0, 4.0, 0.5]), np.array([2.0, -1.0, 0.0]), np.array([0.0, 1.0, 5.0])
    for penalty, rho in (("loss", 2.0), ("prox", 1e6)):
        model = Quadratic(a, c)
        admm = TorchADMM.from_parameters(model, [v], {"rho": rho}, penalty=penalty)  # type: ignore[arg-type]
        admm.start()
        optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
        for _ in range(3000):
            optimizer.zero_grad()
            (model.loss() + admm.penalty_term()).backward()
            optimizer.step()
            admm.after_step(optimizer)
        w = state_arrays(model)["w"]
        if penalty == "loss":  # the exact objective, whatever the optimizer
            np.testing.assert_allclose(w, (a * c + rho * v) / (a + rho), atol=1e-4)
        else:  # eta rho = 1e4: the prox step pins w to v, no blow-up
            np.testing.assert_allclose(w, v, atol=1e-3)


def test_both_builders_start_at_the_received_z_and_mark_the_reply() -> None:
    """FedADMM sends z next to v_i (Message API: admm-start record; legacy: v_i then z
    with admm-start = 1): auto starts there, the reply says so; without z, mark 1 asks
    the legacy server for it (the first center of a new client is z itself)."""
    model = TorchLogistic(3).double()
    v = {n: a + 1.0 for n, a in Z2.items()}
    message = train_message(v, rho=0.5, **{"server-round": 2})
    message.content.array_records["admm-start"] = named(Z2)
    legacy_config = {"rho": 0.5, "server_round": 2, "admm-start": 1}
    parameters = [*v.values(), *Z2.values()]
    for admm in (
        TorchADMM.from_message(model, message, context()),
        TorchADMM.from_parameters(model, parameters, legacy_config, context()),
    ):
        admm.start()
        np.testing.assert_array_equal(state_arrays(model)["coef"], Z2["coef"])
        np.testing.assert_array_equal(admm.received["coef"], v["coef"])  # the center
    message_reply = TorchADMM.from_message(model, message, context())
    message_reply.start()
    assert message_reply.reply(10).content["metrics"]["admm-started-at-z"] == 1
    legacy = TorchADMM.from_parameters(model, list(v.values()), {"rho": 0.5}, context())
    legacy.start()  # no z received: from v (or the warm start); still asks for z
    assert legacy.fit_result(10)[2]["admm-started-at-z"] == 1
    legacy.start(init="previous")
    assert legacy.fit_result(10)[2]["admm-started-at-z"] == 0
    with pytest.raises(
        ValueError, match=r"FedADMM sends v_i, then z \(admm-start = 1\): expected 4 tensors"
    ):
        TorchADMM.from_parameters(model, list(v.values()), legacy_config, context())
