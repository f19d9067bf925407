"""FedADMMClientDuals: client-held duals, the server keeps only z, S = sum n_i c_i, N.

Measured (in-process driver, seed 000's task, rho 0.1, 20 local steps, lr 1.0):
- full participation: z per round equals server-held FedADMM's to 3.6e-15 relative
  over 30 rounds; both reach a 1e-6 gap at round 17;
- 3 of 10 clients a round (sampling seeds 0 / 1 / 2): gap <= 1e-6 at rounds 57 / 56 /
  58, server-held FedADMM on the same sampling seeds 49 / 46 / 53 (the delayed dual
  costs 10-20 % more rounds).
"""

from __future__ import annotations

import json
import logging
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from flower_run import (
    NUM_CLIENTS,
    Recorder,
    admm_client_fn,
    relative_errors,
    run_seed,
    zeros_parameters,
)
from flwr.common import (
    Code,
    Context,
    FitRes,
    Parameters,
    RecordDict,
    Status,
    ndarrays_to_parameters,
    parameters_to_ndarrays,
)
from flwr.server.client_manager import SimpleClientManager
from flwr.server.client_proxy import ClientProxy
from seed_task import first_round_below, gaps

from flwr_admm import Checkpointing, ClientPolicy, Convergence, Uplink
from flwr_admm.client import ADMMClient
from flwr_admm.core import L1
from flwr_admm.models import LogisticRegression
from flwr_admm.node.records import load_states
from flwr_admm.protocol import (
    EXAMPLES_CHANGE,
    MODE_KEY,
    PREVIOUS_ROUND,
    U_SQ_NORM,
    W_SQ_NORM,
)
from flwr_admm.rounds.checkpoint import CheckpointError
from flwr_admm.rounds.identity import ABSENT_GRACE
from flwr_admm.server import FedADMMClientDuals
from flwr_admm.server.fedadmm import textbook
from flwr_admm.testing import make_proxies, run_rounds
from flwr_admm.uplink import LocalDP, StochasticQuantizer, TopK

# Both sides start the local solve at the client's last w_i, so that client-held duals
# give server-held FedADMM's iterates (FedADMMClientDuals' default, "auto", starts at z)
CLIENT = {"local_steps": 20, "learning_rate": 1.0, "local_init": "previous"}
PARTIAL = {"fraction_fit": 0.3, "min_fit_clients": 3, "min_available_clients": 10}


def test_full_participation_is_server_held_fedadmm() -> None:
    _, held, held_run = run_seed(textbook, 30, client_kwargs=CLIENT, rho=0.1)
    strategy, client, client_run = run_seed(FedADMMClientDuals, 30, client_kwargs=CLIENT, rho=0.1)
    errors = relative_errors(client.matrix, held.matrix)
    assert errors.max() <= 1e-12, errors  # measured: 3.6e-15
    assert first_round_below(gaps(client.matrix), 1e-6) == 17
    # The dual residual is the same; the primal residual arrives one round late.
    assert "previous_primal_residual" not in client_run.fit_metrics[0]
    for k in range(1, 30):
        ours, theirs = client_run.fit_metrics[k], held_run.fit_metrics[k]
        assert math.isclose(ours["dual_residual"], theirs["dual_residual"], rel_tol=1e-9)
        previous = held_run.fit_metrics[k - 1]["primal_residual"]
        assert math.isclose(ours["previous_primal_residual"], previous, rel_tol=1e-9)
        assert math.isclose(ours["eps_primal"], theirs["eps_primal"], rel_tol=1e-9)
    assert int(client_run.fit_metrics[-1]["converged"]) == 1
    assert len(strategy.history) == 30 and strategy.history[-1]["num_replies"] == NUM_CLIENTS


@pytest.mark.parametrize("gamma", [0.2, 0.5])
def test_damped_dual_step_is_server_held_fedadmm_with_the_same_step(gamma: float) -> None:
    """u_i += gamma (w_i - z) on the clients gives server-held FedADMM's dual_step=gamma."""
    _, held, _ = run_seed(textbook, 30, client_kwargs=CLIENT, rho=0.1, dual_step=gamma)
    _, client, _ = run_seed(FedADMMClientDuals, 30, client_kwargs=CLIENT, rho=0.1, dual_step=gamma)
    _, undamped, _ = run_seed(FedADMMClientDuals, 30, client_kwargs=CLIENT, rho=0.1)
    assert relative_errors(client.matrix, held.matrix).max() <= 1e-12
    assert relative_errors(client.matrix, undamped.matrix).max() > 1e-3  # gamma is sent


