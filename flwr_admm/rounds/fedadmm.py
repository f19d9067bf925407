"""FedADMM's round with server-held duals, wire neutral (the round: `flwr_admm.FedADMM`).

`FedADMMRound` is the `Algorithm` both `FedADMM` translators drive: it holds the
numpy core (`ConsensusADMM`), the tensor split (`TensorSplit`: which tensors are
consensus variables), the start marks of stock FedProx handlers (`StartMarks`) and
the uplink channel (compression, local DP), and turns them into instructions and
folds. Every center a node was sent is recomputed, never stored: z, the duals and
the dtypes do not change within a round.
"""

from __future__ import annotations

import math
from functools import partial
from logging import WARNING
from typing import Any, Literal

from flwr.common import Scalar
from flwr.common.logger import log
from numpy.typing import NDArray

from flwr_admm.core.consensus import ConsensusADMM
from flwr_admm.core.linearized import Form, budget_scale, dual_tensors
from flwr_admm.core.settings import ConsensusSettings
from flwr_admm.core.snapshot import restore, snapshot
from flwr_admm.core.start_marks import StartMarks
from flwr_admm.core.tensor_policy import (
    Rules,
    TensorSplit,
    absorb_together,
    nonnegative_of,
    roles_of,
)
from flwr_admm.core.types import NON_FINITE, Arrays, Reply
from flwr_admm.core.validation import check_reply
from flwr_admm.protocol import (
    DUAL_RECORD,
    FORM,
    FORM_LINEARIZED,
    LOSS,
    NUM_CLIENTS_CACHED,
    NUM_RESYNCED,
    NUM_STOCK_REPLIES,
    PROXIMAL_MU,
    RHO,
    START_RECORD,
    START_TENSORS,
)
from flwr_admm.rounds.exchange import AS_RECEIVED, Incoming, Instruction, Layout
from flwr_admm.rounds.layer import Tally
from flwr_admm.rounds.report import report_metrics
from flwr_admm.uplink.channel import UplinkChannel
from flwr_admm.uplink.wire import parameters_problem

__all__ = ["FedADMMRound", "StartPolicy"]

# Where the start z goes with the center: to every node with rho_i > 0 (the Message
# API's helpers read it), or only to nodes whose replies said they start there (legacy).
StartPolicy = Literal["always", "marked"]


