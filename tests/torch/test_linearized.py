"""`TorchADMM` in FedADMM's linearized form: SCAFFOLD option II with the user's own loop,
the step budget of SGD, momentum and Adam, the legacy API, and the refused loops."""

from __future__ import annotations

import re
from collections.abc import Callable

import numpy as np
import pytest
import torch
from flower_run import admm_client_fn, seed_data, seed_model
from flwr.app import Array, ArrayRecord, Context, Message, RecordDict
from flwr.client import NumPyClient
from flwr.clientapp import ClientApp
from flwr.common import ndarrays_to_parameters, parameters_to_ndarrays
from message_apps import ZRecorder, local_data
from seed_task import gaps

import flwr_admm.server
from flwr_admm.clientapp import make_client_app
from flwr_admm.core.linearized import SCAFFNEW
from flwr_admm.serverapp import SCAFFOLD, FedADMM, FedADMMClientDuals
from flwr_admm.serverapp.testing import InProcessGrid, run_strategy
from flwr_admm.testing import make_proxies, run_rounds
from flwr_admm.torch import TorchADMM
from flwr_admm.torch.models import TorchLogistic

torch.use_deterministic_algorithms(True)

N, D = 10, 20
STEPS, LR = 20, 1.0  # the seed task's local settings (flwr_admm.data.registry)
Optimizer = Callable[[torch.nn.Module], torch.optim.Optimizer]


def seed_torch_model() -> TorchLogistic:
    """The seed's model in torch, float64: logistic regression, l2 0.01, no intercept."""
    return TorchLogistic(D, l2=0.01, fit_intercept=False).double()


def run_loop(model: TorchLogistic, admm: TorchADMM, make: Optimizer, X, y, steps=STEPS) -> None:
    """The user's loop: full-batch steps on f_i + admm.penalty_term()."""
    optimizer = make(model)
    Xt, yt = torch.as_tensor(X), torch.as_tensor(y)
    for _ in range(steps):
        optimizer.zero_grad()
        (model.loss(Xt, yt) + admm.penalty_term()).backward()
        optimizer.step()
        admm.after_step(optimizer)


def sgd(lr: float = LR, **options: float) -> Optimizer:
    return lambda model: torch.optim.SGD(model.parameters(), lr=lr, **options)


def torch_app(make: Optimizer, budgets: list[float] | None = None) -> ClientApp:
    """A Message-API ClientApp: TorchADMM around the user's loop on the seed task."""
    app = ClientApp()

    @app.train()
    def train(msg: Message, context: Context) -> Message:
        X, y = local_data(context)
        model = seed_torch_model()
        admm = TorchADMM.from_message(model, msg, context)
        admm.start()
        run_loop(model, admm, make, X, y)
        if budgets is not None:
            budgets.append(admm.step_budget())
        return admm.reply(num_examples=len(y), metrics={"note": 1})

    return app


def run(strategy, app: ClientApp, rounds: int) -> np.ndarray:
    recorder = ZRecorder()
    zeros = ArrayRecord({"coef": Array(np.zeros(D))})
    run_strategy(strategy, InProcessGrid(app, N), zeros, rounds, evaluate_fn=recorder)
    return recorder.matrix[1:]


def every_node() -> dict[str, object]:
    return {"min_train_nodes": N, "min_available_nodes": N, "fraction_evaluate": 0.0}


def test_the_users_sgd_loop_is_scaffold_option_ii_over_15_rounds() -> None:
    budgets: list[float] = []
    linear = run(FedADMM(form=SCAFFNEW, **every_node()), torch_app(sgd(), budgets), 15)
    numpy_app = make_client_app(admm_client_fn(local_steps=STEPS, learning_rate=LR))
    scaffold = run(SCAFFOLD(server_learning_rate=1.0, **every_node()), numpy_app, 15)
    assert np.linalg.norm(scaffold[-1] - scaffold[0]) > 0.1  # the models really move
    np.testing.assert_allclose(linear, scaffold, rtol=0, atol=1e-10)
    assert set(budgets) == {STEPS * LR}  # b_i = K lr


