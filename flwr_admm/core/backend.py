"""The server's array kernels: numpy (always there) or numba's fused one-pass kernels.

``kernels="auto"`` takes numba when it is installed (``pip install "flwr-admm[fast]"``),
``"numpy"`` never, ``"numba"`` always (a ValueError without numba). Both compute the
same iteration; they differ in rounding only (~1e-16 relative per operation, see
`flwr_admm.core.fused`), and each is deterministic. numba is imported, and the
kernels compiled (or loaded from numba's on-disk cache), at the first use, not when
flwr_admm is imported. Only float64 C-contiguous arrays go to numba: float32 state
and other layouts take the numpy path whatever the choice.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from functools import cache
from typing import NamedTuple

import numpy as np
from numpy.typing import NDArray

from flwr_admm.core.types import Kernels

__all__ = [
    "FUSED_BLOCK",
    "KERNELS",
    "FusedKernels",
    "Kernels",
    "check_kernels",
    "compiled",
    "fusable",
]

KERNELS = ("auto", "numpy", "numba")
# values per block when the fused kernels run blocks outer, replies inner: the blocks
# of the sums (and z', dz) stay in cache, 1 MiB per array. Measured at 1e6 x 10 of 100:
# 2^15 (in L2) was slower, each call's dispatch (~1 us) outweighing the cache hits.
FUSED_BLOCK = 1 << 17


class FusedKernels(NamedTuple):
    """The compiled kernels of `flwr_admm.core.fused` (same signatures)."""

    fold: Callable[..., float]
    dual: Callable[..., tuple[float, float]]
    shift: Callable[..., None]
    center: Callable[..., tuple[float, float]]


def numba_installed() -> bool:
    """Return whether numba can be imported (without importing it)."""
    return importlib.util.find_spec("numba") is not None


def check_kernels(kernels: object) -> bool:
    """Return whether `kernels` selects the fused numba kernels.

    Raises ValueError unless `kernels` is one of KERNELS, and for "numba" when numba
    is not installed.
    """
    if not isinstance(kernels, str) or kernels not in KERNELS:
        raise ValueError(f"kernels: must be one of {list(KERNELS)}, got {kernels!r}")
    if kernels == "numba" and not numba_installed():
        raise ValueError(
            "kernels: 'numba' needs numba (pip install \"flwr-admm[fast]\"); "
            f"use one of {list(KERNELS)} without it ('auto' falls back to numpy)"
        )
    return kernels == "numba" or (kernels == "auto" and numba_installed())


@cache
def compiled() -> FusedKernels:
    """Return the fused kernels compiled by numba (cached on disk; fastmath off)."""
    from numba import njit

    from flwr_admm.core import fused

    jit = njit(cache=True, nogil=True, fastmath=False, boundscheck=False)
    return FusedKernels(
        fold=jit(fused.fold),
        dual=jit(fused.dual),
        shift=jit(fused.shift),
        center=jit(fused.center),
    )


def fusable(*arrays: NDArray[np.generic] | None) -> bool:
    """Return whether every array given is float64 and C-contiguous (None is skipped)."""
    return all(a.dtype == np.float64 and a.flags.c_contiguous for a in arrays if a is not None)
