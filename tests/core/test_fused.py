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

from flwr_admm import ConsensusADMM
from flwr_admm.core import Reply, ResidualBalancing, backend
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
    from flwr_admm.server import FedADMM
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


# ------------------------------------------------------------- the batch fold
def spy_on_batches(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Count the replies of every blocks-outer fold (`intake.fold_all`) from now on."""
    from flwr_admm.core import intake

    sizes: list[int] = []
    real = intake.fold_all

    def spy(sums: Any, pending: Any, shares: Any) -> list[float]:
        sizes.append(len(pending))
        return real(sums, pending, shares)

    monkeypatch.setattr(intake, "fold_all", spy)
    return sizes


def one_by_one(admm: ConsensusADMM, replies: list[Reply], server_round: int) -> Any:
    """`step` without `absorb_all`: begin, absorb each reply in order, finish."""
    admm.begin([r.key for r in replies])
    for reply in replies:
        admm.absorb(reply)
    return admm.finish(server_round)


@pytest.mark.parametrize("partial", [False, True], ids=["full", "partial"])
@pytest.mark.parametrize("name", ["plain", "relaxed", "defaults", "defaults, z over the replies"])
def test_the_batch_fold_gives_the_bits_of_absorbing_one_reply_after_the_other(
    compiled: backend.FusedKernels, monkeypatch: pytest.MonkeyPatch, name: str, partial: bool
) -> None:
    batched, single = (
        ConsensusADMM([np.zeros(s) for s in SHAPES], **SCENARIOS[name], kernels="numba")
        for _ in range(2)
    )
    sizes = spy_on_batches(monkeypatch)
    rng = np.random.default_rng(5)
    for k in range(5):
        chosen = sorted(rng.choice(6, 3, replace=False)) if partial and k > 0 else list(range(6))
        replies = replies_for(batched, rng, chosen)
        want = one_by_one(single, replies, k + 1)
        got = batched.step(replies, k + 1)
        assert got == want  # every residual, scale and rho, bit for bit
        assert state_bytes(batched) == state_bytes(single)
    assert sizes[-1] == (3 if partial else 6)  # the step took the batch path


def poisoned_round(bad: float, position: int, keys: str) -> tuple[ConsensusADMM, list[Reply]]:
    """A numba server after a round of a..d, and fresh replies of `keys`, one poisoned."""
    rng = np.random.default_rng(17)
    shapes = [(2 * FUSED_BLOCK + 9,), (3,)]
    admm = ConsensusADMM([np.zeros(s) for s in shapes], rho=0.7, relaxation=1.5, kernels="numba")
    admm.step(
        [Reply(k, [rng.normal(size=s) for s in shapes], 3 + i) for i, k in enumerate("abcd")], 1
    )
    replies = [Reply(k, [rng.normal(size=s) for s in shapes], 5 + i) for i, k in enumerate(keys)]
    replies[position].w[0][FUSED_BLOCK + 3] = bad  # in the second block: the first is folded
    return admm, replies


@pytest.mark.parametrize("keys", ["abcd", "abd"], ids=["full", "incremental"])
@pytest.mark.parametrize("position", [0, 1, -1], ids=["first", "middle", "last"])
@pytest.mark.parametrize("bad", [np.nan, -np.inf, 1e200])
def test_a_bad_reply_in_a_batch_is_refused_as_absorb_refuses_it(
    compiled: backend.FusedKernels,
    monkeypatch: pytest.MonkeyPatch,
    keys: str,
    position: int,
    bad: float,
) -> None:
    batched, replies = poisoned_round(bad, position, keys)
    single, _ = poisoned_round(bad, position, keys)
    never, _ = poisoned_round(bad, position, keys)
    poisoned = replies[position]
    old = batched.records[poisoned.key]
    old_w, old_y, old_n = list(old.w), [t.copy() for t in old.y], old.num_examples
    sizes = spy_on_batches(monkeypatch)
    batched.begin(list(keys))
    assert batched.absorb_all(replies) == [poisoned.key]
    assert sizes[0] == len(keys)  # the batch path, then the rest after the bad reply
    single.begin(list(keys))
    for reply in replies:  # the existing one-by-one behaviour, refusal included
        if reply is poisoned:
            with pytest.raises(NonFiniteReplyError, match=rf"^reply '{reply.key}': contains NaN"):
                single.absorb(reply)
        else:
            single.absorb(reply)
    never.begin(list(keys))
    for reply in replies:
        if reply is not poisoned:
            never.absorb(reply)
    # the refused client's state is untouched: its old w_i (the same arrays), y_i, n_i
    record = batched.records[poisoned.key]
    assert all(a is b for a, b in zip(record.w, old_w, strict=True))
    assert record.num_examples == old_n
    assert all(np.array_equal(a, b) for a, b in zip(record.y, old_y, strict=True))
    assert poisoned.key not in batched._round.keys  # type: ignore[union-attr]
    assert state_bytes(batched) == state_bytes(single)  # S_w, R, S_s, N as absorb leaves them
    assert batched.sums.ns == single.sums.ns and batched.sums.n == single.sums.n
    shares = batched._round.shares  # type: ignore[union-attr]
    if shares is not None:
        assert all(np.array_equal(a, b) for a, b in zip(shares, single._round.shares, strict=True))  # type: ignore[union-attr]
    reports = [admm.finish(2) for admm in (batched, single, never)]
    assert reports[0] == reports[1]
    assert state_bytes(batched) == state_bytes(single)
    assert reports[0].num_replies == len(keys) - 1
    if keys == "abcd":  # "full": as if the bad reply had never arrived, bit for bit
        assert state_bytes(batched) == state_bytes(never) and reports[0] == reports[2]
    else:  # "incremental": S_w re-summed exactly in key order, so equal to rounding
        assert_close(batched.z, never.z, "z")
        for key in "abcd":
            assert_close(batched.records[key].y, never.records[key].y, f"y[{key}]")


def test_two_bad_replies_and_a_batch_of_bad_replies_only(compiled: backend.FusedKernels) -> None:
    batched, replies = poisoned_round(np.nan, 0, "abcd")
    replies[2].w[1][0] = np.inf
    batched.begin(list("abcd"))
    assert batched.absorb_all(replies) == ["a", "c"]
    assert batched._round is not None and sorted(batched._round.keys) == ["b", "d"]
    everyone_bad, replies = poisoned_round(np.nan, 0, "ab")
    single, _ = poisoned_round(np.nan, 0, "ab")
    replies[1].w[0][0] = np.nan
    for admm in (everyone_bad, single):
        admm.begin(["a", "b"])
    assert everyone_bad.absorb_all(replies) == ["a", "b"]
    for reply in replies:
        with pytest.raises(NonFiniteReplyError):
            single.absorb(reply)
    # "incremental": S_w re-summed exactly over the records, as absorb's roll-back does
    assert state_bytes(everyone_bad) == state_bytes(single)
    everyone_bad.cancel()  # nothing absorbed: the round closes


def test_replies_that_need_a_conversion_are_folded_one_at_a_time(
    compiled: backend.FusedKernels, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A float32 (or strided) reply would be widened into a new array: no batch of copies."""
    admm = ConsensusADMM([np.zeros(s) for s in SHAPES], rho=1.0, kernels="numba")
    sizes = spy_on_batches(monkeypatch)
    rng = np.random.default_rng(2)
    replies = [Reply(f"c{i}", [rng.normal(size=s) for s in SHAPES], 4) for i in range(3)]
    admm.step(replies, 1)
    assert sizes == [3]
    narrow = [Reply(r.key, [t.astype(np.float32) for t in r.w], 4) for r in replies]
    admm.step(narrow, 2)
    strided = [
        Reply(r.key, [np.repeat(t, 2)[::2].reshape(t.shape) for t in r.w], 4) for r in replies
    ]
    admm.step(strided, 3)
    assert sizes == [3]


@pytest.mark.parametrize("relaxation", [1.0, 1.6])
def test_the_fused_z_step_returns_the_norms_of_z_and_dz(
    compiled: backend.FusedKernels, relaxation: float
) -> None:
    from flwr_admm.core.steps import sum_sq_norm, z_step

    admm = ConsensusADMM([np.zeros(s) for s in SHAPES], rho=0.8, relaxation=relaxation)
    rng = np.random.default_rng(9)
    for k in range(2):  # duals that are not zero, S_y too
        admm.step(
            [Reply(f"c{i}", [rng.normal(size=s) for s in SHAPES], 3 + i) for i in range(4)], k
        )
    shares = [3.0 * t for t in admm.sums.nsw]
    z = [t + 0.5 for t in admm.z]
    kwargs = {"rho": 0.8, "relaxation": relaxation, "regularizer": None}
    z_new, dz, norms = z_step(admm.sums, shares, 7.0, z, **kwargs, fused=True)
    want_z, want_dz, none = z_step(admm.sums, shares, 7.0, z, **kwargs, fused=False)
    assert none is None and norms is not None
    assert_close(z_new, want_z, "z'")
    if relaxation == 1.0:  # nothing reads z - z' (no relaxed term): the pass stores none
        assert dz is None
    else:
        assert dz is not None
        assert_close(dz, want_dz, "dz")
    assert norms[0] == pytest.approx(sum_sq_norm(want_z), rel=1e-13)
    assert norms[1] == pytest.approx(sum_sq_norm(want_dz), rel=1e-13)
    assert norms[1] > 0.0
