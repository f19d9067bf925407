"""FedADMM's linearized form (Message API): SCAFFOLD option II exactly, the pooled optimum,
its wire (z and y_i down, w_i and the step budget up), refused settings and replies."""

from __future__ import annotations

import numpy as np
import pytest
from flower_run import admm_client_fn, run_seed, seed_model
from flwr.app import ArrayRecord, ConfigRecord, Context, Message
from flwr.clientapp import ClientApp
from flwr.serverapp.strategy import FedProx
from message_apps import ZRecorder, local_data, plain_app
from message_duals import FaultyGrid
from message_replies import FakeGrid, named, reply
from seed_task import first_round_below, gaps, optimum

import flwr_admm.server
from flwr_admm import Uplink
from flwr_admm.clientapp import ADMMTrainStep, make_client_app
from flwr_admm.clientapp.step import step_budget
from flwr_admm.core import L2
from flwr_admm.core.linearized import LINEARIZED_CONVEX, SCAFFNEW, STOCK_MU, Linearized
from flwr_admm.node.records import load_states
from flwr_admm.rounds import fedadmm as rounds_fedadmm
from flwr_admm.serverapp import SCAFFOLD, FedADMM, FedADMMClientDuals
from flwr_admm.serverapp.testing import InProcessGrid, flower_task_identity, run_strategy
from flwr_admm.uplink import StochasticQuantizer

N = 10
STEPS, LR = 20, 1.0  # the seed task's local settings (flwr_admm.data.registry)


def _run(strategy, rounds, client_app=None, num_nodes=N):
    app = client_app or make_client_app(admm_client_fn(local_steps=STEPS, learning_rate=LR))
    grid = InProcessGrid(app, num_nodes)
    recorder = ZRecorder()
    zeros = ArrayRecord([np.zeros(20)])
    run_strategy(strategy, grid, zeros, rounds, evaluate_fn=recorder)
    return recorder.matrix[1:], grid  # start() records round 0 too


def _every_node(**options):
    return {"min_train_nodes": N, "min_available_nodes": N, "fraction_evaluate": 0.0, **options}


def test_with_every_client_replying_it_is_scaffold_option_ii_over_15_rounds():
    linear, _ = _run(FedADMM(form=SCAFFNEW, **_every_node()), 15)  # beta 0, gamma 1
    scaffold, _ = _run(SCAFFOLD(server_learning_rate=1.0, **_every_node()), 15)
    assert np.linalg.norm(scaffold[-1] - scaffold[0]) > 0.1  # the models really move
    np.testing.assert_allclose(linear, scaffold, rtol=0, atol=1e-12)


@pytest.mark.parametrize(
    ("form", "rounds"), [(SCAFFNEW, 40), (LINEARIZED_CONVEX, 40), ("linearized", 300)]
)
def test_it_converges_to_the_pooled_optimum_of_seed_logreg(form, rounds):
    strategy = FedADMM(form=form, **_every_node())
    z, _ = _run(strategy, rounds)
    gap = gaps(z)
    assert first_round_below(gap, 1e-6) is not None and gap[-1] < 1e-10
    np.testing.assert_allclose(z[-1], optimum()[0], atol=1e-6)
    # rho_i = 1 / (K lr) for every client; sum_i n_i y_i stays 0
    assert {r.scale for r in strategy.admm.records.values()} == {1.0 / (STEPS * LR)}
    terms = [r.num_examples * r.y[0] for r in strategy.admm.records.values()]
    scale = sum(np.abs(t).max() for t in terms)  # rounding grows with the terms and rounds
    np.testing.assert_allclose(sum(terms), 0.0, atol=1e-13 * scale)


@pytest.mark.parametrize(("form", "rounds"), [(SCAFFNEW, 150), ("linearized", 300)])
def test_it_converges_with_3_of_10_clients_a_round(form, rounds):
    strategy = FedADMM(form=form, fraction_train=0.3, min_available_nodes=N)
    z, _ = _run(strategy, rounds)
    assert all(h["num_replies"] == 3 for h in strategy.history)
    assert gaps(z)[-1] < 1e-6