def test_server_regularizer_matches_server_held_fedadmm() -> None:
    _, held, _ = run_seed(textbook, 15, client_kwargs=CLIENT, rho=0.1, regularizer=L1(0.02))
    _, client, _ = run_seed(
        FedADMMClientDuals, 15, client_kwargs=CLIENT, rho=0.1, regularizer=L1(0.02)
    )
    np.testing.assert_array_equal(client.matrix == 0.0, held.matrix == 0.0)
    assert (held.matrix[-1] == 0.0).sum() >= 2  # the prox really zeroes entries
    assert relative_errors(client.matrix, held.matrix).max() <= 1e-12


def test_stop_on_convergence_samples_no_more_clients() -> None:
    strategy, _, result = run_seed(
        FedADMMClientDuals, 40, client_kwargs=CLIENT, rho=0.1, convergence=Convergence(stop=True)
    )
    stopped = len(strategy.history)
    assert stopped == 23 and strategy.converged  # server-held FedADMM also stops after 23
    assert int(strategy.history[-1]["converged"]) == 1
    assert all(m.get("num_replies") is None for m in result.fit_metrics[stopped:])


def test_partial_participation_reaches_the_optimum() -> None:
    strategy, client, _ = run_seed(FedADMMClientDuals, 70, client_kwargs=CLIENT, rho=0.1, **PARTIAL)
    _, held, _ = run_seed(textbook, 70, client_kwargs=CLIENT, rho=0.1, **PARTIAL)
    assert [h["num_replies"] for h in strategy.history] == [3] * 70
    reach_client = first_round_below(gaps(client.matrix), 1e-6)
    reach_held = first_round_below(gaps(held.matrix), 1e-6)
    assert reach_client is not None and reach_client <= 62  # measured: 57
    assert reach_held is not None and reach_held <= 52  # measured: 49
    assert gaps(client.matrix)[-1] <= 2e-7  # measured: 6.7e-8 at round 70
    assert len(strategy.state.clients) == NUM_CLIENTS


# ------------------------------------------------------------ bad replies, lost state
def _run(num_clients: int, rounds: int, **kwargs: Any) -> tuple[FedADMMClientDuals, list[Any]]:
    strategy = FedADMMClientDuals(
        rho=0.1, initial_parameters=zeros_parameters(), min_available_clients=num_clients, **kwargs
    )
    proxies = make_proxies(admm_client_fn(**CLIENT), num_clients)
    run_rounds(strategy, proxies, rounds)
    return strategy, proxies


def _reply(proxy: ClientProxy, arrays: list[np.ndarray], **metrics: Any) -> tuple[Any, FitRes]:
    return proxy, FitRes(Status(Code.OK, ""), ndarrays_to_parameters(arrays), 500, metrics)


def _protocol(partition: int, previous_round: int) -> dict[str, Any]:
    return {
        "partition-id": partition,
        PREVIOUS_ROUND: previous_round,
        EXAMPLES_CHANGE: 0,
        W_SQ_NORM: 1.0,
        U_SQ_NORM: 1.0,
        "admm-delayed-sq-residual": 0.0,
    }


def test_bad_replies_are_rejected_without_touching_s() -> None:
    strategy, proxies = _run(3, 2)
    assert strategy.state.contribution_sum is not None
    before = [s.copy() for s in strategy.state.contribution_sum]
    entries = {k: (e.num_examples, e.last_round) for k, e in strategy.state.clients.items()}
    good = np.full(20, 0.25)
    nan = np.full(20, 0.25)
    nan[3] = np.nan
    results = [
        _reply(proxies[0], [good], **_protocol(0, 2)),
        _reply(proxies[1], [nan], **_protocol(1, 2)),
        _reply(proxies[2], [np.zeros(21)], **_protocol(2, 2)),
    ]
    aggregated, metrics = strategy.aggregate_fit(3, results, [])
    assert aggregated is not None
    assert metrics["num_rejected"] == 2 and metrics["num_replies"] == 1
    np.testing.assert_array_equal(strategy.state.contribution_sum[0], before[0] + good)
    assert strategy.state.clients["partition-id:1"].last_round == entries["partition-id:1"][1]
    assert strategy.state.clients["partition-id:0"].last_round == 3
    # A round of only bad replies (or a FedProx client without the protocol metrics)
    # leaves S, N, z as they were.
    z, n = [t.copy() for t in strategy.z or []], strategy.state.total_examples
    after = [s.copy() for s in strategy.state.contribution_sum]
    results = [
        _reply(proxies[1], [nan], **_protocol(1, 2)),
        _reply(proxies[2], [good], **{"partition-id": 2, "loss": 0.1}),
    ]
    aggregated, metrics = strategy.aggregate_fit(4, results, [])
    assert aggregated is None and metrics["num_rejected"] == 2
    np.testing.assert_array_equal(strategy.state.contribution_sum[0], after[0])
    np.testing.assert_array_equal((strategy.z or [])[0], z[0])
    assert strategy.state.total_examples == n


