"""state_dtype="float32": w_i, y_i (and fast ADMM's y_i,prev) stored in float32.

The optimum must be the pooled ridge solution up to float32 rounding, under every
S_w / S_y bookkeeping mode (full, incremental, recompute) and with fast ADMM; the
running sums must keep matching the stored values; checkpoints round-trip.
"""

from __future__ import annotations

import numpy as np
import pytest
from consensus_reference import clients, pooled_ridge, rel, ridge_round

from flwr_admm import ConsensusADMM
from flwr_admm.core import Reply, ResidualBalancing
from flwr_admm.core.consensus import NonFiniteReplyError
from flwr_admm.core.settings import ConsensusSettings

LAM, SIZES, D = 0.1, [20, 35, 80, 50, 41, 66], 5

SETTINGS = {
    "plain": {"rho": 1.0},
    "relaxed-RB": {"rho": 1.0, "relaxation": 1.6, "schedule": ResidualBalancing()},
    "data_size": {"rho": 1.0, "client_rho": "data_size"},
    "defaults": {
        "rho": 1.0,
        "acceleration": "nesterov",
        "relaxation": 1.6,
        "schedule": ResidualBalancing(),
    },
}


def _run(settings: dict, state_dtype: str, partial: bool, rounds: int) -> ConsensusADMM:
    data = clients(SIZES, d=D, seed=3)
    admm = ConsensusADMM([np.zeros(D)], state_dtype=state_dtype, **settings)
    rng = np.random.default_rng(0)
    for k in range(1, rounds + 1):
        chosen = sorted(rng.choice(6, 3, replace=False)) if partial else range(6)
        ridge_round(admm, data, LAM, [f"c{i}" for i in chosen], k)
    return admm


@pytest.mark.parametrize("name", sorted(SETTINGS))
@pytest.mark.parametrize("partial", [False, True])
def test_float32_state_reaches_the_pooled_ridge_optimum(name: str, partial: bool) -> None:
    optimum = pooled_ridge(clients(SIZES, d=D, seed=3), LAM)
    rounds = 900 if partial else 600
    wide = _run(SETTINGS[name], "float64", partial, rounds)
    compact = _run(SETTINGS[name], "float32", partial, rounds)
    assert rel(wide.z[0], optimum) < 1e-9  # the reference run converged
    assert rel(compact.z[0], optimum) < 1e-6
    for record in compact.records.values():
        assert record.w[0].dtype == np.float32 and record.y[0].dtype == np.float32
    assert compact.z[0].dtype == np.float64
    if compact.fast is not None:
        assert all(p[0].dtype == np.float32 for p in compact.fast.y_prev.values())


@pytest.mark.parametrize("name", sorted(SETTINGS))
def test_float32_sums_match_the_stored_state(name: str) -> None:
    """S_w = sum n_i s_i w_i and S_y = sum n_i y_i over the stored float32 values."""
    admm = _run(SETTINGS[name], "float32", partial=True, rounds=40)
    records = admm.records.values()
    s_w = sum(r.num_examples * r.scale * r.w[0].astype(np.float64) for r in records)
    s_y = sum(r.num_examples * r.y[0].astype(np.float64) for r in records)
    assert np.allclose(admm.sums.nsw[0], s_w, rtol=1e-12, atol=1e-12 * np.abs(s_w).max())
    scale = sum(r.num_examples * np.abs(r.y[0].astype(np.float64)) for r in records).max()
    assert np.abs(admm.sums.ny[0] - s_y).max() < 1e-13 * scale  # float32 drift: ~1e-8


def test_float32_checkpoint_round_trip_is_exact() -> None:
    settings = SETTINGS["defaults"]
    admm = _run(settings, "float32", partial=True, rounds=7)
    arrays, meta = admm.state_dict()
    saved = {k: np.array(v) for k, v in arrays.items()}
    assert saved["w.0.0"].dtype == np.float32 and saved["y.0.0"].dtype == np.float32
    resumed = ConsensusADMM([np.zeros(D)], state_dtype="float32", **settings)
    resumed.load_state_dict(saved, meta)
    data = clients(SIZES, d=D, seed=3)
    for k in range(8, 12):
        keys = ["c0", "c2", "c5"]
        ridge_round(admm, data, LAM, keys, k)
        ridge_round(resumed, data, LAM, keys, k)
    assert np.array_equal(admm.z[0], resumed.z[0])
    for key, record in admm.records.items():
        assert resumed.records[key].y[0].dtype == np.float32
        assert np.array_equal(record.y[0], resumed.records[key].y[0])


@pytest.mark.parametrize("bad", ["float16", "f4", np.float32, None, 32])
def test_bad_state_dtype_names_the_field_and_the_choices(bad: object) -> None:
    with pytest.raises(ValueError, match=r"state_dtype: must be one of \['float64', 'float32'\]"):
        ConsensusADMM([np.zeros(2)], rho=1.0, state_dtype=bad)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="state_dtype"):
        ConsensusSettings(state_dtype=bad)  # type: ignore[arg-type]


@pytest.mark.parametrize("client_rho", ["uniform", "data_size"])
def test_float32_refuses_replies_beyond_float32_range(client_rho: str) -> None:
    admm = ConsensusADMM([np.zeros(3)], rho=1.0, client_rho=client_rho, state_dtype="float32")
    admm.step([Reply("a", [np.ones(3)], 5), Reply("b", [np.ones(3)], 5)], 1)
    z = [t.copy() for t in admm.z]
    with pytest.raises(NonFiniteReplyError):
        admm.step([Reply("a", [np.array([1.0, 1e39, 0.0])], 5)], 2)
    assert np.array_equal(admm.z[0], z[0])


def test_float32_halves_the_cached_state() -> None:
    wide = _run(SETTINGS["defaults"], "float64", partial=False, rounds=3)
    compact = _run(SETTINGS["defaults"], "float32", partial=False, rounds=3)

    def state_bytes(admm: ConsensusADMM) -> int:
        assert admm.fast is not None
        held = sum(t.nbytes for r in admm.records.values() for t in r.w + r.y)
        return held + sum(t.nbytes for p in admm.fast.y_prev.values() for t in p)

    assert state_bytes(compact) * 2 == state_bytes(wide)