def test_the_wire_z_and_y_i_down_w_i_and_the_step_budget_up():
    strategy = FedADMM(form="linearized", **_every_node())
    _, grid = _run(strategy, 2)
    train = [m for m in grid.sent if m.metadata.message_type == "train"]
    first, last = train[0].content, train[-1].content
    assert sorted(last.array_records) == ["admm-dual", "arrays"]
    config = last["config"]
    assert config["admm-form"] == "linearized" and config["proximal-mu"] == STOCK_MU == 0.1
    assert "rho" not in config and config["server-round"] == 2
    np.testing.assert_array_equal(first["admm-dual"]["0"].numpy(), np.zeros(20))  # new: y_i = 0
    key = f"partition-id:{N - 1}" if f"partition-id:{N - 1}" in strategy.admm.records else None
    held = strategy.admm.records[key or next(iter(strategy.admm.records))]
    assert np.linalg.norm(held.y[0]) > 0
    assert strategy.history[-1]["num_rejected"] == 0
    assert strategy.configuration()["form"] == "linearized"
    assert "form" not in FedADMM(form="prox").configuration()  # the prox form's: unchanged
    assert FedADMM().configuration()["form"] == "linearized"  # the default form


# --------------------------------------------------- a user's handler with ADMMTrainStep
user_app = ClientApp()


@user_app.train()
def user_train(msg: Message, context: Context) -> Message:
    """The linearized loop written out: K steps on grad f_i + y_i from z.

    The same handler serves client-held duals: `ADMMTrainStep` gives y_i = u_i / b_i
    from the node's kept state there.
    """
    return linearized_loop(msg, context, STEPS, LR)


def linearized_loop(msg: Message, context: Context, steps: int, lr: float) -> Message:
    X, y = local_data(context)
    step = ADMMTrainStep.from_message(msg, context)
    (w,) = step.start().values()
    (y_i,) = step.correction.values()
    model = seed_model()
    for _ in range(steps):
        _, (grad,) = model.loss_and_grad([w], X, y)
        w = w - lr * (grad + y_i)
    return step.reply([w], len(y), {}, context, step_budget=step_budget(steps, lr))


def test_a_user_handler_with_the_helpers_runs_the_same_iteration():
    ready, _ = _run(FedADMM(form="linearized", **_every_node()), 5)
    own, _ = _run(FedADMM(form="linearized", **_every_node()), 5, client_app=user_app)
    np.testing.assert_allclose(own, ready, rtol=0, atol=1e-12)


def test_the_default_with_stock_fedprox_handlers_is_flowers_fedprox():
    """The one-line swap: ``FedProx(...)`` -> ``FedADMM(...)`` over a stock handler.

    The replies carry no step budget: each is folded with rho_i = mu = `STOCK_MU` and its
    dual held at 0, so with every node replying z' is FedAvg of FedProx's steps around z:
    Flower's own FedProx(proximal_mu=0.1), round for round.
    """
    strategy = FedADMM(**_every_node())
    assert strategy.algorithm.form == "linearized"
    ours, _ = _run(strategy, 15, client_app=plain_app)  # FedProx's steps, no budget
    flower, _ = _run(FedProx(proximal_mu=STOCK_MU, **_every_node()), 15, client_app=plain_app)
    assert np.linalg.norm(flower[-1] - flower[0]) > 0.1  # the models really move
    np.testing.assert_allclose(ours, flower, rtol=1e-12, atol=1e-14)
    assert all(h["num_stock_replies"] == N and h["num_rejected"] == 0 for h in strategy.history)
    assert all(not np.any(r.y[0]) for r in strategy.admm.records.values())  # duals held at 0
    assert {r.scale for r in strategy.admm.records.values()} == {STOCK_MU}


