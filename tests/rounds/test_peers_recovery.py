"""SCAFFOLD and FedDyn recover from a reply the server never folded and a lost state.

Both APIs (`flwr_admm.rounds.peers.PeerRound` is their shared round), on the ridge
clients of `peer_faults` (4 clients, 120 rounds, full participation): client 1's round-5
reply is lost, arrives with a NaN, or its node's state is wiped before round 5; or a
fifth node reports client 1's partition-id from round 2 on. Without the acknowledgement
(the client saved c_i / grad_i as soon as it replied) and the key binding, the gaps to
the pooled optimum were 1.5e-2 / 9.4e-3 (lost, NaN), 0.11 / 7.6e-2 (wipe) and 0.20 /
0.13 (impostor; 6.4e-2 / 0.27 on the Message API), SCAFFOLD / FedDyn, against 5.8e-16 /
5.3e-16 without a fault; each test failed then.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from peer_faults import run_legacy, run_message

from flwr_admm.protocol import FEDDYN_STATE_GRAD, SCAFFOLD_STATE_C

PEERS = ["scaffold", "feddyn"]
RUNS = {"legacy": run_legacy, "message": run_message}
FAULT_ROUND = 5


@pytest.fixture(scope="module")
def clean() -> dict[tuple[str, str], float]:
    return {(api, peer): run(peer, {})[1] for api, run in RUNS.items() for peer in PEERS}


@pytest.mark.parametrize("fault", ["lost", "nan", "wipe"])
@pytest.mark.parametrize("peer", PEERS)
@pytest.mark.parametrize("api", list(RUNS))
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


@pytest.mark.parametrize("peer", PEERS)
@pytest.mark.parametrize("api", list(RUNS))
def test_a_node_replying_under_another_nodes_key_is_a_conflict(
    api: str, peer: str, clean: dict[tuple[str, str], Any]
) -> None:
    strategy, gap, _ = RUNS[api](peer, {4: {1: "lost"}}, impostor=True)
    assert abs(gap - clean[api, peer]) < 1e-8
    assert [h["num_key_conflicts"] for h in strategy.history[1:]] == [1] * 119
    assert all(h["num_replies"] == 4 for h in strategy.history)
