"""Checks a client reply must pass before it may touch the server state."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from numpy.typing import NDArray


def reply_problem(
    arrays: Sequence[NDArray[np.generic]],
    num_examples: int,
    expected_shapes: Sequence[tuple[int, ...]],
) -> str | None:
    """Return why a reply is unusable, or None when it is fine.

    Rejected: wrong number of arrays, wrong shapes, a non-numeric dtype kind,
    NaN/inf entries, num_examples <= 0.
    """
    if isinstance(num_examples, bool) or not isinstance(num_examples, int | np.integer):
        return f"num_examples must be an integer, got {type(num_examples).__name__}"
    if num_examples <= 0:
        return f"num_examples must be > 0, got {num_examples}"
    if len(arrays) != len(expected_shapes):
        return f"expected {len(expected_shapes)} arrays, got {len(arrays)}"
    for i, (array, shape) in enumerate(zip(arrays, expected_shapes, strict=True)):
        if array.shape != tuple(shape):
            return f"array {i} has shape {array.shape}, expected {tuple(shape)}"
        if array.dtype.kind not in "fiu":
            return f"array {i} has dtype {array.dtype}, expected a real number type"
        if array.dtype.kind == "f" and not np.all(np.isfinite(array)):
            return f"array {i} contains NaN or inf"
    return None