def test_stock_and_budget_replies_enter_one_z_step_with_their_own_rho_i(monkeypatch):
    """A mixed round: z' = sum_i n_i (rho_i w_i + y_i) / sum_i n_i rho_i, rho_i = 1 / b_i
    for a reply with a step budget and mu for a stock one (hand-computed); the warning
    names what the stock reply lacked."""
    logged = []
    monkeypatch.setattr(
        rounds_fedadmm, "log", lambda level, text, *args: logged.append(text % args)
    )
    strategy = FedADMM(min_train_nodes=2, min_available_nodes=2, fraction_evaluate=0.0)
    grid = FakeGrid([1, 2])
    with flower_task_identity():
        strategy.configure_train(1, named({"w": np.zeros(2)}), ConfigRecord(), grid)
    w1, w2 = np.array([1.0, 2.0]), np.array([-3.0, 4.0])
    replies = [
        reply(1, {"w": w1}, **{"num-examples": 4, "admm-step-budget": 5.0}),  # rho_1 = 0.2
        reply(2, {"w": w2}, **{"num-examples": 6}),  # stock: rho_2 = mu = 0.1
    ]
    arrays, metrics = strategy.aggregate_train(1, replies)
    expected = (4 * 0.2 * w1 + 6 * STOCK_MU * w2) / (4 * 0.2 + 6 * STOCK_MU)  # y_i = 0 at k = 0
    np.testing.assert_allclose(arrays["w"].numpy(), expected, rtol=1e-15)
    assert metrics["num_stock_replies"] == 1 and metrics["num_rejected"] == 0
    duals = {key: r.y[0] for key, r in strategy.admm.records.items()}
    assert sum(bool(np.any(y)) for y in duals.values()) == 1  # the stock one is held at 0
    (warning,) = [text for text in logged if "stock FedProx handler" in text]
    assert "replied without 'admm-step-budget'" in warning


def test_a_reply_with_a_bad_budget_is_rejected():
    strategy = FedADMM(form="linearized", min_train_nodes=2, min_available_nodes=2)
    grid = FakeGrid([1, 2])
    with flower_task_identity():
        strategy.configure_train(1, named({"w": np.zeros(2)}), ConfigRecord(), grid)
    replies = [
        reply(1, {"w": np.ones(2)}, **{"num-examples": 4, "admm-step-budget": 0.5}),
        reply(2, {"w": np.ones(2)}, **{"num-examples": 4, "admm-step-budget": 0.0}),
    ]
    _, metrics = strategy.aggregate_train(1, replies)
    assert metrics["num_rejected"] == 1 and metrics["num_replies"] == 1


# ------------------------------------------------------------------- refused settings
@pytest.mark.parametrize(
    ("keyword", "value"),
    [
        ("rho", 1.0),
        ("proximal_mu", 0.5),
        ("rho_schedule", "constant"),
        ("relaxation", 1.6),
        ("dual_step", 0.5),
        ("regularizer", L2(0.1)),
        ("uplink", Uplink(StochasticQuantizer())),
    ],
)
def test_what_the_form_fixes_is_refused_naming_the_field(keyword, value):
    with pytest.raises(ValueError, match=rf"^{keyword}: .*form='linearized'"):
        FedADMM(form="linearized", **{keyword: value})


@pytest.mark.parametrize(
    ("keywords", "form"),
    [
        ({}, "linearized"),
        ({"uplink": Uplink()}, "linearized"),  # no compressor, no local DP
        ({"z_average": "replies"}, "linearized"),
        ({"rho": 1.0}, "prox"),
        ({"proximal_mu": 0.1}, "prox"),  # FedProx(proximal_mu=mu) -> FedADMM(proximal_mu=mu)
        ({"rho_schedule": "constant"}, "prox"),
        ({"relaxation": 1.6}, "prox"),
        ({"dual_step": 0.5}, "prox"),
        ({"regularizer": L2(0.1)}, "prox"),
        ({"uplink": Uplink(StochasticQuantizer())}, "prox"),
    ],
)
def test_the_default_form_is_linearized_unless_a_prox_setting_is_given(keywords, form):
    assert FedADMM(**keywords).algorithm.form == form
    assert FedADMM(form=None, **keywords).algorithm.form == form
    assert flwr_admm.server.FedADMM(form=None, **keywords).algorithm.form == form
    assert flwr_admm.server.FedADMM(**keywords).algorithm.form == "prox"  # legacy default


