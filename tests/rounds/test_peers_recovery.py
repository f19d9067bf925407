"""SCAFFOLD and FedDyn recover from a reply the server never folded and a lost state.

On the ridge clients of `peer_faults` (4 clients, 120 rounds, full participation):
client 1's round-5 reply is lost, arrives with a NaN, or its node's state is wiped
before round 5; or a fifth node reports client 1's partition-id from round 2 on.
Without the acknowledgement (the client saved c_i / grad_i as soon as it replied) and
the key binding, the gaps to the pooled optimum were 1.5e-2 / 9.4e-3 (lost, NaN), 0.11 /
7.6e-2 (wipe) and 0.20 / 0.13 (impostor; 6.4e-2 / 0.27 on the Message API), SCAFFOLD /
FedDyn, against 5.8e-16 / 5.3e-16 without a fault; each test failed then. Both peers
run one round (`flwr_admm.rounds.peers.PeerRound`) and each API one translator: the
legacy API runs both peers, the Message API SCAFFOLD (its two records), not FedDyn's
copy of that path.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from flwr.common import parameters_to_ndarrays
from peer_faults import LR, OPTIONS, SIZES, STEPS, D, data, run_legacy, run_message
from peer_reference import client_fn_for, common_kwargs

from flwr_admm import Checkpointing, ClientPolicy
from flwr_admm.protocol import FEDDYN_STATE_GRAD, SCAFFOLD_STATE_C
from flwr_admm.server import SCAFFOLD, FedDyn, FedNova
from flwr_admm.testing import make_proxies, run_rounds

RUNS = {"legacy": run_legacy, "message": run_message}
CASES = [("legacy", "scaffold"), ("legacy", "feddyn"), ("message", "scaffold")]
FAULT_ROUND = 5


@pytest.fixture(scope="module")
def clean() -> dict[tuple[str, str], float]:
    return {(api, peer): RUNS[api](peer, {})[1] for api, peer in CASES}


@pytest.mark.parametrize("fault", ["lost", "nan", "wipe"])
@pytest.mark.parametrize(("api", "peer"), CASES)
def test_one_lost_nan_or_wiped_reply_leaves_the_fixed_point(
    api: str, peer: str, fault: str, clean: dict[tuple[str, str], float]
) -> None:
    strategy, gap, nodes = RUNS[api](peer, {1: {FAULT_ROUND: fault}})
    assert abs(gap - clean[api, peer]) < 1e-8
    round_5 = strategy.history[FAULT_ROUND - 1]
    assert round_5["num_replies"] == (4 if fault == "wipe" else 3)
    assert round_5["num_rejected"] == int(fault == "nan")
    assert round_5["num_resynced"] == int(fault == "wipe")
    assert all(h["num_state_mismatch"] == 0 for h in strategy.history)
    if api == "legacy":  # the server's state is the n-weighted mean of what clients kept
        name = SCAFFOLD_STATE_C if peer == "scaffold" else FEDDYN_STATE_GRAD
        kept = [p.context.state.array_records[name].to_numpy_ndarrays()[0] for p in nodes]
        n = np.array([5, 12, 8, 20], dtype=float)
        mean = (n[:, None] * np.array(kept)).sum(axis=0) / n.sum()
        state = strategy.control() if peer == "scaffold" else strategy.h()
        np.testing.assert_allclose(state[0], mean, rtol=1e-10, atol=1e-14)


@pytest.mark.parametrize(("api", "peer"), CASES)
def test_a_node_replying_under_another_nodes_key_is_a_conflict(
    api: str, peer: str, clean: dict[tuple[str, str], Any]
) -> None:
    strategy, gap, _ = RUNS[api](peer, {4: {1: "lost"}}, impostor=True)
    assert abs(gap - clean[api, peer]) < 1e-8
    assert [h["num_key_conflicts"] for h in strategy.history[1:]] == [1] * 119
    assert all(h["num_replies"] == 4 for h in strategy.history)


PEER_CLASSES = {"scaffold": SCAFFOLD, "feddyn": FedDyn, "fednova": FedNova}


@pytest.mark.parametrize("peer", list(PEER_CLASSES))
def test_a_run_resumed_from_its_checkpoint_continues_bit_for_bit(peer: str, tmp_path) -> None:
    """The round layer's checkpoint: x, the per-key states, n_i, a_i and the bindings."""
    options = {**common_kwargs(D, fraction=0.5), **OPTIONS.get(peer, {})}
    client_fn = client_fn_for(data(), STEPS, LR)
    whole = PEER_CLASSES[peer](**options)
    expected = run_rounds(whole, make_proxies(client_fn, len(SIZES)), 8)
    proxies = make_proxies(client_fn, len(SIZES))  # the clients outlive the server
    first = PEER_CLASSES[peer](**options, checkpoint=Checkpointing(tmp_path, every=5))
    run_rounds(first, proxies, 6)  # round 6 is lost with the server
    resumed = PEER_CLASSES[peer](**options, checkpoint=Checkpointing(tmp_path))
    result = run_rounds(resumed, proxies, 3)
    assert [h["round"] for h in resumed.history] == [6, 7, 8]
    assert resumed.history == whole.history[5:]
    got, want = (parameters_to_ndarrays(r.parameters)[0] for r in (result, expected))
    np.testing.assert_array_equal(got, want)
    if peer != "fednova":
        state = "control" if peer == "scaffold" else "h"
        np.testing.assert_array_equal(getattr(resumed, state)()[0], getattr(whole, state)()[0])


def test_max_clients_evicts_the_least_recently_heard_share() -> None:
    """2 of 4 clients a round, max_count=2: c is the n-weighted mean of the two held c_i."""
    strategy = SCAFFOLD(**common_kwargs(D, fraction=0.5), clients=ClientPolicy(max_count=2))
    proxies = make_proxies(client_fn_for(data(), STEPS, LR), len(SIZES))
    run_rounds(strategy, proxies, 12)
    assert all(h["num_clients_cached"] == 2 for h in strategy.history)
    assert sum(h["num_evicted"] for h in strategy.history) > 0
    held = [int(key.split(":")[1]) for key in strategy.algorithm.examples]
    kept = [
        proxies[i].context.state.array_records[SCAFFOLD_STATE_C].to_numpy_ndarrays()[0]
        for i in held
    ]
    n = np.array([SIZES[i] for i in held], dtype=float)
    mean = (n[:, None] * np.array(kept)).sum(axis=0) / n.sum()
    np.testing.assert_allclose(strategy.control()[0], mean, rtol=1e-10, atol=1e-14)
