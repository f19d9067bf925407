"""Reading a node's fit config (`flwr_admm.node.config`): rho, the round, flags, spellings."""

from __future__ import annotations

import pytest

from flwr_admm.node.config import flag, legacy_config, read_rho, server_round_of


def test_rho_is_rho_else_proximal_mu_else_zero() -> None:
    assert read_rho({"rho": 0.2, "proximal-mu": 0.9}) == 0.2
    assert read_rho({"proximal-mu": 0.9}) == 0.9
    assert read_rho({}) == 0.0
    for bad in (-1.0, float("nan"), "0.1", True):
        with pytest.raises(ValueError, match="rho"):
            read_rho({"rho": bad})
    assert read_rho({"proximal_mu": 0.4, "proximal-mu": 0.9}) == 0.4  # legacy spelling first


def test_the_round_is_an_integer_in_either_spelling() -> None:
    assert server_round_of({"server_round": 3, "server-round": 9}) == 3
    assert server_round_of({"server-round": 9}) == 9
    for bad in ({}, {"server_round": 2.0}, {"server-round": True}):
        assert server_round_of(bad) is None


def test_flags_are_zero_or_one() -> None:
    assert flag({"admm-rebuild": 1}, "admm-rebuild") and not flag({}, "admm-rebuild")
    for bad in (2, True, "1"):
        with pytest.raises(ValueError, match=r"^admm-rebuild: must be 0 or 1"):
            flag({"admm-rebuild": bad}, "admm-rebuild")


def test_legacy_spellings_are_added_and_never_overwrite() -> None:
    config = legacy_config({"server-round": 4, "proximal-mu": 0.5, "proximal_mu": 0.1})
    assert config == {
        "server-round": 4,
        "proximal-mu": 0.5,
        "proximal_mu": 0.1,
        "server_round": 4,
    }