@pytest.mark.parametrize(
    ("keywords", "form"),
    [
        ({}, "linearized"),
        ({"rho": 0.1}, "prox"),
        ({"proximal_mu": 0.1}, "prox"),
        ({"dual_step": 0.5}, "prox"),
        ({"regularizer": L2(0.1)}, "prox"),
        ({"uplink": Uplink(StochasticQuantizer())}, "prox"),
    ],
)
def test_client_held_duals_choose_their_form_by_the_same_rule(keywords, form):
    assert FedADMMClientDuals(**keywords).algorithm.form == form
    legacy = flwr_admm.server.FedADMMClientDuals
    assert legacy(form=None, **keywords).algorithm.form == form
    assert legacy(**keywords).algorithm.form == "prox"  # the legacy default


@pytest.mark.parametrize("form", ["linear", "Linearized", "", 1])
def test_an_unknown_form_is_refused_naming_the_field_and_the_allowed_values(form):
    with pytest.raises(ValueError, match=r"^form: must be one of \['prox', 'linearized'\]"):
        FedADMM(form=form)


def test_the_handler_refuses_a_linearized_reply_without_budget_and_other_starts():
    data_app = ClientApp()

    @data_app.train()
    def no_budget(msg: Message, context: Context) -> Message:
        step = ADMMTrainStep.from_message(msg, context)
        with pytest.raises(ValueError, match=r"^init: the linearized form starts at z"):
            step.start(init="previous")
        return step.reply(list(step.start().values()), 5, {}, context)  # no step_budget

    strategy = FedADMM(form="linearized", min_train_nodes=2, min_available_nodes=2)
    grid = InProcessGrid(data_app, 2)
    with flower_task_identity():
        messages = strategy.configure_train(1, ArrayRecord([np.zeros(20)]), ConfigRecord(), grid)
        answers = list(grid.send_and_receive(messages))
    assert len(answers) == 2
    assert all(
        a.has_error() and "step_budget: the linearized form" in a.error.reason for a in answers
    )


@pytest.mark.parametrize(
    ("args", "field"),
    [((0, 0.1), "steps"), ((5, 0.0), "learning_rate"), ((5, 0.1, 1.0), "momentum")],
)
def test_step_budget_checks_its_arguments(args, field):
    with pytest.raises(ValueError, match=f"^{field}: "):
        step_budget(*args)
    assert step_budget(10, 0.1, 0.9) == pytest.approx(10.0)  # K lr / (1 - momentum)


# ------------------------------------------------------------------------ legacy API
def test_the_legacy_strategy_runs_the_same_iteration_and_is_scaffold_too():
    legacy_kwargs = {"min_fit_clients": N, "min_available_clients": N, "fraction_evaluate": 0.0}
    client = {"local_steps": STEPS, "learning_rate": LR}
    _, linear, _ = run_seed(flwr_admm.server.FedADMM, 15, client_kwargs=client, form=SCAFFNEW)
    _, scaffold, _ = run_seed(flwr_admm.server.SCAFFOLD, 15, client_kwargs=client, **legacy_kwargs)
    message, _ = _run(FedADMM(form=SCAFFNEW, **_every_node()), 15)
    np.testing.assert_array_equal(linear.matrix[-15:], message)  # the same replies, bit for bit
    np.testing.assert_allclose(linear.matrix[-15:], scaffold.matrix[-15:], rtol=0, atol=1e-12)
    with pytest.raises(ValueError, match=r"^rho: .*form='linearized'"):
        flwr_admm.server.FedADMM(form="linearized", rho=1.0)


# ------------------------------------------------------------- the momentum start
def _sent_starts(grid):
    """Round -> the start its train messages carried (the same for every node)."""
    return {
        int(m.metadata.group_id): m.content["arrays"]["0"].numpy()
        for m in grid.sent
        if m.metadata.message_type == "train"
    }


