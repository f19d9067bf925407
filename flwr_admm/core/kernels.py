"""One-pass in-place array kernels for the server's hot loop.

numpy's ``y += a * x`` makes two passes and a temporary; BLAS ``daxpy`` makes one pass
and none. Elementwise, so the result does not depend on BLAS threading. The server's
many short BLAS calls run under `single_thread_blas()`: waking a BLAS thread pool for
every call costs milliseconds on a busy machine.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from functools import cache

import numpy as np
from numpy.typing import NDArray
from scipy.linalg.blas import daxpy
from threadpoolctl import ThreadpoolController

BLOCK = 1 << 17  # elements per block: 1 MiB per array, a few of them fit in L2


@cache
def _controller() -> ThreadpoolController:
    return ThreadpoolController()


@contextmanager
def single_thread_blas() -> Iterator[None]:
    """Limit BLAS to one thread inside the block."""
    with _controller().limit(limits=1, user_api="blas"):
        yield


def axpy(a: float, x: NDArray[np.floating], y: NDArray[np.floating]) -> None:
    """Y += a x, in place: BLAS daxpy for float64 C-contiguous arrays, numpy otherwise."""
    if a == 0.0 or y.size == 0:
        return
    if (
        x.dtype == np.float64
        and y.dtype == np.float64
        and x.flags.c_contiguous
        and y.flags.c_contiguous
        and y.flags.writeable
    ):
        flat = y.reshape(-1)
        out = daxpy(x.reshape(-1), flat, a=a)
        if not np.may_share_memory(out, flat):  # BLAS wrapper copied: write back
            flat[...] = out
        return
    y += a * x


def blocks(size: int, block: int = BLOCK) -> Iterator[slice]:
    """Slices [0, block), [block, 2 block), ... covering range(size)."""
    for start in range(0, size, block):
        yield slice(start, min(start + block, size))


def fold_in(
    acc: NDArray[np.float64],
    a: float,
    x: NDArray[np.float64],
    b: float = 0.0,
    x_old: NDArray[np.float64] | None = None,
    acc2: NDArray[np.float64] | None = None,
) -> float:
    """Acc += a x - b x_old (and acc2 += a x) block by block; returns ||x||^2.

    Each block of x is read from memory once for all of them; the result is inf or
    NaN when x is not finite (acc, acc2 are then spoilt: the caller rebuilds them).
    """
    acc_flat, x_flat = acc.reshape(-1), x.reshape(-1)
    old_flat = None if x_old is None else x_old.reshape(-1)
    acc2_flat = None if acc2 is None else acc2.reshape(-1)
    total = 0.0
    with np.errstate(over="ignore", invalid="ignore"):
        for block in blocks(acc_flat.size):
            x_block, acc_block = x_flat[block], acc_flat[block]
            total += float(np.dot(x_block, x_block))
            if old_flat is not None:
                axpy(-b, old_flat[block], acc_block)
            axpy(a, x_block, acc_block)
            if acc2_flat is not None:
                axpy(a, x_block, acc2_flat[block])
    return total


def finite_sq_norm(arrays: Sequence[NDArray[np.generic]]) -> float | None:
    """Sum ||a||^2 over `arrays` in one pass each; None unless it is finite.

    None flags NaN/inf entries, and also entries so large (|a| > ~1e154) that their
    squared norm overflows float64: the server's residuals could not be computed.
    """
    total = 0.0
    for a in arrays:
        flat = np.asarray(a, dtype=np.float64).reshape(-1)
        with np.errstate(over="ignore", invalid="ignore"):
            total += float(np.dot(flat, flat))
    return total if math.isfinite(total) else None
