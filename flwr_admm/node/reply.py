"""What a node sends up, wire-neutral, and the state it keeps once the reply is built."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from flwr.common import Parameters, RecordDict, Scalar, ndarray_to_bytes

from flwr_admm.core.types import Arrays

__all__ = ["Reply", "keep_nothing"]


def keep_nothing(records: RecordDict) -> None:
    """Keep nothing: the server holds all of this protocol's state."""


@dataclass(frozen=True)
class Reply:
    """One node's answer to one round.

    Attributes
    ----------
    arrays : list of array
        The first block: w_i, y_i (SCAFFOLD) or Delta_i (client-held duals; decoded
        when compressed).
    metrics : dict
        The protocol's reply metrics (the front end adds its own).
    second : list of array, optional
        The second block: c_i+ - c_i (SCAFFOLD), or sigma_i' (client-held duals asked
        to rebuild, ``admm-rebuild = 1``).
    payload : Parameters, optional
        `arrays` compressed (``uplink*`` in the config), sent in their place.
    commit : callable
        ``commit(context.state)`` keeps the node's new state: call it last, once the
        wire reply is built.

    """

    arrays: Arrays
    metrics: dict[str, Scalar]
    second: Arrays | None = None
    payload: Parameters | None = None
    commit: Callable[[RecordDict], None] = field(default=keep_nothing, repr=False)

    def flat(self) -> Arrays:
        """Return the legacy API's tensors: the first block, then the second (if any)."""
        return [*self.arrays, *(self.second or [])]

    def flat_payload(self) -> Parameters | None:
        """Return the legacy payload: the compressed first block, then the second as ``.npy``."""
        if self.payload is None or self.second is None:
            return self.payload
        tensors = [*self.payload.tensors, *(ndarray_to_bytes(t) for t in self.second)]
        return Parameters(tensors=tensors, tensor_type=self.payload.tensor_type)