def test_the_momentum_start_reaches_a_float32_model_and_keeps_the_pooled_optimum():
    strategy = FedADMM(form=Linearized(momentum=0.7, dual_step=1.0, steady=None), **_every_node())
    app = make_client_app(admm_client_fn(local_steps=STEPS, learning_rate=LR))
    grid = InProcessGrid(app, N)
    recorder = ZRecorder()
    zeros = ArrayRecord([np.zeros(20, dtype=np.float32)])  # the broadcast comes back rounded
    run_strategy(strategy, grid, zeros, 30, evaluate_fn=recorder)
    z = recorder.matrix  # z^0 .. z^30
    sent = _sent_starts(grid)
    moved = 0
    for k in range(3, 31):  # round k starts at x = z^(k-1) + 0.7 (z^(k-1) - z^(k-2)), or z^(k-1)
        x = z[k - 1] + 0.7 * (z[k - 1] - z[k - 2])
        at_z = np.allclose(sent[k], z[k - 1], rtol=0, atol=1e-6)
        assert at_z or np.allclose(sent[k], x, rtol=0, atol=1e-5)
        moved += not at_z
    assert moved >= 10  # the momentum reaches the clients (it was dropped every round once)
    assert 0 < strategy.admm.momentum.restarts < 28
    assert gaps(z[1:].astype(np.float64))[-1] < 1e-6  # float32 z: near the pooled optimum


def _moved_starts(grid, z):
    """Rounds whose train messages carried a start other than the previous round's z."""
    sent = _sent_starts(grid)
    return [k for k in sorted(sent) if k > 1 and not np.array_equal(sent[k], z[k - 2])]


def test_the_default_gate_opens_with_every_node_and_never_with_3_of_10():
    """``FedADMM()``'s momentum start (beta 0.9, steady gate 0.9) on seed-logreg: with
    every node replying the steps keep their direction and the gate opens (13 rounds to
    1e-6 either way; the gain is on synthetic and digits, docs/tuning.md); with 3 of 10
    no round counts, so every start is z, as without a momentum start."""
    full = FedADMM(**_every_node())
    z, grid = _run(full, 20)
    moved = _moved_starts(grid, z)
    assert len(moved) >= 5 and min(moved) >= 4  # two steady rounds first (rounds 2, 3)
    used = [k for k, h in enumerate(full.history, 1) if h["start_momentum"] == 0.9]
    assert used == moved  # the round metric says which starts moved
    assert first_round_below(gaps(z), 1e-6) is not None
    sampled = FedADMM(fraction_train=0.3, min_available_nodes=N)
    z, grid = _run(sampled, 40)
    plain, _ = _run(FedADMM(form=Linearized(momentum=0.0), fraction_train=0.3), 40)
    assert _moved_starts(grid, z) == [] and sampled.admm.momentum.streak == 0
    np.testing.assert_array_equal(z, plain)


def test_the_summary_names_the_momentum_start_and_its_gate(caplog):
    with caplog.at_level("INFO"):
        FedADMM().summary()
    assert "momentum start: 0.9 (gate 0.9)" in caplog.text
    caplog.clear()
    with caplog.at_level("INFO"):
        FedADMM(form=SCAFFNEW).summary()  # no momentum start: no line
    assert "form: linearized" in caplog.text and "momentum start" not in caplog.text


def test_both_apis_run_the_default_linearized_form_bit_for_bit():
    client = {"local_steps": STEPS, "learning_rate": LR}
    _, legacy, _ = run_seed(flwr_admm.server.FedADMM, 12, client_kwargs=client, form="linearized")
    message, _ = _run(FedADMM(form="linearized", **_every_node()), 12)
    np.testing.assert_array_equal(legacy.matrix[-12:], message)


# ------------------------------------------------------------ client-held duals
@pytest.mark.parametrize("app", ["numpy client", "user handler"])
def test_client_held_duals_run_the_linearized_form_at_two_copies(app):
    client_app = user_app if app == "user handler" else None  # the same handler as above
    held, grid = _run(FedADMMClientDuals(form=SCAFFNEW, **_every_node()), 15, client_app)
    scaffold, _ = _run(SCAFFOLD(server_learning_rate=1.0, **_every_node()), 15)
    np.testing.assert_allclose(held, scaffold, rtol=0, atol=1e-12)  # SCAFFOLD option II
    train = [m for m in grid.sent if m.metadata.message_type == "train"]
    assert sorted(train[-1].content.array_records) == ["arrays"]  # z only: 2 copies a round
    assert train[-1].content["config"]["admm-form"] == "linearized"


