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
layout before anything is deserialized (`read_block`). A round's core report goes back
as round metrics (`report_metrics`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from logging import INFO, WARNING
from typing import Any, Protocol, TypeVar

import numpy as np
from flwr.common import Parameters, Scalar
from flwr.common.logger import log
from numpy.typing import NDArray

from flwr_admm.core.types import Arrays, RoundReport
from flwr_admm.protocol import (
    CONVERGED,
    DUAL_RESIDUAL,
    EPS_DUAL,
    EPS_PRIMAL,
    GAMMA,
    NEXT_RHO,
    NUM_CLIENTS_CACHED,
    NUM_EVICTED,
    NUM_FAILURES,
    NUM_KEY_CONFLICTS,
    NUM_REJECTED,
    NUM_REPLIES,
    NUM_RESYNCED,
    OBJECTIVE,
    PRIMAL_RESIDUAL,
    REPLY_ONLY_METRICS,
    REPLY_ONLY_PREFIX,
    RHO,
)
from flwr_admm.uplink.wire import NUMPY_TENSOR_TYPE, parameters_problem, parameters_to_views

V = TypeVar("V")

__all__ = [
    "AS_RECEIVED",
    "MAX_REPLY_METRICS",
    "Algorithm",
    "Incoming",
    "Instruction",
    "Layout",
    "Tally",
    "read_block",
    "read_blocks",
    "report_metrics",
    "without_reply_keys",
]


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


# The aggregated reply metrics kept per round (in name order): the history and the
# returned round metrics stay bounded whatever names the clients invent.
MAX_REPLY_METRICS = 64


def without_reply_keys(aggregated: Mapping[str, V]) -> dict[str, V]:
    """Return aggregated reply metrics without the replies' identity and protocol keys.

    Dropped: `flwr_admm.protocol.REPLY_ONLY_METRICS` and every ``admm-*`` key, since
    Flower's default ``train_metrics_aggr_fn`` weight-averages every numeric reply
    metric, ids included. At most `MAX_REPLY_METRICS` names are kept, the first in
    sorted order (a warning counts the others).
    """
    names = sorted(
        name
        for name in aggregated
        if name not in REPLY_ONLY_METRICS and not name.startswith(REPLY_ONLY_PREFIX)
    )
    if len(names) > MAX_REPLY_METRICS:
        log(
            WARNING,
            "round metrics: %d reply metric names, kept the first %d (sorted)",
            len(names),
            MAX_REPLY_METRICS,
        )
        names = names[:MAX_REPLY_METRICS]
    return {name: aggregated[name] for name in names}


class Tally:
    """The counts of one aggregation, and the log line of every rejected reply."""

    def __init__(self, label: str, counters: Iterable[str] = ()) -> None:
        self.label = label
        self.counts: dict[str, int] = dict.fromkeys(
            (NUM_FAILURES, NUM_REJECTED, NUM_KEY_CONFLICTS, NUM_EVICTED, *counters), 0
        )
        self.rebound: list[tuple[str, str]] = []  # (key, node) to bind though not folded

    def reject(self, key: str, problem: str, conflict: bool = False) -> None:
        """Log why the reply of `key` was rejected; count it (and a key conflict)."""
        log(WARNING, "%s: rejected reply of %s: %s", self.label, key, problem)
        self.counts[NUM_REJECTED] += 1
        self.counts[NUM_KEY_CONFLICTS] += int(conflict)

    def add(self, name: str, count: int = 1) -> None:
        """Add `count` to the counter `name`."""
        self.counts[name] += int(count)

    def resync(self, key: str, node: str) -> None:
        """Count a known key replying from a node it was not sent to; bind it there."""
        log(INFO, "%s: %s re-identified under node %s; resynced", self.label, key, node)
        self.counts[NUM_RESYNCED] += 1
        self.rebound.append((key, node))


class Algorithm(Protocol):
    """A strategy's math and server state, as the round layer drives it.

    `read` checks one reply alone (it may decode it; never raises); `fold` takes the
    admitted replies of the round, in natural key order, and says which it folded
    (the others it rejected through the `Tally`); `finish` takes the server step.

    Optional: ``keeps_model = True`` (its own z' is not re-read from the model it
    returned: no `adopt` then); ``admits(replies, freed, server_round, tally)`` (False
    drops the admitted replies whole, before any eviction: SecAgg+'s one aggregate).
    """

    label: str  # in logs and checkpoints
    counters: tuple[str, ...]  # round counters beyond the shared ones
    reply_blocks: tuple[str, ...]  # block names a reply may carry after the model block

    def adopt(self, z: Arrays, layout: Layout) -> None:
        """Take the model the round was configured with (float64, layout order)."""

    def model(self) -> Arrays | None:
        """Return the model the next round sends (float64, layout order; None before any)."""

    def round_config(self, sampled: int, population: int) -> dict[str, Scalar]:
        """Return the config entries every sampled node gets this round."""

    def instruction(self, node: str, key: str | None) -> Instruction:
        """Return node `node`'s instruction (`key`: the client key it speaks for, if known)."""

    def read(self, reply: Incoming) -> tuple[Any, str | None]:
        """Return the reply's values for `fold`, or why it is unusable."""

    def fold(
        self, replies: list[tuple[Incoming, Any]], server_round: int, tally: Tally
    ) -> list[bool]:
        """Fold the admitted replies into the open round; which were folded."""

    def finish(self, server_round: int) -> tuple[dict[str, Scalar], bool]:
        """Take the server step; return the round metrics and whether it converged."""

    def discard(self) -> dict[str, Scalar]:
        """Close a round without a usable reply; return its idle metrics."""

    def evict(self, keys: list[str]) -> int:
        """Forget `keys` (their state leaves the sums); return how many were held."""

    def configuration(self) -> dict[str, Any]:
        """Return the settings that change the iterates (JSON; fingerprinted)."""

    def state_dict(self) -> tuple[dict[str, NDArray[Any]], dict[str, Any]]:
        """Return the checkpoint arrays and manifest entries of the server state."""

    def load_state_dict(
        self, arrays: dict[str, NDArray[Any]], manifest: dict[str, Any], layout: Layout
    ) -> None:
        """Restore `state_dict`; raise KeyError/TypeError/ValueError when malformed."""


def report_metrics(report: RoundReport) -> dict[str, Scalar]:
    """Return one aggregation's round metrics: rho, gamma, residuals, thresholds, counts, f."""
    metrics: dict[str, Scalar] = {
        RHO: report.rho,
        NEXT_RHO: report.next_rho,
        PRIMAL_RESIDUAL: report.primal_residual,
        DUAL_RESIDUAL: report.dual_residual,
        EPS_PRIMAL: report.eps_primal,
        EPS_DUAL: report.eps_dual,
        CONVERGED: int(report.converged),
        NUM_REPLIES: report.num_replies,
        NUM_CLIENTS_CACHED: report.num_clients_cached,
        **({} if report.dual_step is None else {GAMMA: report.dual_step}),  # gamma
    }
    if report.objective is not None:
        metrics[OBJECTIVE] = report.objective  # sum_i p_i f_i(w_i) (+ g(z'))
    return metrics
