"""The fused numba kernels against the numpy path, their determinism and the backend choice.

Both backends run the same iteration; they differ in rounding only (numba sums
squares in 64 lanes, numpy's BLAS in its own order and may fuse multiply-adds), so
every state array and residual must agree to ~1e-12 relative over several rounds.
"""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import numpy as np
import pytest

from flwr_admm import ConsensusADMM, Reply, ResidualBalancing
from flwr_admm.core import backend
from flwr_admm.core.backend import FUSED_BLOCK
from flwr_admm.core.consensus import NonFiniteReplyError
from flwr_admm.core.settings import ConsensusSettings

pytest.importorskip("numba")

# A fused block and a tail that is not a multiple of the 64 lanes, a matrix, a scalar
SHAPES = [(FUSED_BLOCK + 77,), (7, 3), ()]
SCENARIOS: dict[str, dict[str, Any]] = {
    "plain": {"rho": 1.0},
    "relaxed": {"rho": 1.0, "relaxation": 1.6},
    "residual-balancing": {"rho": 0.3, "schedule": ResidualBalancing(mu=1.5)},
    "data_size": {"rho": 0.5, "client_rho": "data_size"},
    "defaults": {
        "rho": 1.0,
        "acceleration": "nesterov",
        "relaxation": 1.6,
        "schedule": ResidualBalancing(),
    },
    "defaults, z over the replies": {
        "rho": 1.0,
        "acceleration": "nesterov",
        "relaxation": 1.6,
        "schedule": ResidualBalancing(),
        "z_average": "replies",
    },
}


@pytest.fixture(scope="module")
def compiled() -> backend.FusedKernels:
    """Compile (or load from numba's cache) the kernels once for this module."""
    return backend.compiled()


def replies_for(admm: ConsensusADMM, rng: np.random.Generator, chosen: list[int]) -> list[Reply]:
    """Local models pulled halfway from each client's center to its own target, plus noise."""
    replies = []
    for i in chosen:
        center = admm.center(f"c{i}")
        w = [0.5 * c + 0.2 * (i + 1) + 0.05 * rng.normal(size=np.shape(c)) for c in center]
        replies.append(Reply(f"c{i}", w, 10 + i))
    return replies


def run_pair(
    settings: dict[str, Any], partial: bool, rounds: int = 6
) -> tuple[Any, Any, list[Any]]:
    """Run numpy and numba servers in lockstep on the same replies; return both and reports."""
    admms = [
        ConsensusADMM([np.zeros(s) for s in SHAPES], **settings, kernels=kernels)
        for kernels in ("numpy", "numba")
    ]
    rng = np.random.default_rng(3)
    reports = []
    for k in range(rounds):
        chosen = sorted(rng.choice(6, 3, replace=False)) if partial and k > 0 else list(range(6))
        replies = replies_for(admms[0], rng, chosen)  # both get the identical replies
        reports.append([admm.step(replies, k + 1) for admm in admms])
    return admms[0], admms[1], reports


def assert_close(got: list[np.ndarray], want: list[np.ndarray], what: str) -> None:
    for a, b in zip(got, want, strict=True):
        scale = max(1.0, float(np.max(np.abs(b))))
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-12 * scale, err_msg=what)


@pytest.mark.parametrize("partial", [False, True], ids=["full", "partial"])
@pytest.mark.parametrize("name", list(SCENARIOS))
def test_numba_matches_numpy_on_every_state_array(
    compiled: backend.FusedKernels, name: str, partial: bool
) -> None:
    numpy_admm, numba_admm, reports = run_pair(SCENARIOS[name], partial)
    assert numba_admm._fused and not numpy_admm._fused
    assert_close(numba_admm.z, numpy_admm.z, "z")
    assert_close(numba_admm.sums.nsw, numpy_admm.sums.nsw, "S_w")
    assert_close(numba_admm.sums.ny, numpy_admm.sums.ny, "S_y")
    assert numba_admm.records.keys() == numpy_admm.records.keys()
    for key, record in numpy_admm.records.items():
        assert_close(numba_admm.records[key].y, record.y, f"y[{key}]")
        assert_close(numba_admm.records[key].w, record.w, f"w[{key}]")
    if numpy_admm.fast is not None:
        assert numba_admm.fast is not None and numba_admm.fast.a == numpy_admm.fast.a
        for key, prev in numpy_admm.fast.y_prev.items():
            assert_close(numba_admm.fast.y_prev[key], prev, f"y_prev[{key}]")
    for want, got in reports:
        for field in ("primal_residual", "dual_residual", "dual_scale", "primal_scale", "rho"):
            assert getattr(got, field) == pytest.approx(getattr(want, field), rel=1e-12), field
    # and it did not agree by doing nothing: the duals moved, bits differ somewhere
    assert any(np.any(y != 0) for r in numba_admm.records.values() for y in r.y)


def state_bytes(admm: ConsensusADMM) -> bytes:
    parts = [*admm.z, *admm.sums.nsw, *admm.sums.ny]
    for key in sorted(admm.records):
        parts += [*admm.records[key].w, *admm.records[key].y]
    return b"".join(np.ascontiguousarray(t).tobytes() for t in parts)