def test_client_held_duals_default_linearized_is_the_server_held_one():
    """The default `Linearized()` adapts gamma under client-held duals too: each node
    reports the terms of its dual step's alignment c_k (``admm-align-*``, the step it
    takes at the start of its next round), so with every node replying the server sets
    the gamma server-held duals set, a round later on the wire. Before, gamma stayed at
    the rule's floor 0.2 there (the server never sees y_i): 4x the rounds on seed-logreg."""
    strategy = FedADMMClientDuals(form="linearized", **_every_node())
    held, _ = _run(strategy, 40)
    # without the momentum start, which FedADMM's `Linearized()` has and client-held
    # duals cannot send (the nodes start at z)
    server_held = FedADMM(form=Linearized(momentum=0.0), **_every_node())
    server, _ = _run(server_held, 40)
    np.testing.assert_allclose(held, server, rtol=1e-9, atol=1e-12)
    sent = [h["dual_step"] for h in strategy.history]  # the gamma each round's config sent
    used = [h["dual_step"] for h in server_held.history]  # the gamma each dual step used
    np.testing.assert_allclose(sent[1:], used[:-1], rtol=1e-9)  # the step of round k is
    assert sent[0] == 0.2 and max(sent) == 1.0  # taken on the nodes in round k + 1
    floor, _ = _run(FedADMMClientDuals(form=Linearized(dual_step=0.2), **_every_node()), 40)
    assert gaps(held)[-1] < gaps(floor)[-1] * 1e-3


def test_client_held_duals_refuse_what_the_form_cannot_do_and_stock_replies():
    with pytest.raises(ValueError, match=r"^momentum: the momentum start needs server-held"):
        FedADMMClientDuals(form=Linearized(momentum=0.7))
    with pytest.raises(ValueError, match=r"^dual_step: not used with form='linearized'"):
        FedADMMClientDuals(form="linearized", dual_step=0.5)
    # the prox-form settings were taken silently before (rho set the residuals' scale,
    # a regularizer's prox ran with it): refused, on both APIs, as FedADMM does
    for strategy_class in (FedADMMClientDuals, flwr_admm.server.FedADMMClientDuals):
        fixed = {
            "rho": 0.5,
            "proximal_mu": 0.1,
            "regularizer": L2(0.1),
            "uplink": Uplink(StochasticQuantizer()),
        }
        for name, value in fixed.items():
            with pytest.raises(ValueError, match=rf"^{name}: not used with form='linearized'"):
                strategy_class(form="linearized", **{name: value})
        assert strategy_class(form="linearized").state.rho == 1.0  # rho_i = 1 / b_i on nodes
    strategy = FedADMMClientDuals(form="linearized", **_every_node())
    _run(strategy, 2, client_app=plain_app)  # replies without admm-step-budget
    assert all(h.get("num_rejected") == N for h in strategy.history)
    assert strategy.configuration()["form"] == "linearized"


uneven_app = ClientApp()


@uneven_app.train()
def uneven_train(msg: Message, context: Context) -> Message:
    """The linearized loop with K_i = 10 on even partitions, 30 on odd ones (lr 0.5)."""
    steps = 10 if int(context.node_config["partition-id"]) % 2 == 0 else 30
    return linearized_loop(msg, context, steps, 0.5)


drifting_app = ClientApp()


@drifting_app.train()
def drifting_train(msg: Message, context: Context) -> Message:
    """K_i = 5, 15 or 25 steps of lr 0.5, moving with the round: b_i changes every round."""
    server_round = int(msg.content["config"]["server-round"])
    steps = 5 + 10 * ((server_round + int(context.node_config["partition-id"])) % 3)
    return linearized_loop(msg, context, steps, 0.5)


