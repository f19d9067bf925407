"""sample_ids: the one seeded draw both APIs use, against a hand-computed draw."""

from __future__ import annotations

from typing import Any

import numpy as np

from flwr_admm.core.types import natural_key
from flwr_admm.rounds import identity as sampling
from flwr_admm.rounds.identity import sample_ids


def test_order_is_client_key_then_id_with_unknown_ids_last() -> None:
    key_of = {"7": "partition-id:10", "3": "partition-id:2"}
    assert sample_ids(["9", "7", "3", "11"], 4, 1, 0, key_of) == ["3", "7", "9", "11"]


def test_seeded_draw_is_numpys_choice_over_that_order() -> None:
    ids = [f"{i}" for i in range(20)]
    picked = sample_ids(ids, 5, 3, 42, {})
    expected = np.sort(np.random.default_rng([42, 3]).choice(20, size=5, replace=False))
    assert picked == [str(i) for i in expected]
    assert sample_ids(ids, 5, 3, 42, {}) == picked  # same seed and round, same sample
    assert sample_ids(ids, 5, 4, 42, {}) != picked  # another round, another sample


def test_integer_node_ids_keep_their_type() -> None:
    picked = sample_ids([5, 1, 3], 2, 1, 0, {})
    assert all(isinstance(i, int) for i in picked) and len(picked) == 2


def test_a_round_parses_no_key_the_previous_round_parsed(monkeypatch: Any) -> None:
    # Ordering 10,000 clients by parsed keys every round cost more than the round
    # (benchmarks/scale.py); each client key and id is parsed once per run instead.
    parsed: list[str] = []

    def counting_natural_key(text: str) -> tuple[object, ...]:
        parsed.append(text)
        return natural_key(text)

    monkeypatch.setattr(sampling, "natural_key", counting_natural_key)
    sampling.sort_key.cache_clear()
    ids = [f"scale-{i}" for i in range(50)]
    key_of = {cid: f"partition-id:{i}" for i, cid in enumerate(ids)}
    first = sample_ids(ids, 5, 1, 0, key_of)
    assert len(parsed) == 2 * len(ids)
    parsed.clear()
    assert sample_ids(ids, 5, 1, 0, key_of) == first
    sample_ids(ids, 5, 2, 0, key_of)
    assert parsed == []
