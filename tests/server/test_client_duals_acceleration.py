"""FedADMMClientDuals(acceleration=...): fast ADMM with the duals on the clients.

Seed 000's task, 10 clients, rho 0.1, 20 local steps, lr 1.0. The server extrapolates
z and sends z_k and g; each client extrapolates its own dual
(`flwr_admm.core.dual_momentum`). While every client replies in every round the server
computes the restart test's c_k in time from sums it tracks, so the z sequence is
server-held `FedADMM(acceleration=...)`'s; otherwise the test lags one round.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from flower_run import NUM_CLIENTS, relative_errors, run_seed, seed_data
from seed_task import first_round_below, gaps
from server.test_client_duals_recovery import assert_recovers, run

from flwr_admm import Checkpointing
from flwr_admm.core.client_duals import Extrapolation, start_round
from flwr_admm.node.records import load_states
from flwr_admm.protocol import (
    ACCEL_GAMMA,
    MODE_CLIENT,
    MODE_KEY,
    RHO,
    SERVER_ROUND,
)
from flwr_admm.server import FedADMMClientDuals, FedADMMClientDualsSecAgg
from flwr_admm.server.fedadmm import textbook

# Both sides start the local solve at the client's last w_i, so that client-held duals
# give server-held FedADMM's iterates (FedADMMClientDuals' default, "auto", starts at z)
CLIENT = {"local_steps": 20, "learning_rate": 1.0, "local_init": "previous"}
PARTIAL = {"fraction_fit": 0.3, "min_fit_clients": 3, "min_available_clients": 10}


def _restarts(strategy: Any) -> int:
    fast = getattr(getattr(strategy, "admm", None), "fast", None)
    return int(fast.restarts if fast is not None else strategy.state.momentum.restarts)


def _run(factory: Any, kind: str, rounds: int, **kwargs: Any) -> tuple[Any, list[int]]:
    """Run `factory` with acceleration=kind; return its z recorder and restarts per round."""
    restarts: list[int] = []
    _, recorder, _ = run_seed(
        factory,
        rounds,
        client_kwargs=CLIENT,
        rho=0.1,
        acceleration=kind,
        on_round=lambda s, k: restarts.append(_restarts(s)),
        **kwargs,
    )
    return recorder, restarts


def _runs(kind: str, rounds: int, **kwargs: Any) -> tuple[Any, Any, list[int], list[int]]:
    held, held_restarts = _run(textbook, kind, rounds, **kwargs)
    client, client_restarts = _run(FedADMMClientDuals, kind, rounds, **kwargs)
    return held, client, held_restarts, client_restarts


def test_full_participation_is_server_held_fast_admm() -> None:
    """The main claim: the z sequence and every restart of FedADMM(acceleration="nesterov")."""
    held, client, held_restarts, client_restarts = _runs("nesterov", 40)
    errors = relative_errors(client.matrix, held.matrix)
    assert errors.max() <= 1e-12, errors  # measured: 4.7e-15
    assert client_restarts == held_restarts  # the restart test is in time
    assert held_restarts[-1] == 5  # measured
    reached = first_round_below(gaps(client.matrix), 1e-6)
    assert reached == 10  # plain ADMM: 17
    assert gaps(client.matrix)[-1] <= 1e-9


def test_s_is_the_sum_of_the_clients_extrapolated_contributions() -> None:
    """S = sum_i n_i (w_i + u^_i) over the clients' committed states, to rounding."""
    from flower_run import admm_client_fn, zeros_parameters

    from flwr_admm.testing import make_proxies, run_rounds

    strategy = FedADMMClientDuals(
        rho=0.1, acceleration="nesterov", initial_parameters=zeros_parameters(), **PARTIAL
    )
    proxies = make_proxies(admm_client_fn(**CLIENT), NUM_CLIENTS)
    run_rounds(strategy, proxies, 12)
    shapes = [t.shape for t in strategy.state.contribution_sum]
    total = [np.zeros(s) for s in shapes]
    for proxy in proxies:
        kept = load_states(proxy.context.state, shapes)
        state = kept.pending or kept.committed
        if state is None:
            continue
        if state.server_round > 1:  # u_i,prev is kept once the client extrapolated
            assert state.dual_prev is not None
        for acc, part in zip(total, state.share, strict=True):
            acc += part
    scale = max(float(np.abs(t).max()) for t in total)
    for ours, theirs in zip(strategy.state.contribution_sum, total, strict=True):
        assert np.abs(ours - theirs).max() <= 1e-12 * scale
    assert strategy.state.momentum is not None and strategy.state.momentum.restarts >= 1


def test_without_acceleration_it_is_plain_admm_and_sends_no_fast_admm_key() -> None:
    """acceleration=None (the default here) is the textbook iteration: with every client
    every round z per round equals server-held FedADMM(acceleration=None, constant rho,
    alpha 1) to 1e-12 relative, with no momentum and no fast-ADMM metric; with partial
    participation it reaches the optimum as before (test_client_duals.py, 57 rounds).

    (At the merge it was also checked bit for bit against the code before fast ADMM
    for client-held duals, full and partial: sha256 of z per round and S over 25
    rounds; the hash is not kept as a test, it depends on the machine's BLAS.)"""
    _, held, _ = run_seed(textbook, 25, client_kwargs=CLIENT, rho=0.1)
    strategy, client, _ = run_seed(FedADMMClientDuals, 25, client_kwargs=CLIENT, rho=0.1)
    assert relative_errors(client.matrix, held.matrix).max() <= 1e-12
    assert strategy.state.momentum is None
    assert not any("restarts" in key for h in strategy.history for key in h)


