"""core.tensor_policy: roles from rules and dtypes; TensorSplit's average by hand."""

from __future__ import annotations

import numpy as np
import pytest

from flwr_admm.core.tensor_policy import TensorSplit, check_rules, roles_of

NAMES = [
    "conv.weight",
    "bn.weight",
    "bn.bias",
    "bn.running_mean",
    "bn.running_var",
    "bn.num_batches_tracked",
]
DTYPES = [np.dtype(np.float32)] * 5 + [np.dtype(np.int64)]


def test_default_roles_follow_batchnorm() -> None:
    assert roles_of((), NAMES, DTYPES) == (
        "consensus",
        "consensus",
        "consensus",
        "average",
        "average",
        "keep",
    )


def test_first_matching_rule_wins_over_the_defaults() -> None:
    rules = check_rules({"bn.running_*": "keep", "bn.*": "average", "*num_batches*": "consensus"})
    assert roles_of(rules, NAMES, DTYPES) == (
        "consensus",
        "average",
        "average",
        "keep",
        "keep",
        "average",  # bn.* comes first
    )


@pytest.mark.parametrize("policy", [{"x": "fedavg"}, {"": "keep"}, ["x"]])
def test_bad_policy_is_a_value_error_naming_the_field(policy: object) -> None:
    with pytest.raises(ValueError, match="tensor_policy"):
        check_rules(policy)  # type: ignore[arg-type]


def test_split_averages_by_examples_and_keeps_the_rest() -> None:
    z = [np.zeros(2), np.array([1.0, 1.0]), np.array(5)]
    split = TensorSplit(["consensus", "average", "keep"], z)
    assert not split.trivial and split.shapes == [(2,), (2,), ()]
    split.begin()
    split.absorb([np.ones(2), np.array([2.0, 4.0]), np.array(9)], 1)
    split.absorb([np.ones(2), np.array([5.0, 1.0]), np.array(7)], 3)
    split.finish()
    merged = split.merge([np.array([7.0, 8.0])])
    np.testing.assert_array_equal(merged[0], [7.0, 8.0])
    np.testing.assert_array_equal(merged[1], [(2 + 15) / 4, (4 + 3) / 4])  # sum n x / sum n
    assert merged[2].shape == () and merged[2] == 5  # never changed
    split.begin()
    split.finish()  # a round without replies leaves them as they were
    np.testing.assert_array_equal(split.merge([np.zeros(2)])[1], merged[1])
    assert split.consensus(merged)[0] is merged[0]


def test_a_split_of_consensus_tensors_only_is_the_identity() -> None:
    z = [np.zeros(2), np.ones(3)]
    split = TensorSplit(["consensus", "consensus"], z)
    assert split.trivial and split.merge(z) is z