def test_momentum_sgd_reports_k_lr_over_one_minus_momentum_and_converges() -> None:
    budgets: list[float] = []
    strategy = FedADMM(form=SCAFFNEW, **every_node())  # the textbook dual step
    z = run(strategy, torch_app(sgd(lr=0.1, momentum=0.9), budgets), 40)
    assert budgets[0] == pytest.approx(STEPS * 0.1 / (1 - 0.9), rel=1e-12)
    assert {r.scale for r in strategy.admm.records.values()} == {1 / budgets[0]}
    assert gaps(z)[-1] < 1e-8  # the pooled optimum: grad f_i(z) + y_i = 0 at consensus


def test_dampening_counts_in_the_budget() -> None:
    budgets: list[float] = []
    run(
        FedADMM(form="linearized", **every_node()),
        torch_app(sgd(0.1, momentum=0.5, dampening=0.5), budgets),
        1,
    )
    assert budgets[0] == pytest.approx(STEPS * 0.1 * 0.5 / 0.5, rel=1e-12)


class PlainSGD(torch.optim.SGD):
    """SGD under another type: the fitted budget's path, which must give K lr exactly."""


def test_the_fitted_budget_is_k_lr_for_plain_sgd_and_positive_for_adam() -> None:
    fitted: list[float] = []
    run(
        FedADMM(form="linearized", **every_node()),
        torch_app(lambda m: PlainSGD(m.parameters(), lr=0.5), fitted),
        2,
    )
    np.testing.assert_allclose(fitted, STEPS * 0.5, rtol=1e-10)
    adam: list[float] = []
    strategy = FedADMM(form="linearized", **every_node())
    z = run(strategy, torch_app(lambda m: torch.optim.Adam(m.parameters(), lr=0.02), adam), 60)
    assert all(np.isfinite(b) and b > 0 for b in adam)
    assert strategy.history[-1]["num_rejected"] == 0
    assert gaps(z)[-1] < gaps(z)[0] / 100  # it converges toward the pooled optimum


# ------------------------------------------------------------------ the legacy API
class TorchLinearizedClient(NumPyClient):
    """A legacy NumPyClient: TorchADMM.from_parameters around the same loop."""

    def __init__(self, X: np.ndarray, y: np.ndarray, context: Context) -> None:
        self.X, self.y, self.context = X, y, context

    def fit(self, parameters, config):  # type: ignore[no-untyped-def]
        model = seed_torch_model()
        admm = TorchADMM.from_parameters(model, parameters, config, self.context)
        admm.start()
        run_loop(model, admm, sgd(), self.X, self.y)
        return admm.fit_result(int(self.X.shape[0]))


def test_the_legacy_api_runs_the_numpy_clients_iteration() -> None:
    data = seed_data()

    def torch_fn(ctx: Context):  # type: ignore[no-untyped-def]
        i = int(ctx.node_config["partition-id"])
        labels = seed_model().encode_labels(data.y[i])
        return TorchLinearizedClient(data.X[i], labels, ctx).to_client()

    config = {"learning_rate": LR, "local_steps": STEPS}
    zs = []
    for fn in (admm_client_fn(), torch_fn):
        strategy = flwr_admm.server.FedADMM(
            form="linearized",
            on_fit_config_fn=lambda _: dict(config),
            min_available_clients=N,
            fraction_evaluate=0.0,
        )
        initial = ndarrays_to_parameters([np.zeros(D)])
        result = run_rounds(strategy, make_proxies(fn, N), 8, initial_parameters=initial)
        zs.append(parameters_to_ndarrays(result.parameters)[0])
        assert strategy.history[-1]["num_rejected"] == 0
    assert np.abs(zs[0]).max() > 0.1
    np.testing.assert_allclose(zs[1], zs[0], rtol=0, atol=1e-10)


def test_legacy_blocks_are_checked() -> None:
    model = seed_torch_model()
    config = {"admm-form": "linearized"}
    with pytest.raises(ValueError, match=r"^parameters: the linearized form sends z, then y_i"):
        TorchADMM.from_parameters(model, [np.zeros(D)], config)
    with pytest.raises(ValueError, match=r"^parameters: 'coef' must have shape"):
        TorchADMM.from_parameters(model, [np.zeros(D), np.zeros(3)], config)
    admm = TorchADMM.from_parameters(model, [np.ones(D), np.full(D, 0.5)], config)
    admm.start()
    np.testing.assert_array_equal(model.coef.detach().numpy(), np.ones(D))  # starts at z
    # the penalty term is the linear term <y_i, w>
    assert float(admm.penalty_term().detach()) == pytest.approx(0.5 * D)