def test_partial_participation_converges() -> None:
    """3 of 10 clients a round: each dual is extrapolated only when its client replies."""
    strategy, client, result = run_seed(
        FedADMMClientDuals, 60, client_kwargs=CLIENT, rho=0.1, acceleration="nesterov", **PARTIAL
    )
    assert [h["num_replies"] for h in strategy.history] == [3] * 60
    reached = first_round_below(gaps(client.matrix), 1e-6)
    assert reached is not None and reached <= 58, gaps(client.matrix)[-5:]  # measured: 55
    assert gaps(client.matrix)[-1] <= 5e-7  # measured: 3.7e-7 at round 60
    assert int(result.fit_metrics[-1]["num_restarts"]) >= 1


@pytest.mark.parametrize(
    ("faults", "expected"),
    # measured with ADMMClient's default start ("auto": z under client-held duals);
    # from the client's last w_i ("previous") the lost replies take 11
    [({3: {3: "lost", 4: "lost"}}, 12), ({4: {6: "wipe"}}, 12), ({7: {5: "replay"}}, 10)],
    ids=["lost replies", "lost state (resync)", "replay"],
)
def test_faults_with_acceleration_still_converge(
    faults: dict[int, dict[int, str]], expected: int
) -> None:
    """The recovery suite's faults with u_i,prev in the committed/pending states."""
    strategy, recorder, result = run(faults, acceleration="nesterov")
    assert assert_recovers(recorder, result) == expected  # without acceleration: 17
    assert strategy.state.momentum.u_sum is None  # an incomplete round: the test lags from then


def test_the_client_extrapolates_its_own_dual() -> None:
    """u = u^ + w - z_k; u^' = u + g (u - u_prev); v = z^ - u^'."""
    from flwr_admm.core.client_duals import DualState

    w, u_hat, u_prev = [np.array([1.0, 2.0])], [np.array([0.5, -0.5])], [np.array([0.25, 0.0])]
    z_k, z_hat = [np.array([0.5, 1.0])], [np.array([0.75, 1.25])]
    state = DualState(w, u_hat, 10, 3, None, u_prev)
    start = start_round(state, z_hat, Extrapolation(z_k, 0.5))
    u = np.array([1.0, 0.5])  # 0.5 + 1 - 0.5, -0.5 + 2 - 1
    np.testing.assert_array_equal(start.dual[0], u + 0.5 * (u - u_prev[0]))
    np.testing.assert_array_equal(start.dual_prev[0], u)  # type: ignore[index]
    np.testing.assert_array_equal(start.center[0], z_hat[0] - start.dual[0])
    assert start.delayed_sq_residual == 0.25 + 1.0
    fresh = start_round(None, z_hat, Extrapolation(z_k, 0.5))
    assert not fresh.dual[0].any() and not fresh.dual_prev[0].any()  # type: ignore[index]


def test_secagg_refuses_acceleration_naming_the_field() -> None:
    with pytest.raises(ValueError, match="acceleration"):
        FedADMMClientDualsSecAgg(acceleration="nesterov")


def test_the_client_refuses_a_bad_coefficient_naming_the_key() -> None:
    from flower_run import seed_model

    from flwr_admm.client import ADMMClient

    data = seed_data()
    client = ADMMClient(seed_model(), data.X[0], data.y[0])
    z = [np.zeros(20), np.zeros(20)]  # z^, z_k
    config = {RHO: 0.1, MODE_KEY: MODE_CLIENT, SERVER_ROUND: 2}
    with pytest.raises(ValueError, match=ACCEL_GAMMA):
        client.fit(z, {**config, ACCEL_GAMMA: 1.5})


def test_resume_with_acceleration_is_bit_identical(tmp_path: Path) -> None:
    """10 rounds == 6 + checkpoint (with a, c_{k-1}, z_{k-1}, z_k, g) + 4, full participation."""
    from flower_run import Recorder, admm_client_fn, zeros_parameters

    from flwr_admm.testing import make_proxies, run_rounds

    def checkpointed(path: Path, proxies: list[Any], rounds: int) -> tuple[Any, Recorder]:
        recorder = Recorder()
        strategy = FedADMMClientDuals(
            rho=0.1,
            acceleration="nesterov",
            initial_parameters=zeros_parameters(),
            evaluate_fn=recorder,
            checkpoint=Checkpointing(path),
        )
        run_rounds(strategy, proxies, rounds)
        return strategy, recorder

    straight, expected = checkpointed(
        tmp_path / "straight", make_proxies(admm_client_fn(**CLIENT), NUM_CLIENTS), 10
    )
    proxies = make_proxies(admm_client_fn(**CLIENT), NUM_CLIENTS)
    _, before = checkpointed(tmp_path / "ckpt", proxies, 6)
    resumed, after = checkpointed(tmp_path / "ckpt", proxies, 4)
    np.testing.assert_array_equal(np.vstack([before.matrix, after.matrix]), expected.matrix)
    assert resumed.state.momentum.restarts == straight.state.momentum.restarts >= 1
    with pytest.raises(ValueError, match="acceleration"):  # the fingerprint holds it
        FedADMMClientDuals(
            rho=0.1,
            initial_parameters=zeros_parameters(),
            checkpoint=Checkpointing(tmp_path / "ckpt"),
        )