@pytest.mark.parametrize("form", [SCAFFNEW, "linearized"])
@pytest.mark.parametrize("app", [uneven_app, drifting_app], ids=["unequal", "changing"])
def test_unequal_step_budgets_client_held_are_the_server_held_iteration(app, form):
    """Client-held duals weigh c_i = w_i + u_i by omega_i = n_i / b_i (rho_i = 1 / b_i),
    with u_i = b_i y_i rescaled when b_i changes: with every node replying they are
    server-held FedADMM's linearized form round for round, gamma 1 or adaptive. S / N
    weighed the nodes by n_i before: with K_i = 10 and 30 z settled at a 2.0e-3 gap,
    looking converged."""
    server_form = Linearized(momentum=0.0) if form == "linearized" else form  # no start
    held, _ = _run(FedADMM(form=server_form, **_every_node()), 60, app)
    assert gaps(held)[-1] < (1e-12 if form == SCAFFNEW else 1e-6)
    strategy = FedADMMClientDuals(form=form, **_every_node())
    z, _ = _run(strategy, 60, app)
    np.testing.assert_allclose(z, held, rtol=0, atol=1e-10)
    assert [h["num_rejected"] for h in strategy.history] == [0] * 60


def test_a_node_that_lost_its_state_under_changing_budgets_resyncs_and_s_stays_exact():
    """The weights omega_i = n_i / b_i through a resync and the rebuild sweep: node 6
    loses its state before round 4 while every K_i moves each round. S ends as the sum
    of the nodes' kept shares omega_i c_i, N as their weights, z at the optimum."""
    strategy = FedADMMClientDuals(form=SCAFFNEW, **_every_node())
    grid, recorder, stale = FaultyGrid(drifting_app, N, {6: {4: "wipe"}}), ZRecorder(), []

    def record(server_round, arrays):
        stale.append(strategy.state.sweep.stale_examples)
        return recorder(server_round, arrays)

    run_strategy(strategy, grid, ArrayRecord([np.zeros(20)]), 60, evaluate_fn=record)
    assert [h["num_resynced"] for h in strategy.history[2:5]] == [0, 1, 0]
    assert strategy.history[3]["rebuilding"] == 1 and strategy.history[-1]["rebuilding"] == 0
    # while the sweep is on, the lost share counts with its omega_i: n_i / b_i of round 3
    # (partition 6: K = 5 + 10 ((3 + 6) mod 3) = 5 steps of lr 0.5)
    (n_6,) = {
        len(local_data(c)[1]) for c in grid.contexts.values() if c.node_config["partition-id"] == 6
    }
    assert stale[4] == n_6 / 2.5 and stale[3] == stale[5] == 0.0  # stale[k]: after round k
    assert gaps(recorder.matrix[1:])[-1] < 1e-10
    shares, weights = np.zeros(20), 0.0
    for context in grid.contexts.values():
        kept = load_states(context.state, [(20,)]).pending
        assert kept is not None and kept.budget is not None
        shares, weights = shares + kept.share[0], weights + kept.weight
    total = strategy.state.contribution_sum
    assert total is not None
    np.testing.assert_allclose(total[0], shares, rtol=0, atol=1e-9 * np.abs(shares).max())
    assert strategy.state.total_examples == pytest.approx(weights, rel=1e-12)


def test_the_legacy_client_held_strategy_runs_the_same_linearized_iteration():
    client = {"local_steps": STEPS, "learning_rate": LR}
    legacy_kwargs = {"min_fit_clients": N, "min_available_clients": N, "fraction_evaluate": 0.0}
    _, legacy, _ = run_seed(
        flwr_admm.server.FedADMMClientDuals,
        15,
        client_kwargs=client,
        form=SCAFFNEW,
        **legacy_kwargs,
    )
    message, _ = _run(FedADMMClientDuals(form=SCAFFNEW, **_every_node()), 15)
    np.testing.assert_allclose(legacy.matrix[-15:], message, rtol=0, atol=1e-12)
    with pytest.raises(ValueError, match=r"^momentum: the momentum start needs server-held"):
        flwr_admm.server.FedADMMClientDualsSecAgg(form=Linearized(momentum=0.5))
    with pytest.raises(ValueError, match=r"^momentum: the momentum start needs server-held"):
        flwr_admm.server.FedADMMClientDuals(form=Linearized(momentum=0.5))
