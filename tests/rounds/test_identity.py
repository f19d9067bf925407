"""Client identity on its own: `client_key_of`'s canonical keys and `KeyBinding`'s rules.

The strategies that apply them (conflicts, shared keys, eviction) are tested in
tests/server/test_identity.py and tests/serverapp/test_checkpoints_eviction.py.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from flwr_admm.rounds.identity import ABSENT_GRACE, KeyBinding, client_key_of


def test_key_binding_rules() -> None:
    binding = KeyBinding("node")
    binding.connected(["1", "2"])
    assert binding.claim("partition-id:0", "1") == "ok"
    binding.bind("partition-id:0", "1", 1)
    assert binding.claim("partition-id:0", "2") == "conflict"  # bound to a connected node
    assert binding.claim("partition-id:5", "1") == "conflict"  # node 1's second key
    binding.connected(["2", "3"])  # node 1 misses a sampling: it keeps its key
    assert binding.claim("partition-id:0", "3") == "conflict"
    binding.connected(["2", "3"])  # absent twice in a row (> ABSENT_GRACE): it has left
    assert binding.claim("partition-id:0", "3") == "rebind"
    binding.forget(["partition-id:0"])
    assert binding.key_of == {} and binding.node_of == {} and binding.last_seen == {}
    reported = KeyBinding("reported")
    reported.bind("partition-id:0", "1", 1)
    assert reported.claim("partition-id:0", "2") == "ok"
    copy = KeyBinding("node")
    binding.bind("partition-id:1", "2", 4)
    copy.load_state_dict(binding.state_dict())
    assert copy.state_dict() == binding.state_dict()


def test_stale_keys_by_age_then_by_count_ties_in_key_order() -> None:
    binding = KeyBinding("node")
    for key, seen in [("k:10", 5), ("k:2", 5), ("k:3", 1), ("k:4", 6), ("k:1", 5)]:
        binding.bind(key, key, seen)
    assert binding.stale(7, max_age=5, max_clients=None) == ["k:3"]  # 7 - 1 > 5
    assert binding.stale(7, max_age=None, max_clients=2) == ["k:1", "k:2", "k:3"]
    assert binding.stale(7, max_age=5, max_clients=3) == ["k:1", "k:3"]


@pytest.mark.parametrize(
    ("metrics", "key"),
    [
        ({"client-key": 7}, "client-key:7"),
        ({"client-key": "bank a"}, "client-key:bank a"),
        ({"partition-id": np.int64(4)}, "partition-id:4"),
        ({"client-key": "x", "partition-id": 3}, "client-key:x"),
    ],
)
def test_client_keys_of_allowed_values(metrics: dict[str, Any], key: str) -> None:
    assert client_key_of("9", metrics) == key


@pytest.mark.parametrize(
    "metrics",
    [
        {"client-key": ""},
        {"client-key": "a\nb"},
        {"client-key": 10**5000},
        {"client-key": True},
        {"client-key": 1.5},
        {"client-key": b"bytes"},
        {"partition-id": 2**63},
        {"client-key": "x" * 257, "partition-id": 3},  # no silent fallback
    ],
    ids=range(8),
)
def test_client_keys_of_refused_values_name_the_field(metrics: dict[str, Any]) -> None:
    field = "client-key" if "client-key" in metrics else "partition-id"
    with pytest.raises(ValueError, match=field):
        client_key_of("9", metrics)


def test_authenticated_binding_never_hands_a_key_to_another_node() -> None:
    binding = KeyBinding("authenticated")
    binding.connected(["1", "2"])
    binding.bind("partition-id:0", "1", 1)
    assert binding.claim("partition-id:0", "2") == "conflict"
    binding.connected(["2", "3"])  # node 1 is away (under auth it returns as node 1)
    assert binding.claim("partition-id:0", "3") == "conflict"
    binding.connected(["1", "2", "3"])
    assert binding.claim("partition-id:0", "1") == "ok"
    assert binding.owner("partition-id:0") == "1"
    binding.forget(["partition-id:0"])  # evicted as stale: the key is free again
    assert binding.claim("partition-id:0", "3") == "ok"
    with pytest.raises(ValueError, match="key_binding"):
        KeyBinding("auth")


def test_an_owner_absent_within_the_grace_keeps_its_key_and_returns_to_it() -> None:
    """Issue 25, item 2: a node that misses a sampling is not robbed of its key."""
    binding = KeyBinding("node")
    binding.connected(["1", "2"])
    binding.bind("partition-id:0", "1", 1)
    for _ in range(ABSENT_GRACE):
        binding.connected(["2", "3"])
        assert binding.claim("partition-id:0", "3") == "conflict"
    binding.connected(["1", "2", "3"])  # back under its own id
    assert binding.claim("partition-id:0", "1") == "ok"
    assert binding.claim("partition-id:0", "3") == "conflict"


@pytest.mark.parametrize("policy", ["node", "reported"])
def test_keys_of_nodes_that_left_are_stale_by_default(policy: str) -> None:
    """Issue 25, item 3: records of departed nodes are evicted with the defaults."""
    binding = KeyBinding(policy)
    binding.connected(["1", "2"])
    binding.bind("k:1", "1", 1)
    binding.bind("k:2", "2", 1)
    for round_ in range(2, ABSENT_GRACE + 2):
        binding.connected(["2"])
        assert binding.stale(round_, None, None) == []
        binding.bind("k:2", "2", round_)
    binding.connected(["2"])  # absent from ABSENT_GRACE + 1 samplings in a row
    assert binding.stale(ABSENT_GRACE + 2, None, None) == ["k:1"]
    binding.forget(["k:1"])
    assert set(binding.connected_at) == {"2"}  # nothing kept of the node that left


def test_authenticated_keys_are_not_stale_for_being_away() -> None:
    binding = KeyBinding("authenticated")
    binding.connected(["1"])
    binding.bind("k:1", "1", 1)
    for _ in range(3 * ABSENT_GRACE):
        binding.connected(["2"])
    assert binding.stale(3 * ABSENT_GRACE, None, None) == []


def test_node_ids_that_churn_leave_a_bounded_record() -> None:
    binding = KeyBinding("node")
    for round_ in range(1, 201):
        cid = str(1000 + round_)  # a new node id and key every round
        binding.connected(["1", cid])
        for key in binding.stale(round_, None, None):
            binding.forget([key])
        binding.bind(f"k:{cid}", cid, round_)
        binding.bind("k:1", "1", round_)
        assert len(binding.node_of) <= ABSENT_GRACE + 2
    assert len(binding.connected_at) <= ABSENT_GRACE + 2


def test_restored_bindings_move_to_the_first_claimant_once_their_node_is_gone() -> None:
    """After a resume, the checkpoint's node ids may be gone (a new simulation run)."""
    binding = KeyBinding("node")
    binding.connected(["1", "2"])
    binding.bind("k:1", "1", 1)
    binding.bind("k:2", "2", 1)
    restored = KeyBinding("node")
    restored.load_state_dict(binding.state_dict())
    restored.connected(["2", "7", "8"])  # node 1 is gone, node 2 is back
    assert restored.claim("k:1", "7") == "ok"
    assert restored.claim("k:2", "8") == "conflict"  # its node is connected
    restored.bind("k:1", "7", 2)
    assert restored.claim("k:1", "8") == "conflict"  # no longer provisional
