"""`natural_key` orders client keys naturally and never raises, whatever the key."""

from __future__ import annotations

from flwr_admm.core.types import natural_key


def test_digit_runs_compare_as_numbers() -> None:
    keys = ["partition-id:10", "partition-id:2", "cid:7", "partition-id:1"]
    assert sorted(keys, key=natural_key) == [
        "cid:7",
        "partition-id:1",
        "partition-id:2",
        "partition-id:10",
    ]


def test_any_string_sorts_without_raising() -> None:
    # "a1\u00b2": isdigit() but not int(); 4,301 digits: beyond int()'s digit limit;
    # Arabic-Indic digits: \d but not ASCII. Each raised or mixed int and str before.
    keys = [
        "client-key:a1\u00b2",
        "client-key:" + "9" * 4301,
        "client-key:" + "1" * 31,
        "client-key:" + "2" * 30,
        "client-key:\u0663",
        "client-key:\x00" * 3,
        "client-key:12a",
        "client-key:a12",
        "client-key:",
        "client-key:0012",
    ]
    ordered = sorted(keys, key=natural_key)
    assert sorted(reversed(keys), key=natural_key) == ordered  # a total order
    numeric = [k for k in ordered if k[11:].isascii() and k[11:].isdigit()]
    # short runs by value, then long runs by length
    assert numeric == [
        "client-key:0012",
        "client-key:" + "2" * 30,
        "client-key:" + "1" * 31,
        "client-key:" + "9" * 4301,
    ]
