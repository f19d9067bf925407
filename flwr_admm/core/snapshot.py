"""The server state of FedADMM as checkpoint arrays and metadata, for both Flower APIs.

`snapshot` adds the held (non-consensus) tensors of a `TensorSplit` to the core's
`ConsensusADMM.state_dict`; `restore` rebuilds both, bit for bit, from what it wrote.
The strategies add what is theirs (the privacy ledger, the legacy sent keys).
"""

from __future__ import annotations

from typing import Any

import numpy as np
from numpy.typing import NDArray

from flwr_admm.core.consensus import ConsensusADMM
from flwr_admm.core.settings import ConsensusSettings
from flwr_admm.core.tensor_policy import TensorSplit

__all__ = ["restore", "snapshot"]

StateArrays = dict[str, NDArray[Any]]


def snapshot(admm: ConsensusADMM, tensors: TensorSplit) -> tuple[StateArrays, dict[str, Any]]:
    """Return z, every cached w_i and dual, the sums, rho, its schedule and held tensors."""
    arrays, meta = admm.state_dict()
    arrays.update({f"tensors.{i}": t for i, t in tensors.held.items()})
    manifest: dict[str, Any] = {"tensor_roles": list(tensors.roles), "admm": meta}
    if tensors.nonnegative:
        manifest["nonnegative_tensors"] = list(tensors.nonnegative)
    return arrays, manifest


def restore(
    settings: ConsensusSettings, arrays: StateArrays, manifest: dict[str, Any]
) -> tuple[ConsensusADMM, TensorSplit]:
    """Rebuild the core and the tensor split that `snapshot` wrote."""
    meta = manifest["admm"]
    admm = settings.new_admm([np.zeros(tuple(shape)) for shape in meta["shapes"]])
    admm.load_state_dict(arrays, meta)
    roles = manifest.get("tensor_roles") or ["consensus"] * len(admm.z)
    held = iter(admm.z)
    z = [arrays[f"tensors.{i}"] if r != "consensus" else next(held) for i, r in enumerate(roles)]
    return admm, TensorSplit(roles, z, manifest.get("nonnegative_tensors", ()))
