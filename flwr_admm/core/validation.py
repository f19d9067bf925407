"""Checks a client reply must pass before it may touch the server state."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from numpy.typing import NDArray

from flwr_admm.core.kernels import finite_sq_norm


def reply_problem(
    arrays: Sequence[NDArray[np.generic]],
    num_examples: int,
    expected_shapes: Sequence[tuple[int, ...]],
) -> str | None:
    """Return why a reply is unusable, or None when it is fine.

    Rejected: wrong number of arrays, wrong shapes, a non-numeric dtype kind,
    NaN/inf entries (or |entries| so large the squared norm overflows), num_examples <= 0.
    """
    return check_reply(arrays, num_examples, expected_shapes)[0]


def check_reply(
    arrays: Sequence[NDArray[np.generic]],
    num_examples: int,
    expected_shapes: Sequence[tuple[int, ...]],
    finite: bool = True,
) -> tuple[str | None, float | None]:
    """`reply_problem` plus sum ||a||^2 of the arrays, found in the same finiteness pass.

    With ``finite=False`` only the structure is checked (count, shapes, dtypes,
    num_examples) and the norm is None: for a caller that checks finiteness itself
    in a pass it makes anyway (`ConsensusADMM.absorb`).
    """
    if isinstance(num_examples, bool) or not isinstance(num_examples, int | np.integer):
        return f"num_examples must be an integer, got {type(num_examples).__name__}", None
    if num_examples <= 0:
        return f"num_examples must be > 0, got {num_examples}", None
    if len(arrays) != len(expected_shapes):
        return f"expected {len(expected_shapes)} arrays, got {len(arrays)}", None
    for i, (array, shape) in enumerate(zip(arrays, expected_shapes, strict=True)):
        if array.shape != tuple(shape):
            return f"array {i} has shape {array.shape}, expected {tuple(shape)}", None
        if array.dtype.kind not in "fiu":
            return f"array {i} has dtype {array.dtype}, expected a real number type", None
    if not finite:
        return None, None
    sq_norm = finite_sq_norm(arrays)
    if sq_norm is None:
        return "contains NaN or inf (or entries whose squared norm overflows)", None
    return None, sq_norm