# ------------------------------------------------------------------- refused loops
def one_round(app: ClientApp) -> FedADMM:
    strategy = FedADMM(form="linearized", min_train_nodes=2, min_available_nodes=2)
    run_strategy(strategy, InProcessGrid(app, 2), ArrayRecord({"coef": Array(np.zeros(D))}), 1)
    return strategy


def app_raising(
    loop: Callable[[TorchADMM, TorchLogistic, np.ndarray, np.ndarray], None], seen: list[str]
) -> ClientApp:
    app = ClientApp()

    @app.train()
    def train(msg: Message, context: Context) -> Message:
        X, y = local_data(context)
        model = seed_torch_model()
        admm = TorchADMM.from_message(model, msg, context)
        try:
            loop(admm, model, X, y)
            return admm.reply(num_examples=len(y))
        except ValueError as error:
            seen.append(str(error))
            raise

    return app


def no_linear_term(admm: TorchADMM, model: TorchLogistic, X, y) -> None:
    admm.start()
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    optimizer.zero_grad()
    model.loss(torch.as_tensor(X), torch.as_tensor(y)).backward()  # y_i dropped
    optimizer.step()
    admm.after_step(optimizer)


def no_after_step(admm: TorchADMM, model: TorchLogistic, X, y) -> None:
    admm.start()
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    optimizer.zero_grad()
    (model.loss(torch.as_tensor(X), torch.as_tensor(y)) + admm.penalty_term()).backward()
    optimizer.step()


def warm_start(admm: TorchADMM, model: TorchLogistic, X, y) -> None:
    admm.start(init="previous")


@pytest.mark.parametrize(
    ("loop", "message"),
    [
        (no_linear_term, r"^penalty_term: the linearized form adds <y_i, w> to the loss"),
        (no_after_step, r"^step_budget: no optimizer step was counted"),
        (warm_start, r"^init: the linearized form starts at z, got 'previous'"),
    ],
)
def test_a_loop_that_would_drop_the_dual_fails_loudly_and_nothing_is_folded(loop, message) -> None:
    seen: list[str] = []
    strategy = one_round(app_raising(loop, seen))
    assert seen and all(re.match(message, s) for s in seen)
    assert strategy.admm.records == {}  # no reply was folded


def test_client_held_duals_run_the_users_loop_as_scaffold_option_ii() -> None:
    budgets: list[float] = []
    held = run(FedADMMClientDuals(form=SCAFFNEW, **every_node()), torch_app(sgd(), budgets), 15)
    numpy_app = make_client_app(admm_client_fn(local_steps=STEPS, learning_rate=LR))
    scaffold = run(SCAFFOLD(server_learning_rate=1.0, **every_node()), numpy_app, 15)
    np.testing.assert_allclose(held, scaffold, rtol=0, atol=1e-10)
    assert set(budgets) == {STEPS * LR}


def test_the_legacy_builder_refuses_client_held_duals_in_the_linearized_form() -> None:
    config = {"admm-form": "linearized", "admm-duals": "client", "rho": 1.0}
    with pytest.raises(ValueError, match=r"^admm-form: the linearized form with client-held"):
        TorchADMM.from_parameters(
            seed_torch_model(),
            [np.zeros(D)],
            config,
            Context(run_id=1, node_id=1, node_config={}, state=RecordDict(), run_config={}),
        )


def test_a_linearized_reply_is_keyed_by_partition_and_keeps_no_warm_start():
    """Server-held linearized duals are keyed by the node's partition-id, as the prox
    form's are (keyed by node id, a restarted node would lose its y_i, and Flower's
    random node ids would change the summation order between engine runs); the form
    starts at z, so nothing is kept in ``context.state``."""
    grid = InProcessGrid(torch_app(sgd()), N, node_ids=[97, 13, 55, 2, 81, 40, 66, 7, 29, 100])
    strategy = FedADMM(min_train_nodes=N, min_available_nodes=N, fraction_evaluate=0.0)
    zeros = ArrayRecord({"coef": Array(np.zeros(D))})
    run_strategy(strategy, grid, zeros, 2)
    assert sorted(strategy.admm.records) == sorted(f"partition-id:{i}" for i in range(N))
    assert all(not context.state.array_records for context in grid.contexts.values())
