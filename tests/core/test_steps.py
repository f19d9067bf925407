"""The blocked dual step (blocks outer, replies inner) against a replies-outer loop.

The reordering keeps z', dz and S_y blocks in cache; it must not change a bit: the
reference below is the replies-outer loop it replaced (numpy, in the same order).
"""

from __future__ import annotations

import numpy as np
import pytest

from flwr_admm.core.kernels import BLOCK, axpy
from flwr_admm.core.steps import dual_step
from flwr_admm.core.sums import RunningSums
from flwr_admm.core.types import ClientRecord, Reply


def reference(ordered, records, z_new, dz, ny, rho, alpha, everyone):
    """y_i += rho_i (alpha (w_i - z') + (1 - alpha) dz) reply by reply; p-weighted sums.

    The same BLAS axpy as the server (daxpy may fuse multiply and add), replies outer.
    """
    total = float(sum(r.num_examples for r in ordered))
    r_sq = y_sq = 0.0
    for reply in ordered:
        record = records[reply.key]
        rho_i, p = rho * record.scale, record.num_examples / total
        to_sum = 0.0 if everyone else record.num_examples * rho_i * alpha
        for y, w, z, acc, shift in zip(record.y, record.w, z_new, ny, dz, strict=True):
            y_flat, acc_flat = y.reshape(-1), acc.reshape(-1)
            w_flat, z_flat, shift_flat = w.reshape(-1), z.reshape(-1), shift.reshape(-1)
            for start in range(0, y_flat.size, BLOCK):
                block = slice(start, min(start + BLOCK, y_flat.size))
                d = w_flat[block] - z_flat[block]
                r_sq += p * float(np.dot(d, d))
                axpy(rho_i * alpha, d, y_flat[block])
                axpy(rho_i * (1 - alpha), shift_flat[block], y_flat[block])
                y_sq += p * float(np.dot(y_flat[block], y_flat[block]))
                axpy(to_sum, d, acc_flat[block])
    return r_sq, y_sq


@pytest.mark.parametrize("alpha", [1.0, 1.6])
@pytest.mark.parametrize("everyone", [True, False])
def test_blocked_dual_step_is_bit_identical_to_the_replies_outer_loop(
    alpha: float, everyone: bool
) -> None:
    rng = np.random.default_rng(0)
    shapes = [(2 * BLOCK + 77,), (5, 3), ()]
    keys = [f"c{i}" for i in range(4)]

    def state() -> tuple[dict[str, ClientRecord], list[np.ndarray]]:
        local = np.random.default_rng(1)
        records = {
            k: ClientRecord(
                [local.normal(size=s) for s in shapes],
                [local.normal(size=s) for s in shapes],
                10 + i,
                scale=1.0 - 0.1 * i,
            )
            for i, k in enumerate(keys)
        }
        return records, [local.normal(size=s) for s in shapes]

    z_new = [rng.normal(size=s) for s in shapes]
    dz = [rng.normal(size=s) for s in shapes]
    replying = keys if everyone else keys[1:3]
    ordered = [Reply(k, [], 10 + keys.index(k)) for k in replying]
    records, ny = state()
    sums = RunningSums([np.zeros(s) for s in shapes], ny)
    stats = dual_step(ordered, records, z_new, dz, sums, dz, 3.0, rho=0.7, relaxation=alpha)
    ref_records, ref_ny = state()
    r_sq, y_sq = reference(ordered, ref_records, z_new, dz, ref_ny, 0.7, alpha, everyone)
    assert stats.r_sq == r_sq and stats.y_sq == y_sq
    for k in keys:
        for got, want in zip(records[k].y, ref_records[k].y, strict=True):
            assert np.array_equal(got, want)
    if not everyone:  # S_y took the replies' terms in the same order (+ the dz term after)
        for acc, want, shift in zip(sums.ny, ref_ny, dz, strict=True):
            axpy(0.7 * (1 - alpha) * 3.0, shift, want)
            assert np.array_equal(acc, want)


def test_the_alignment_comes_from_the_same_pass_and_changes_no_bit() -> None:
    """c_k over tensors of several blocks equals the formula (y_i before the step) to
    1e-12, and asking for it leaves y_i, S_y and the sums bit for bit as without it."""
    shapes = [(2 * BLOCK + 77,), (5, 3)]
    keys = ["c0", "c1", "c2"]

    def state() -> tuple[dict[str, ClientRecord], RunningSums]:
        local = np.random.default_rng(2)
        records = {
            k: ClientRecord(
                [local.normal(size=s) for s in shapes],
                [local.normal(size=s) for s in shapes],
                10 + i,
                scale=1.0 + 0.5 * i,
            )
            for i, k in enumerate(keys)
        }
        return records, RunningSums([np.zeros(s) for s in shapes], [np.zeros(s) for s in shapes])

    rng = np.random.default_rng(3)
    z_new = [rng.normal(size=s) for s in shapes]
    ordered = [Reply(k, [], 10 + i) for i, k in enumerate(keys[:2])]  # c2 not replying
    before, _ = state()
    total = sum(r.num_examples for r in ordered)
    along = res = dual = 0.0
    for reply in ordered:
        rec = before[reply.key]
        p, rho_i = reply.num_examples / total, 0.7 * rec.scale
        d = np.concatenate([(w - z).ravel() for w, z in zip(rec.w, z_new, strict=True)])
        y = np.concatenate([t.ravel() for t in rec.y])
        along, res, dual = along + p * rho_i * d @ y, res + p * rho_i**2 * d @ d, dual + p * y @ y
    runs = []
    for aligned in (False, True):
        records, sums = state()
        stats = dual_step(
            ordered,
            records,
            z_new,
            None,
            sums,
            z_new,
            3.0,
            rho=0.7,
            relaxation=1.0,
            gamma=0.4,
            aligned=aligned,
        )
        runs.append((stats, records, sums))
    (plain, plain_records, plain_sums), (asked, asked_records, asked_sums) = runs
    assert plain.c is None
    assert asked.c == pytest.approx(along / np.sqrt(res * dual), rel=1e-12)
    assert plain[:3] == asked[:3]
    for k in keys:
        for got, want in zip(asked_records[k].y, plain_records[k].y, strict=True):
            assert np.array_equal(got, want)
    for got, want in zip(asked_sums.ny, plain_sums.ny, strict=True):
        assert np.array_equal(got, want)
