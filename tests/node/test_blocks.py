"""The second block a round sends next to the model (`flwr_admm.node.blocks`), by hand."""

from __future__ import annotations

import numpy as np
import pytest

from flwr_admm.node.blocks import companion, split


def test_each_protocol_names_its_block() -> None:
    assert companion({}) is None and companion({"rho": 0.1}) is None
    assert companion({"rho": 0.1, "admm-start": 1}) == "admm-start"  # z after v_i
    assert companion({"admm-form": "linearized"}) == "admm-dual"  # y_i after z
    assert companion({"admm-duals": "client", "admm-form": "linearized"}) is None  # u_i kept
    assert companion({"admm-duals": "client"}) is None  # nothing follows z^k
    assert companion({"peer-algorithm": "scaffold"}) == "scaffold-control"
    assert companion({"peer-algorithm": "feddyn", "feddyn-alpha": 1.0}) is None


def test_split_takes_the_second_block_off_the_legacy_parameters() -> None:
    v = [np.ones(2, dtype=np.float32), np.array(3)]
    z = [np.zeros(2), np.array(-1.0)]
    first, second = split([*v, *z], {"rho": 0.1, "admm-start": 1}, ["w", "b"])
    assert second is not None
    for got, expected in zip([*first, *second], [*v, *z], strict=True):
        assert got.dtype == np.float64 and got.shape == np.shape(expected)
        np.testing.assert_array_equal(got, expected)
    alone, none = split(v, {"rho": 0.1}, ["w", "b"])
    assert none is None and [a.tolist() for a in alone] == [[1.0, 1.0], 3.0]


def test_split_names_what_was_expected() -> None:
    v = [np.ones(2), np.array(3.0)]
    with pytest.raises(ValueError, match=r"^parameters: expected 2 tensors \['w', 'b'\], got 1"):
        split(v[:1], {}, ["w", "b"])
    with pytest.raises(
        ValueError, match=r"^parameters: SCAFFOLD sends x, then c: expected 4 tensors"
    ):
        split(v, {"peer-algorithm": "scaffold"}, ["w", "b"])
    with pytest.raises(ValueError, match=r"^parameters: 'w' must have shape \(2,\) in both"):
        split([*v, np.ones(3), np.array(0.0)], {"admm-form": "linearized"}, ["w", "b"])