class FedADMMRound:
    """Server-held consensus ADMM (`ConsensusADMM`) as a strategy's `Algorithm`.

    Parameters
    ----------
    settings : ConsensusSettings
        The core settings (rho, schedule, relaxation, dual step, ...).
    form : {"prox", "linearized"}
        The prox step around v_i, or the linearized (Scaffnew) one.
    channel : UplinkChannel
        Uplink compression and local DP.
    tensor_rules : tuple of (pattern, role)
        The tensor policy (`flwr_admm.core.tensor_policy`).
    start : {"always", "marked"}
        `StartPolicy`.

    """

    label = "FedADMM"
    counters: tuple[str, ...] = (NUM_RESYNCED,)
    reply_blocks: tuple[str, ...] = ()

    def __init__(
        self,
        settings: ConsensusSettings,
        form: Form,
        channel: UplinkChannel,
        tensor_rules: Rules = (),
        start: StartPolicy = "always",
    ) -> None:
        self.settings, self.form, self.channel = settings, form, channel
        self.tensor_rules, self.start = tensor_rules, start
        self.admm: ConsensusADMM | None = None
        self.tensors: TensorSplit | None = None  # the non-consensus tensors, from the first z
        self.layout: Layout | None = None
        self.marks = StartMarks()  # stock FedProx handlers: their duals are held at 0
        self.sent_key: dict[str, str | None] = {}  # node -> key whose center it got
        self._start: Arrays = AS_RECEIVED  # this round's start, the same for every node

    # ------------------------------------------------------------------ model
    def adopt(self, z: Arrays, layout: Layout) -> None:
        """Take z^k (the first call builds the core and the tensor split)."""
        self.layout = layout
        if self.admm is None or self.tensors is None:
            roles = roles_of(self.tensor_rules, layout.names, layout.dtypes)
            self.tensors = TensorSplit(roles, z, nonnegative_of(layout.names))
            self.admm = self.settings.new_admm(self.tensors.consensus(z))
        else:
            self.tensors.adopt(z)
            self.admm.adopt_consensus(self.tensors.consensus(z))

    def model(self) -> Arrays | None:
        """Return z' with the held tensors (None before the first round)."""
        if self.admm is None or self.tensors is None:
            return None
        return self.tensors.merge(self.admm.z)

    # ----------------------------------------------------------- instructions
    def round_config(self, sampled: int, population: int) -> dict[str, Scalar]:
        """Return the uplink entries; fix this round's start (z, or the momentum start)."""
        admm, split = self._core()
        self.channel.sampled(sampled, population)
        x = admm.start_point()  # z, or the linearized form's momentum start
        self._start = AS_RECEIVED if x is admm.z else split.merge(x)
        return self.channel.config()

    def instruction(self, node: str, key: str | None) -> Instruction:
        """Prox form: v_i = z - y_i / rho_i, rho_i and z; linearized: the start and y_i."""
        admm, split = self._core()
        self.sent_key[node] = key if key in admm.records else None
        if self.form == "linearized":  # y_i goes down; rho_i = 1 / b_i comes back
            linear: dict[str, Scalar] = {FORM: FORM_LINEARIZED, PROXIMAL_MU: 0.0}
            return Instruction(self._start, linear, {DUAL_RECORD: dual_tensors(admm, split, key)})
        center, rho_i = admm.center(key), admm.rho_for(key)  # v_i = z - y_i / rho_i
        arrays = AS_RECEIVED if center is admm.z else split.merge(center)
        config: dict[str, Scalar] = {RHO: rho_i, PROXIMAL_MU: rho_i}
        if self.start == "always":
            blocks = {START_RECORD: AS_RECEIVED} if rho_i > 0 else {}
        elif center is not admm.z and key in self.marks.at_z:  # v_i, then z: the start
            blocks, config[START_TENSORS] = {START_RECORD: AS_RECEIVED}, 1
        else:
            blocks = {}
        return Instruction(arrays, config, blocks)

    # ---------------------------------------------------------------- replies
    def read(self, reply: Incoming) -> tuple[Any, str | None]:
        """Decode w_i (v_i + decode(payload) when compressed); check its structure.

        NaN/inf entries are left to `ConsensusADMM.absorb_all`, which finds them in the
        pass that folds the reply in.
        """
        _, split = self._core()
        problem = self.channel.attestation_problem(reply.metrics)  # local DP
        if problem is not None or reply.arrays is None:
            return None, problem or "no model in the reply"
        shapes = [tuple(s) for s in split.shapes]
        problem = parameters_problem(reply.arrays, shapes)  # sizes, before any copy
        if problem is not None:
            return None, problem
        sent = partial(self._sent_center, reply.node)
        arrays = self.channel.decode(reply.arrays, sent)  # views, or v_i + decode(payload)
        problem, sq_norm = check_reply(arrays, reply.num_examples, shapes, finite=False)
        return (None if problem else (list(arrays), sq_norm)), problem

    def _sent_center(self, node: str) -> Arrays:
        """Return the center `node` was sent this round, as it received it."""
        admm, split = self._core()
        assert self.layout is not None
        key = self.sent_key.get(node)
        center = admm.center(key)  # z, y_i and rho do not change within a round
        return self.layout.as_sent(split.merge(center))

    def fold(
        self, replies: list[tuple[Incoming, Any]], server_round: int, tally: Tally
    ) -> list[bool]:
        """Absorb w_i, n_i, f_i(w_i) of the admitted replies (NaN/inf found here: rejected)."""
        admm, split = self._core()
        admm.begin([reply.key for reply, _ in replies])
        split.begin()
        self.marks.begin()
        prepared = [self._prepared(reply, read, tally) for reply, read in replies]
        usable = [p for p in prepared if p is not None]
        refuse = partial(tally.reject, problem=NON_FINITE)
        folded = iter(absorb_together(admm.absorb_all, split, usable, refuse))
        return [p is not None and next(folded) for p in prepared]

    def _prepared(
        self, reply: Incoming, read: tuple[list[NDArray[Any]], float | None], tally: Tally
    ) -> tuple[Reply, list[NDArray[Any]]] | None:
        """Return a reply's consensus part and all its arrays; None if skipped or rejected."""
        admm, split = self._core()
        key, (arrays, sq_norm) = reply.key, read
        if admm.rho > 0 and key in admm.records and self.sent_key.get(reply.node) != key:
            # trained around another center (key_binding="reported", new node id): resync
            tally.resync(key, reply.node)
            return None
        why = split.problem(arrays)  # the core checks the consensus tensors only
        if why is not None:
            tally.reject(key, why)
            return None
        scale = None
        if self.form == "linearized":  # rho_i = 1 / b_i, b_i the reply's step budget
            scale, why = budget_scale(reply.metrics)
            if why is not None:
                tally.reject(key, why)
                return None
        else:
            self.marks.read(key, reply.metrics, admm.rho)
        loss = reply.metrics.get(LOSS)
        real = isinstance(loss, int | float) and not isinstance(loss, bool)
        objective = float(loss) if real and math.isfinite(loss) else None  # type: ignore[arg-type]
        norm = sq_norm if split.trivial else None
        n = int(reply.num_examples)
        return Reply(key, split.consensus(arrays), n, objective, norm, scale), arrays

    def finish(self, server_round: int) -> tuple[dict[str, Scalar], bool]:
        """Take the z-step and the dual step; return the residuals and the next rho."""
        admm, split = self._core()
        report = admm.finish(server_round)
        split.finish()
        stock = self.marks.settle(admm, partial(log, WARNING, "FedADMM: %s"))  # y_i = 0
        metrics = {**report_metrics(report), NUM_STOCK_REPLIES: stock}
        return {**metrics, **self.channel.round_metrics(aggregated=True)}, report.converged

    def discard(self) -> dict[str, Scalar]:
        """Cancel the open round; return rho and the cached count, unchanged."""
        admm, split = self._core()
        admm.cancel()
        split.begin()
        idle = {RHO: admm.rho, NUM_CLIENTS_CACHED: len(admm.records)}
        return {**idle, **self.channel.round_metrics(aggregated=False)}

    def evict(self, keys: list[str]) -> int:
        """Forget `keys`: w_i, y_i, n_i leave the sums, re-summed exactly in key order."""
        gone = set(keys)
        self.marks.forget(gone)
        self.sent_key = {n: None if k in gone else k for n, k in self.sent_key.items()}
        return 0 if self.admm is None else len(self.admm.evict(keys))

    # ------------------------------------------------------------------ state
    def configuration(self) -> dict[str, Any]:
        """Return the strategy, form, core settings, tensor policy and uplink (JSON)."""
        rules = [list(rule) for rule in self.tensor_rules]
        return {
            **({"tensor_policy": rules} if rules else {}),
            "strategy": self.label,
            **({} if self.form == "prox" else {"form": self.form}),
            **self.settings.describe(),
            **self.channel.describe(),
        }

    def state_dict(self) -> tuple[dict[str, NDArray[Any]], dict[str, Any]]:
        """Return z, every cached w_i and dual, the sums, rho, its schedule, the ledger."""
        admm, split = self._core()
        arrays, manifest = snapshot(admm, split)
        ledger = self.channel.ledger
        privacy = ledger.state_dict() if ledger is not None else {}
        return arrays, {**manifest, "sent_key": self.sent_key, "privacy": privacy}

    def load_state_dict(
        self, arrays: dict[str, NDArray[Any]], manifest: dict[str, Any], layout: Layout
    ) -> None:
        """Restore `state_dict` (the core, the split, the sent keys, the ledger)."""
        self.admm, self.tensors = restore(self.settings, arrays, manifest)
        self.layout = layout
        self.sent_key = dict(manifest.get("sent_key", {}))
        if self.channel.ledger is not None:
            self.channel.ledger.load_state_dict(manifest.get("privacy", {}))

    def _core(self) -> tuple[ConsensusADMM, TensorSplit]:
        assert self.admm is not None and self.tensors is not None
        return self.admm, self.tensors
