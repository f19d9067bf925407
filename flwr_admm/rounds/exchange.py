"""What crosses between a strategy's round and Flower, without Flower's message types.

A translator (`flwr_admm.serverapp`, `flwr_admm.server`) turns each sampled node's
`Instruction` into Flower's records and each reply into an `Incoming`:

- Message API: the model block under ``arrays`` (the strategy's ``arrayrecord_key``),
  each further block as an ArrayRecord of its own name, the config as one ConfigRecord;
  a reply's blocks likewise, and its MetricRecord.
- legacy API: the blocks' tensors one after the other as the parameters (the model
  block first), the config as the FitIns config; a reply's parameters cut into
  model-sized blocks in the same order, and its metrics.

Blocks travel as Flower's bytes (`flwr.common.Parameters`, one ``.npy`` buffer or one
compressed payload per tensor, in `Layout` order): a round checks them against the
layout before anything is deserialized (`read_block`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from flwr.common import Parameters, Scalar
from numpy.typing import NDArray

from flwr_admm.core.types import Arrays
from flwr_admm.uplink.wire import NUMPY_TENSOR_TYPE, parameters_problem, parameters_to_views

__all__ = ["AS_RECEIVED", "Incoming", "Instruction", "Layout", "read_block", "read_blocks"]


@dataclass(frozen=True)
class Layout:
    """Names, dtypes and shapes of the model's tensors, in wire order.

    The first model a strategy receives fixes it: every model, center and block goes
    out under these names, in this order, in these dtypes (0-d tensors stay 0-d).
    """

    names: tuple[str, ...]
    dtypes: tuple[np.dtype[Any], ...]
    shapes: tuple[tuple[int, ...], ...]

    @classmethod
    def of(cls, arrays: Sequence[NDArray[Any]], names: Sequence[str] | None = None) -> Layout:
        """Return the layout of `arrays` (names ``"0"``, ``"1"``, ... unless given)."""
        labels = [str(i) for i in range(len(arrays))] if names is None else [str(n) for n in names]
        if len(labels) != len(arrays):
            raise ValueError(f"tensor_names: expected {len(arrays)} names, got {len(labels)}")
        return cls(
            tuple(labels),
            tuple(np.asarray(a).dtype for a in arrays),
            tuple(tuple(int(s) for s in np.shape(a)) for a in arrays),
        )

    def as_sent(self, arrays: Sequence[NDArray[Any]]) -> Arrays:
        """Return `arrays` as a node receives them: cast to the layout's dtypes, in float64."""
        return [
            np.asarray(np.asarray(a, dtype=d), dtype=np.float64)
            for a, d in zip(arrays, self.dtypes, strict=True)
        ]

    def describe(self) -> dict[str, Any]:
        """Return the layout as JSON (names, dtypes, shapes), as checkpoints record it."""
        return {
            "names": list(self.names),
            "dtypes": [str(d) for d in self.dtypes],
            "shapes": [list(s) for s in self.shapes],
        }

    @classmethod
    def from_description(cls, saved: Mapping[str, Any]) -> Layout:
        """Return the layout `describe` wrote; KeyError/TypeError/ValueError if malformed."""
        dtypes = tuple(np.dtype(d) for d in saved["dtypes"])
        names = tuple(str(n) for n in saved.get("names", [str(i) for i in range(len(dtypes))]))
        shapes = tuple(tuple(int(s) for s in shape) for shape in saved["shapes"])
        if not len(names) == len(dtypes) == len(shapes):
            raise ValueError("names, dtypes and shapes disagree")
        return cls(names, dtypes, shapes)


class _AsReceived:
    """The model block the round was configured with, passed on as the node received it."""

    def __repr__(self) -> str:
        return "AS_RECEIVED"


AS_RECEIVED: Any = _AsReceived()


@dataclass(frozen=True)
class Instruction:
    """What one sampled node receives: the model block, further blocks, its config.

    A block is float64 arrays in layout order (sent in the layout's dtypes), or
    `AS_RECEIVED`: the model this round was configured with, forwarded unchanged. The
    same list object given to several nodes is serialized once.
    """

    arrays: Arrays
    config: Mapping[str, Scalar]
    blocks: Mapping[str, Arrays] = field(default_factory=dict)


@dataclass(frozen=True)
class Incoming:
    """One content reply as a translator reads it; nothing in it is checked yet.

    `arrays` is the model block, `blocks` the further ones by name, each as Flower's
    bytes in layout order (numpy ``.npy`` buffers, or a compressor's payload); `raw`
    is what the API's metrics aggregation reads (a RecordDict, or (n, metrics));
    `problem` says why the reply cannot be read at all (set by the translator), and
    `key` is the client key the round files it under.
    """

    node: str
    metrics: Mapping[str, Any]
    num_examples: Any
    arrays: Parameters | None = None
    blocks: Mapping[str, Parameters] = field(default_factory=dict)
    raw: Any = None
    problem: str | None = None
    key: str = ""


def read_block(
    block: Parameters, shapes: Sequence[tuple[int, ...]]
) -> tuple[list[NDArray[Any]], str | None]:
    """Return a block's numpy tensors as read-only views, or why they cannot be the model's.

    The count, each ``.npy`` header and each byte length are checked first
    (`flwr_admm.uplink.wire.parameters_problem`): nothing is copied from a reply that
    is not the model's size. A compressed block (another tensor type) is a problem here.
    """
    if block.tensor_type != NUMPY_TENSOR_TYPE:
        return [], f"tensor type {block.tensor_type!r}, expected {NUMPY_TENSOR_TYPE!r}"
    problem = parameters_problem(block, shapes)
    if problem is not None:
        return [], problem
    return list(parameters_to_views(block)), None


def read_blocks(
    reply: Incoming, shapes: Sequence[tuple[int, ...]], names: Sequence[str] = ()
) -> tuple[list[NDArray[Any]], str | None]:
    """Return the model block, then each block of `names` (all required), as `read_block` does.

    One list of read-only views in that order, or why the reply cannot be read.
    """
    if reply.arrays is None:
        return [], "no model in the reply"
    arrays, problem = read_block(reply.arrays, shapes)
    for name in names:
        if problem is not None:
            return [], problem
        if name not in reply.blocks:
            return [], f"missing the {name!r} block"
        block, problem = read_block(reply.blocks[name], shapes)
        arrays += block
        problem = None if problem is None else f"{name}: {problem}"
    return (arrays, None) if problem is None else ([], problem)