def test_numba_is_bit_identical_run_to_run(compiled: backend.FusedKernels) -> None:
    first = run_pair(SCENARIOS["defaults"], partial=True)[1]
    second = run_pair(SCENARIOS["defaults"], partial=True)[1]
    assert state_bytes(first) == state_bytes(second)


def test_float32_state_stays_on_the_numpy_path(compiled: backend.FusedKernels) -> None:
    settings = {**SCENARIOS["defaults"], "state_dtype": "float32"}
    numpy_admm, numba_admm, _ = run_pair(settings, partial=True, rounds=3)
    assert state_bytes(numba_admm) == state_bytes(numpy_admm)


@pytest.mark.parametrize("keys", [["a", "b", "c"], ["a", "c"]], ids=["full", "incremental"])
@pytest.mark.parametrize("bad", [np.nan, np.inf, 1e200])
def test_numba_refuses_a_non_finite_reply_and_leaves_the_state_as_it_was(
    compiled: backend.FusedKernels, keys: list[str], bad: float
) -> None:
    rng = np.random.default_rng(11)
    shapes = [(FUSED_BLOCK + 5,), (3,)]
    models = {k: [rng.normal(size=s) for s in shapes] for k in "abc"}
    sizes = {"a": 4, "b": 9, "c": 6}
    twins = [
        ConsensusADMM([np.zeros(s) for s in shapes], rho=0.7, kernels="numba") for _ in range(2)
    ]
    for admm in twins:  # round 1: everyone, so round 2 is "full" or "incremental"
        admm.step([Reply(k, models[k], n) for k, n in sizes.items()], 1)
    fresh = {k: [t + rng.normal(size=t.shape) for t in models[k]] for k in keys}
    poisoned_key = "b" if "b" in keys else "c"
    poisoned = [t.copy() for t in fresh[poisoned_key]]
    poisoned[0][FUSED_BLOCK + 1] = bad  # near the end: most of S_w is folded already
    for index, admm in enumerate(twins):
        admm.begin(keys)
        for key in keys:
            if key == poisoned_key and index == 0:
                before = state_bytes(admm)
                with pytest.raises(NonFiniteReplyError, match=rf"^reply '{key}': contains NaN"):
                    admm.absorb(Reply(key, poisoned, sizes[key] + 1))
                assert admm.records[key].num_examples == sizes[key]
                if keys == ["a", "b", "c"]:  # "full": re-summed in order, bit for bit
                    assert state_bytes(admm) == before
            elif key != poisoned_key:
                admm.absorb(Reply(key, fresh[key], sizes[key]))
        admm.finish(2)
    first, second = twins
    assert_close(first.z, second.z, "z")
    for key in "abc":
        assert_close(first.records[key].y, second.records[key].y, f"y[{key}]")
    if keys == ["a", "b", "c"]:
        assert state_bytes(first) == state_bytes(second)


@pytest.mark.parametrize("bad", ["fast", "NUMBA", "", None, 1])
def test_bad_kernels_names_the_field_and_the_choices(bad: object) -> None:
    pattern = r"^kernels: must be one of \['auto', 'numpy', 'numba'\]"
    with pytest.raises(ValueError, match=pattern):
        ConsensusADMM([np.zeros(2)], rho=1.0, kernels=bad)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=pattern):
        ConsensusSettings(kernels=bad)  # type: ignore[arg-type]


def test_both_fedadmm_apis_take_kernels() -> None:
    from flwr_admm import FedADMM
    from flwr_admm.serverapp import FedADMM as MessageFedADMM

    for strategy in (FedADMM, MessageFedADMM):
        assert strategy(kernels="numpy").admm_settings.kernels == "numpy"
        with pytest.raises(ValueError, match=r"^kernels: must be one of"):
            strategy(kernels="fused")  # type: ignore[arg-type]
    # the backend is not part of the checkpoint fingerprint
    assert FedADMM(kernels="numpy").fingerprint() == FedADMM(kernels="numba").fingerprint()


def test_numba_without_numba_is_refused_and_auto_falls_back(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(backend, "numba_installed", lambda: False)
    with pytest.raises(ValueError, match=r"^kernels: 'numba' needs numba .*'auto', 'numpy'"):
        ConsensusADMM([np.zeros(2)], rho=1.0, kernels="numba")
    assert not ConsensusADMM([np.zeros(2)], rho=1.0, kernels="auto")._fused
    monkeypatch.undo()
    assert ConsensusADMM([np.zeros(2)], rho=1.0, kernels="auto")._fused


def test_importing_flwr_admm_does_not_import_numba() -> None:
    code = (
        "import sys, numpy as np\n"
        "import flwr_admm\n"
        "from flwr_admm import ConsensusADMM, FedADMM\n"
        "FedADMM(); ConsensusADMM([np.zeros(2)], rho=1.0)\n"
        "assert 'numba' not in sys.modules, 'numba imported'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