def _shares(proxies: list[Any], d: int) -> np.ndarray:
    """Sum of the clients' shares n_i c_i - e_i after their last (accepted) reply."""
    total = np.zeros(d)
    for proxy in proxies:
        kept = load_states(proxy.context.state, [(d,)])
        state = kept.pending or kept.committed
        if state is not None:
            total += state.share[0]
    return total


def test_lost_client_state_resyncs_and_the_sweep_rebuilds_s(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A client whose state is gone rejoins at once; one more round rebuilds S exactly.

    (Before the acknowledgement its replies were rejected as out of sync for the rest
    of the run, and its old contribution stayed in S.)
    """
    strategy, proxies = _run(4, 3)
    proxies[1].context.state = RecordDict()  # a SuperNode restarted with an empty state
    with caplog.at_level(logging.INFO, logger="flwr"):
        instructions, metrics = _one_round(strategy, proxies, 4)
    assert [ins.config["admm-ack-round"] for _, ins in instructions] == [3] * 4
    assert metrics["num_resynced"] == 1 and metrics["num_rejected"] == 0
    assert metrics["num_replies"] == 4 and metrics["rebuilding"] == 1
    assert any("partition-id:1 resynchronized" in r.getMessage() for r in caplog.records)
    assert strategy.state.contribution_sum is not None
    stale = strategy.state.contribution_sum[0] - _shares(proxies, 20)
    assert np.abs(stale).max() > 1.0  # S still holds the old share
    assert strategy.state.total_examples == 4 * 500 and strategy.state.sweep.stale_examples == 500
    # Round 5: every key but the resynced one sends its full share too; S := S_new.
    instructions, metrics = _one_round(strategy, proxies, 5)
    assert [ins.config["admm-rebuild"] for _, ins in instructions] == [1, 0, 1, 1]
    assert metrics["rebuilding"] == 0 and metrics["num_resynced"] == 0
    np.testing.assert_allclose(strategy.state.contribution_sum[0], _shares(proxies, 20), atol=1e-10)
    assert strategy.state.sweep.stale_examples == 0 and not strategy.state.sweep.active
    instructions, metrics = _one_round(strategy, proxies, 6)  # back to plain replies
    assert [ins.config["admm-rebuild"] for _, ins in instructions] == [0] * 4
    assert metrics["num_replies"] == 4 and metrics["num_rejected"] == 0


def test_a_duplicated_reply_is_rejected_and_its_client_comes_back() -> None:
    strategy, proxies = _run(3, 2)
    manager = SimpleClientManager()
    for proxy in proxies:
        manager.register(proxy)
    instructions = strategy.configure_fit(3, _current(strategy), manager)
    results = [(proxy, proxy.fit(ins, None, 3)) for proxy, ins in instructions]
    _, metrics = strategy.aggregate_fit(3, [*results, results[0]], [])  # delivered twice
    assert metrics["num_rejected"] == 2 and metrics["num_replies"] == 2
    instructions, metrics = _one_round(strategy, proxies, 4)
    assert [ins.config["admm-ack-round"] for _, ins in instructions] == [2, 3, 3]
    assert metrics["num_rejected"] == 0 and metrics["num_replies"] == 3
    assert strategy.state.contribution_sum is not None
    np.testing.assert_allclose(strategy.state.contribution_sum[0], _shares(proxies, 20), atol=1e-10)


def test_supernodes_restarted_under_new_node_ids_rejoin() -> None:
    """New node ids, empty states, the same partitions: while the old nodes are within
    their grace their keys are refused to the new ones; then S is rebuilt in one round."""
    strategy, _ = _run(4, 3)
    fresh = make_proxies(admm_client_fn(**CLIENT), 4, node_ids=[11, 12, 13, 14])
    for server_round in range(4, 4 + ABSENT_GRACE):
        _, metrics = _one_round(strategy, fresh, server_round)
        assert metrics["num_key_conflicts"] == 4
    instructions, metrics = _one_round(strategy, fresh, 4 + ABSENT_GRACE)
    assert [ins.config["admm-ack-round"] for _, ins in instructions] == [0] * 4
    assert metrics["num_replies"] == 4 and metrics["num_rejected"] == 0
    assert metrics["rebuilding"] == 0 and strategy.state.total_examples == 4 * 500
    assert strategy.state.contribution_sum is not None
    np.testing.assert_allclose(strategy.state.contribution_sum[0], _shares(fresh, 20), atol=1e-10)


def test_an_evicted_keys_share_leaves_s() -> None:
    strategy, proxies = _run(4, 3)
    assert strategy.state.contribution_sum is not None
    strategy.round.evict(["partition-id:3"], "test")
    strategy.min_available_clients = 3  # its node is gone too
    assert strategy.state.total_examples == 3 * 500 and strategy.state.sweep.active
    _, metrics = _one_round(strategy, proxies[:3], 4)
    assert metrics["rebuilding"] == 0 and metrics["num_replies"] == 3
    assert sorted(strategy.state.clients) == [f"partition-id:{i}" for i in range(3)]
    np.testing.assert_allclose(
        strategy.state.contribution_sum[0], _shares(proxies[:3], 20), rtol=0, atol=1e-10
    )


def test_max_client_age_evicts_and_the_sweep_takes_the_shares_out_of_s() -> None:
    strategy = FedADMMClientDuals(
        rho=0.1,
        initial_parameters=zeros_parameters(),
        clients=ClientPolicy(max_age=3),
        min_available_clients=5,
    )
    proxies = make_proxies(admm_client_fn(**CLIENT), NUM_CLIENTS)
    for server_round in (1, 2):
        _one_round(strategy, proxies, server_round)
    metrics = [_replies_of(strategy, proxies, 5, r) for r in range(3, 9)]  # 5-9 go quiet
    assert [m["num_evicted"] for m in metrics] == [0, 0, 0, 5, 0, 0]  # at round 6
    assert [m["rebuilding"] for m in metrics] == [0] * 6  # all 5 sent their shares
    assert sorted(strategy.state.clients) == [f"partition-id:{i}" for i in range(5)]
    assert strategy.state.total_examples == 5 * 500 and strategy.state.contribution_sum is not None
    np.testing.assert_allclose(
        strategy.state.contribution_sum[0], _shares(proxies[:5], 20), rtol=0, atol=1e-10
    )


def test_no_convergence_while_s_still_holds_an_evicted_share() -> None:
    """Half the clients a round: converged at round 46; then key 9 is evicted."""
    half = {"fraction_fit": 0.5, "min_fit_clients": 5, "min_available_clients": 10}
    strategy = FedADMMClientDuals(rho=0.1, initial_parameters=zeros_parameters(), **half)
    proxies = make_proxies(admm_client_fn(**CLIENT), NUM_CLIENTS)
    result = run_rounds(strategy, proxies, 50)
    assert int(result.fit_metrics[-1]["converged"]) == 1
    strategy.round.evict(["partition-id:9"], "test")
    strategy.min_available_clients = 9
    flags = [_one_round(strategy, proxies[:9], r)[1] for r in range(51, 71)]
    rebuilding = [m for m in flags if m["rebuilding"]]
    assert rebuilding and all(m["converged"] == 0 for m in rebuilding)
    assert flags[-1]["rebuilding"] == 0 and strategy.state.contribution_sum is not None
    np.testing.assert_allclose(
        strategy.state.contribution_sum[0], _shares(proxies[:9], 20), rtol=0, atol=1e-9
    )


# ------------------------------------------------------------------ configuration
@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"rho": 0.0}, "rho"),
        ({"rho": -1.0}, "rho"),
        ({"rho": float("nan")}, "rho"),
        ({"dual_step": 0.0}, "dual_step"),
        ({"dual_step": 1.5}, "dual_step"),
        ({"dual_step": True}, "dual_step"),
        ({"uplink": Uplink(StochasticQuantizer(bits=8, error_feedback=False))}, "uplink"),
        ({"uplink": StochasticQuantizer(bits=8)}, "uplink"),  # a compressor goes in an Uplink
        ({"uplink": "sq"}, "uplink"),
        ({"uplink": Uplink(local_dp=LocalDP(clip=1.0, noise_multiplier=0.0))}, "local_dp"),
        ({"checkpoint": "ckpt"}, "checkpoint"),
        ({"convergence": 1e-6}, "convergence"),
        ({"clients": "node"}, "clients"),
        ({"sampling_seed": -2}, "sampling_seed"),
        ({"fraction_fit": 2.0}, "fraction_fit"),
    ],
)
@pytest.mark.parametrize("api", ["legacy", "message"])
def test_configuration_errors_name_the_field(kwargs: dict[str, Any], field: str, api: str) -> None:
    """Both APIs' FedADMMClientDuals refuse the same settings with a ValueError."""
    from flwr_admm.serverapp import FedADMMClientDuals as MessageFedADMMClientDuals

    if api == "message":
        kwargs = {k.replace("fraction_fit", "fraction_train"): v for k, v in kwargs.items()}
        field = field.replace("fraction_fit", "fraction_train")
    strategy_class = FedADMMClientDuals if api == "legacy" else MessageFedADMMClientDuals
    with pytest.raises(ValueError, match=field):
        strategy_class(**kwargs)


@pytest.mark.parametrize(
    "keyword", ["tensor_policy", "rho_schedule", "client_rho", "relaxation", "restart_eta"]
)
@pytest.mark.parametrize("api", ["legacy", "message"])
def test_fedadmm_only_keywords_are_not_in_the_signature(keyword: str, api: str) -> None:
    """Tensor policies, a rho schedule, per-client rho and over-relaxation are FedADMM's
    (the server would need every client's dual); restart_eta is gone: Python's TypeError."""
    from flwr_admm.serverapp import FedADMMClientDuals as MessageFedADMMClientDuals

    strategy_class = FedADMMClientDuals if api == "legacy" else MessageFedADMMClientDuals
    with pytest.raises(TypeError, match=f"unexpected keyword argument '{keyword}'"):
        strategy_class(**{keyword: None})


def test_client_refuses_what_client_held_duals_cannot_do() -> None:
    client = admm_client_fn(**CLIENT)(make_proxies(admm_client_fn(), 1)[0].context)
    z = [np.zeros(20)]
    with pytest.raises(ValueError, match="rho"):
        client.fit(z, {"rho": 0.0, MODE_KEY: "client", "server_round": 1})
    dp = {"rho": 0.1, MODE_KEY: "client", **LocalDP(clip=1.0, noise_multiplier=1.0).config()}
    with pytest.raises(ValueError, match="local DP is not supported with client-held duals"):
        client.fit(z, dp)
    no_feedback = StochasticQuantizer(bits=8, error_feedback=False).config()
    with pytest.raises(ValueError, match="need error feedback"):
        client.fit(z, {"rho": 0.1, MODE_KEY: "client", **no_feedback})
    assert client.context.state.array_records == {}  # nothing kept by a refused fit


# ------------------------------------------------------------------ uplink compression
def test_seed_logreg_8_bits_with_error_feedback_reaches_the_optimum() -> None:
    _, client, result = run_seed(
        FedADMMClientDuals,
        60,
        client_kwargs=CLIENT,
        rho=0.1,
        uplink=Uplink(StochasticQuantizer(bits=8)),
    )
    gap = gaps(client.matrix)
    assert all(m["num_rejected"] == 0 for m in result.fit_metrics)
    reached = first_round_below(gap, 1e-6)
    assert reached is not None and reached <= 22  # measured: 17 (full precision: 17)
    assert gap[-20:].max() <= 1e-12  # measured 3.1e-16: Delta_i -> 0, so does its error
    # 20 parameters: 44 bytes a reply (16-byte header, lo and step, 20 one-byte levels)
    # against 288 for the float64 .npy reply (128-byte header + 160).
    float64 = len(ndarrays_to_parameters([np.zeros(20)]).tensors[0])
    assert [m["uplink_bytes"] for m in result.fit_metrics] == [NUM_CLIENTS * 44] * 60
    assert float64 / 44 >= 6.5


def _wide_client_fn(d: int) -> Any:
    rng = np.random.default_rng(0)
    data = [(rng.standard_normal((30, d)), rng.integers(0, 2, 30)) for _ in range(6)]

    def client_fn(context: Context) -> ADMMClient:
        X, y = data[int(context.node_config["partition-id"])]
        model = LogisticRegression(d, l2=0.01, fit_intercept=False)
        return ADMMClient(model, X, y, context=context, local_steps=3, learning_rate=0.5)

    return client_fn


def test_uplink_bytes_are_an_eighth_of_float64_on_a_wide_model() -> None:
    d = 5000
    strategy = FedADMMClientDuals(
        rho=0.1,
        initial_parameters=ndarrays_to_parameters([np.zeros(d)]),
        min_available_clients=6,
        uplink=Uplink(StochasticQuantizer(bits=8)),
    )
    result = run_rounds(strategy, make_proxies(_wide_client_fn(d), 6), 2)
    float64 = 6 * len(ndarrays_to_parameters([np.zeros(d)]).tensors[0])
    ratios = [float64 / m["uplink_bytes"] for m in result.fit_metrics]
    assert all(7.9 <= r <= 8.0 for r in ratios), ratios  # measured: 7.99 (30,144 vs 240,768 bytes)


@pytest.mark.parametrize("compressor", [StochasticQuantizer(bits=4), TopK(fraction=0.1)])
def test_s_is_the_contributions_minus_the_clients_residuals(compressor: Any) -> None:
    """S = sum_i n_i c_i - sum_i e_i after every round (3 of 6 clients a round)."""
    d, num_clients = 50, 6
    strategy = FedADMMClientDuals(
        rho=0.1,
        initial_parameters=ndarrays_to_parameters([np.zeros(d)]),
        fraction_fit=0.5,
        min_fit_clients=3,
        min_available_clients=num_clients,
        uplink=Uplink(compressor),
    )
    proxies = make_proxies(_wide_client_fn(d), num_clients)
    largest_residual = 0.0
    for server_round in range(1, 9):
        _one_round(strategy, proxies, server_round)
        assert strategy.state.contribution_sum is not None
        expected = np.zeros(d)
        for proxy in proxies:
            kept = load_states(proxy.context.state, [(d,)])
            state = kept.pending or kept.committed
            if state is None:
                continue
            expected += state.num_examples * state.contribution[0]
            assert state.residual is not None
            expected -= state.residual[0]
            largest_residual = max(largest_residual, float(np.abs(state.residual[0]).max()))
        np.testing.assert_allclose(strategy.state.contribution_sum[0], expected, rtol=0, atol=1e-12)
    assert largest_residual > 1e-3  # measured 17.6 (TopK); S matches to 3.6e-15


def _replies_of(
    strategy: FedADMMClientDuals, proxies: list[Any], replying: int, server_round: int
) -> dict[str, Any]:
    """One round with every node connected and only the first `replying` replying."""
    manager = SimpleClientManager()
    for proxy in proxies:
        manager.register(proxy)
    instructions = strategy.configure_fit(server_round, _current(strategy), manager)
    quiet = {proxy.cid for proxy in proxies[replying:]}
    results = [(p, p.fit(ins, None, server_round)) for p, ins in instructions if p.cid not in quiet]
    return strategy.aggregate_fit(server_round, results, [])[1]


def _current(strategy: FedADMMClientDuals) -> Parameters:
    """Return z as the driver hands it back: the strategy's z', else the initial one."""
    if strategy.z is None:
        assert strategy.initial_parameters is not None
        return strategy.initial_parameters
    return ndarrays_to_parameters(strategy.z)


def _one_round(
    strategy: FedADMMClientDuals, proxies: list[Any], server_round: int
) -> tuple[list[Any], dict[str, Any]]:
    """Run one round by hand; return the instructions and the round metrics."""
    manager = SimpleClientManager()
    for proxy in proxies:
        manager.register(proxy)
    instructions = strategy.configure_fit(server_round, _current(strategy), manager)
    results = [(proxy, proxy.fit(ins, None, server_round)) for proxy, ins in instructions]
    _, metrics = strategy.aggregate_fit(server_round, results, [])
    return instructions, metrics


def test_the_returned_parameters_are_not_re_read_so_z_stays_float64() -> None:
    """A float32 model: the driver hands back what the strategy returned, and z' is
    kept as the z-step left it; other parameters are read (rounded) as z^k."""
    initial = ndarrays_to_parameters([np.zeros(20, dtype=np.float32)])
    strategy = FedADMMClientDuals(rho=0.1, initial_parameters=initial)
    result = run_rounds(strategy, make_proxies(admm_client_fn(**CLIENT), NUM_CLIENTS), 2)
    assert result.parameters is not None and strategy.z is not None
    kept = strategy.z[0].copy()
    assert kept.dtype == np.float64 and not np.array_equal(kept, kept.astype(np.float32))
    manager = SimpleClientManager()
    for proxy in make_proxies(admm_client_fn(**CLIENT), NUM_CLIENTS):
        manager.register(proxy)
    sent = strategy.configure_fit(3, result.parameters, manager)
    np.testing.assert_array_equal(strategy.z[0], kept)
    assert parameters_to_ndarrays(sent[0][1].parameters)[0].dtype == np.float32
    copy = ndarrays_to_parameters(parameters_to_ndarrays(result.parameters))
    strategy.configure_fit(3, copy, manager)
    np.testing.assert_array_equal(strategy.z[0], kept.astype(np.float32))


def test_corrupted_compressed_payloads_are_rejected_without_touching_s() -> None:
    strategy, proxies = _run(4, 2, uplink=Uplink(StochasticQuantizer(bits=8)))
    assert strategy.state.contribution_sum is not None
    manager = SimpleClientManager()
    for proxy in proxies:
        manager.register(proxy)
    instructions = strategy.configure_fit(3, _current(strategy), manager)
    assert instructions[0][1].config["uplink"] == "sq"
    results = [(proxy, proxy.fit(ins, None, 3)) for proxy, ins in instructions]
    results.sort(key=lambda item: int(item[1].metrics["partition-id"]))
    flipped = bytearray(results[1][1].parameters.tensors[0])
    flipped[-1] ^= 0x01
    results[1][1].parameters.tensors[0] = bytes(flipped)
    results[2][1].parameters.tensors[0] = results[2][1].parameters.tensors[0][:-3]
    wrong = StochasticQuantizer(bits=8).encode([np.ones(21)], np.random.default_rng(0))
    results[3][1].parameters = wrong
    decoded = StochasticQuantizer(bits=8).decode(results[0][1].parameters, [(20,)])
    before = [s.copy() for s in strategy.state.contribution_sum]
    _, metrics = strategy.aggregate_fit(3, results, [])
    assert metrics["num_rejected"] == 3 and metrics["num_replies"] == 1
    np.testing.assert_allclose(
        strategy.state.contribution_sum[0], before[0] + decoded[0], atol=1e-14
    )
    assert strategy.state.clients["partition-id:0"].last_round == 3
    assert all(strategy.state.clients[f"partition-id:{i}"].last_round == 2 for i in (1, 2, 3))


# ------------------------------------------------------------------ checkpoints
def _checkpointed(
    path: Path, proxies: list[Any], rounds: int, every: int = 1, **kwargs: Any
) -> tuple[FedADMMClientDuals, Recorder, Any]:
    recorder = Recorder()
    strategy = FedADMMClientDuals(
        rho=kwargs.pop("rho", 0.1),
        initial_parameters=zeros_parameters(),
        evaluate_fn=recorder,
        checkpoint=Checkpointing(path, every=every),
        **PARTIAL,
        **kwargs,
    )
    return strategy, recorder, run_rounds(strategy, proxies, rounds)


def test_resume_with_persistent_clients_is_bit_identical(tmp_path: Path) -> None:
    """10 rounds straight == 6 rounds + checkpoint + a new strategy + 4 rounds.

    3 of 10 clients a round (seeded sampling, delayed duals). The resumed run talks to
    the same proxies, whose contexts kept the clients' duals, as persistent SuperNodes
    would after a SuperLink restart; its round numbers continue at 7.
    """
    _, expected, _ = _checkpointed(
        tmp_path / "straight", make_proxies(admm_client_fn(**CLIENT), NUM_CLIENTS), 10
    )
    proxies = make_proxies(admm_client_fn(**CLIENT), NUM_CLIENTS)
    _, before, _ = _checkpointed(tmp_path / "ckpt", proxies, 6)
    assert json.loads((tmp_path / "ckpt" / "checkpoint.json").read_text())["round"] == 6
    # A SuperLink restart that loses its SuperNodes' state too: every returning client
    # resynchronizes (`every` keeps this probe from overwriting the checkpoint).
    lost, _, probe = _checkpointed(
        tmp_path / "ckpt",
        make_proxies(admm_client_fn(**CLIENT), 10),
        1,
        every=99,
    )
    assert probe.fit_metrics[0]["num_resynced"] == 3  # its 3 sampled clients
    assert probe.fit_metrics[0]["rebuilding"] == 1 and lost.last_round == 7
    assert json.loads((tmp_path / "ckpt" / "checkpoint.json").read_text())["round"] == 6

    second, after, result = _checkpointed(tmp_path / "ckpt", proxies, 4)
    np.testing.assert_array_equal(np.vstack([before.matrix, after.matrix]), expected.matrix)
    assert [h["round"] for h in second.history] == [7, 8, 9, 10]
    assert all(m["num_state_mismatch"] == 0 for m in result.fit_metrics)
    assert json.loads((tmp_path / "ckpt" / "checkpoint.json").read_text())["round"] == 10


def test_mismatched_or_damaged_checkpoint_is_an_error(tmp_path: Path) -> None:
    # (The probes share the run's sampling settings: only the named field differs.)
    _checkpointed(tmp_path, make_proxies(admm_client_fn(**CLIENT), NUM_CLIENTS), 2)
    with pytest.raises(
        CheckpointError, match=r"another configuration \(rho: checkpoint 0.1, now 0.2"
    ):
        FedADMMClientDuals(rho=0.2, checkpoint=Checkpointing(tmp_path), **PARTIAL)
    with pytest.raises(CheckpointError, match="regularizer"):
        FedADMMClientDuals(
            rho=0.1, regularizer=L1(0.02), checkpoint=Checkpointing(tmp_path), **PARTIAL
        )
    with pytest.raises(CheckpointError, match="another configuration"):  # not its format
        textbook(rho=0.1, checkpoint=Checkpointing(tmp_path))
    wrong = FedADMMClientDuals(
        rho=0.1,
        checkpoint=Checkpointing(tmp_path),
        initial_parameters=ndarrays_to_parameters([np.zeros(21)]),
        **PARTIAL,
    )
    with pytest.raises(ValueError, match="initial_parameters"):
        wrong.initialize_parameters(SimpleClientManager())
    assert (
        FedADMMClientDuals(rho=0.1, checkpoint=Checkpointing(tmp_path, resume=False), **PARTIAL).z
        is None
    )
    arrays = next(tmp_path.glob("state-r*.npz"))
    arrays.write_bytes(arrays.read_bytes()[:-10])
    with pytest.raises(CheckpointError, match="truncated"):
        FedADMMClientDuals(rho=0.1, checkpoint=Checkpointing(tmp_path), **PARTIAL)


# ------------------------------------------------------------------ server memory
def _model_sized(value: Any, size: int, seen: set[int]) -> int:
    """Arrays (or serialized bytes) of at least `size` float64 values reachable from value."""
    if id(value) in seen:
        return 0
    seen.add(id(value))
    if isinstance(value, np.ndarray):
        return int(value.size >= size)
    if isinstance(value, bytes | bytearray):
        return int(len(value) >= 8 * size)
    if isinstance(value, dict):
        return sum(_model_sized(v, size, seen) for v in value.values())
    if isinstance(value, list | tuple | set):
        return sum(_model_sized(v, size, seen) for v in value)
    if hasattr(value, "__dict__") and not callable(value):
        return _model_sized(vars(value), size, seen)
    return 0


def test_server_state_does_not_grow_with_the_number_of_clients() -> None:
    d, rng = 20, np.random.default_rng(0)
    data = [(rng.standard_normal((30, d)), rng.integers(0, 2, 30)) for _ in range(100)]

    def client_fn(context: Context) -> ADMMClient:
        X, y = data[int(context.node_config["partition-id"])]
        model = LogisticRegression(d, l2=0.01, fit_intercept=False)
        return ADMMClient(model, X, y, context=context, local_steps=2, learning_rate=0.5)

    held = []
    for num_clients in (10, 100):
        strategy = FedADMMClientDuals(
            rho=0.1, initial_parameters=zeros_parameters(), min_available_clients=num_clients
        )
        run_rounds(strategy, make_proxies(client_fn, num_clients), 3)
        assert len(strategy.state.clients) == num_clients
        assert strategy.history[-1]["num_replies"] == num_clients
        held.append(_model_sized(strategy, d, set()))
    assert held == [3, 3]  # z, S and the serialized z it broadcast last
    # Server-held FedADMM keeps two model copies per client: the count would grow.
    strategy = textbook(rho=0.1, initial_parameters=zeros_parameters(), min_available_clients=100)
    run_rounds(strategy, make_proxies(client_fn, 100), 1)
    assert _model_sized(strategy, d, set()) >= 200
