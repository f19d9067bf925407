"""The second block of tensors a round sends next to the model, and its legacy layout.

Next to the model (v_i, z or x) a round may send a second block of the same tensors:

- z under FedADMM's ``admm-start`` (where the local solve starts);
- y_i under the linearized form with server-held duals;
- c under SCAFFOLD.

The Message API sends it as an ArrayRecord of its own, named by `companion`; the
legacy API appends it to the parameters (`split` takes it off again).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from numpy.typing import NDArray

from flwr_admm.core.types import Arrays
from flwr_admm.node.config import client_held
from flwr_admm.protocol import (
    DUAL_RECORD,
    FORM,
    FORM_LINEARIZED,
    PEER,
    PEER_SCAFFOLD,
    SCAFFOLD_CONTROL_RECORD,
    START_RECORD,
    START_TENSORS,
)

__all__ = ["SENDS", "companion", "split"]

# what each companion record is, for errors that name both blocks
SENDS = {
    START_RECORD: "FedADMM sends v_i, then z (admm-start = 1)",
    DUAL_RECORD: "the linearized form sends z, then y_i",
    SCAFFOLD_CONTROL_RECORD: "SCAFFOLD sends x, then c",
}


def companion(config: Mapping[str, Any]) -> str | None:
    """Return the record name of the block the config says follows the model, or None.

    (The Message-API `FedADMM` says it with the ``admm-start`` record itself.)
    """
    if config.get(PEER) == PEER_SCAFFOLD:
        return SCAFFOLD_CONTROL_RECORD
    if client_held(config):
        return None
    if config.get(FORM) == FORM_LINEARIZED:
        return DUAL_RECORD
    if config.get(START_TENSORS) == 1:
        return START_RECORD
    return None


def split(
    parameters: Sequence[NDArray[Any]], config: Mapping[str, Any], names: Sequence[str]
) -> tuple[Arrays, Arrays | None]:
    """Return the model block and the companion block of legacy parameters, as float64.

    Raises
    ------
    ValueError
        Naming ``parameters`` unless they are one block of len(`names`) tensors, or
        two of the same shapes when the config says a companion follows.

    """
    arrays = [np.asarray(p, dtype=np.float64) for p in parameters]
    name, count = companion(config), len(names)
    if name is None:
        if len(arrays) != count:
            raise ValueError(
                f"parameters: expected {count} tensors {list(names)}, got {len(arrays)}"
            )
        return arrays, None
    if len(arrays) != 2 * count:
        raise ValueError(
            f"parameters: {SENDS[name]}: expected {2 * count} tensors "
            f"({list(names)} twice), got {len(arrays)}"
        )
    first, second = arrays[:count], arrays[count:]
    for tensor, a, b in zip(names, first, second, strict=True):
        if a.shape != b.shape:
            raise ValueError(
                f"parameters: {tensor!r} must have shape {a.shape} in both blocks "
                f"({SENDS[name]}), got {b.shape}"
            )
    return first, second
