"""Where `ADMMClient`'s local solve starts: its last w_i, the center, or the received z.

``local_init="consensus"`` starts at the received z, as FedDyn's clients do; only
client-held duals send z, so with server-held duals it is an error. The default,
"auto", is "consensus" under client-held duals and "previous" under server-held ones.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from flower_run import D, run_seed, seed_data, seed_model
from flwr.common import Context, RecordDict, Scalar
from seed_task import first_round_below, gaps

from flwr_admm.client import ADMMClient, admm_client
from flwr_admm.server import FedADMMClientDuals

CLIENT_DUALS: dict[str, Scalar] = {"rho": 0.1, "admm-duals": "client", "local_steps": 5}


def _client(local_init: str) -> ADMMClient:
    data = seed_data()
    context = Context(
        run_id=0, node_id=1, node_config={"partition-id": 0}, state=RecordDict(), run_config={}
    )
    return ADMMClient(
        seed_model(),
        data.X[0],
        data.y[0],
        context=context,
        learning_rate=0.5,
        local_init=local_init,  # type: ignore[arg-type]
    )


@pytest.mark.parametrize("local_init", ["auto", "previous", "center", "consensus"])
def test_the_second_round_starts_where_local_init_says(
    local_init: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    starts: list[tuple[np.ndarray, np.ndarray]] = []
    solved: list[np.ndarray] = []
    solve = admm_client.penalized_local_solve

    def recording(model: Any, start: Any, *args: Any, **kwargs: Any) -> Any:
        starts.append((np.array(start[0]), np.array(kwargs["center"][0])))
        result = solve(model, start, *args, **kwargs)
        solved.append(np.array(result.params[0]))
        return result

    monkeypatch.setattr(admm_client, "penalized_local_solve", recording)
    client = _client(local_init)
    client.fit([np.full(D, 0.2)], {**CLIENT_DUALS, "server_round": 1})
    z = np.full(D, -0.3)
    client.fit([z], {**CLIENT_DUALS, "server_round": 2, "admm-ack-round": 1})
    (_, _), (start, center) = starts
    assert not np.allclose(center, z)  # the client's dual moved its center off z
    expected = {"previous": solved[0], "center": center, "consensus": z, "auto": z}[local_init]
    np.testing.assert_array_equal(start, expected)
    for other in ({"previous": solved[0], "center": center, "consensus": z}).values():
        assert other is expected or not np.allclose(other, expected)  # three distinct starts


def test_auto_is_the_default_and_starts_at_the_last_w_i_under_server_held_duals(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert _client("auto").local_init == "auto"
    data = seed_data()
    assert ADMMClient(seed_model(), data.X[0], data.y[0]).local_init == "auto"
    starts: list[np.ndarray] = []
    solved: list[np.ndarray] = []
    solve = admm_client.penalized_local_solve

    def recording(model: Any, start: Any, *args: Any, **kwargs: Any) -> Any:
        starts.append(np.array(start[0]))
        result = solve(model, start, *args, **kwargs)
        solved.append(np.array(result.params[0]))
        return result

    monkeypatch.setattr(admm_client, "penalized_local_solve", recording)
    client = _client("auto")
    held = {"rho": 0.1, "local_steps": 5}
    client.fit([np.full(D, 0.2)], {**held, "server_round": 1})
    v = np.full(D, -0.3)  # server-held duals: the center v_i, never z
    client.fit([v], {**held, "server_round": 2})
    np.testing.assert_array_equal(starts[0], np.full(D, 0.2))  # a first round: at v_i
    np.testing.assert_array_equal(starts[1], solved[0])  # then at the last w_i
    assert not np.allclose(solved[0], v)


def test_consensus_with_server_held_duals_is_refused() -> None:
    client = _client("consensus")
    with pytest.raises(ValueError, match=r"^local_init: 'consensus' needs z"):
        client.fit([np.zeros(D)], {"rho": 0.1, "local_steps": 2, "server_round": 1})
    # rho = 0 (FedAvg through FedADMM) starts at the received z anyway: accepted
    client.fit([np.zeros(D)], {"rho": 0.0, "local_steps": 2, "server_round": 1})


def test_other_values_are_refused_naming_the_four() -> None:
    match = r"\['auto', 'previous', 'center', 'consensus'\], got 'zero'"
    with pytest.raises(ValueError, match=match):
        _client("zero")


def test_client_duals_starting_at_z_reach_the_optimum() -> None:
    # The start of a local solve is no part of the fixed point: 1e-6 is reached as with
    # "previous" (seed 000's task, rho 0.1, 20 steps of lr 1).
    client = {"local_steps": 20, "learning_rate": 1.0, "local_init": "consensus"}
    _, recorder, _ = run_seed(FedADMMClientDuals, 80, client_kwargs=client, rho=0.1)
    assert first_round_below(gaps(recorder.matrix), 1e-6) is not None
