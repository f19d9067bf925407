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
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from logging import WARNING
from typing import Any, Literal

from flwr.common import Scalar
from flwr.common.logger import log
from numpy.typing import NDArray

from flwr_admm.core.consensus import ConsensusADMM
from flwr_admm.core.linearized import (
    STOCK_MU,
    Form,
    FormSpec,
    budget_scale,
    check_form,
    chosen_form,
    dual_tensors,
    strategy_settings,
)
from flwr_admm.core.regularizers import Regularizer
from flwr_admm.core.schedules import DualStep
from flwr_admm.core.settings import ConsensusSettings
from flwr_admm.core.snapshot import restore, snapshot
from flwr_admm.core.steps import ZAverage
from flwr_admm.core.tensor_policy import (
    Rules,
    TensorSplit,
    check_rules,
    nonnegative_of,
    roles_of,
)
from flwr_admm.core.types import NON_FINITE, Arrays, Reply, check_reply
from flwr_admm.options import Convergence, Uplink, option
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
    START_MARK,
    START_MOMENTUM,
    START_RECORD,
    START_TENSORS,
    STEP_BUDGET,
)
from flwr_admm.rounds.exchange import (
    AS_RECEIVED,
    Incoming,
    Instruction,
    Layout,
    Tally,
    read_block,
    report_metrics,
)
from flwr_admm.uplink.channel import UplinkChannel
from flwr_admm.uplink.wire import parameters_problem

__all__ = ["FedADMMRound", "StartMarks", "StartPolicy"]

# Where the start z goes with the center: to every node with rho_i > 0 (the Message
# API's helpers read it), or only to nodes whose replies said they start there (legacy).
StartPolicy = Literal["always", "marked"]


class FedADMMRound:
    """Server-held consensus ADMM (`ConsensusADMM`) as a strategy's `Algorithm`.

    `tensor_rules` is the checked tensor policy (`flwr_admm.core.tensor_policy`),
    `start` the `StartPolicy`.
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
        self.uplink = channel if channel.active else None  # None: plain replies, nothing to do
        self.tensor_rules, self.start = tensor_rules, start
        self.admm: ConsensusADMM | None = None
        self.tensors: TensorSplit | None = None  # the non-consensus tensors, from the first z
        self._held: TensorSplit | None = None  # `tensors`, unless every tensor is consensus
        self.layout: Layout | None = None
        self.marks = StartMarks()  # stock FedProx handlers: their duals are held at 0
        self.sent_key: dict[str, str | None] = {}  # node -> key whose center it got
        self._start: Arrays = AS_RECEIVED  # this round's start, the same for every node

    @classmethod
    def of(
        cls,
        given: dict[str, Any],
        *,
        regularizer: Regularizer | None,
        relaxation: float | None,
        dual_step: DualStep | None,
        z_average: ZAverage,
        form: FormSpec | None,
        convergence: Convergence,
        uplink: Uplink | None,
        tensor_policy: Mapping[str, str] | None,
        start: StartPolicy,
    ) -> FedADMMRound:
        """Return the round a `FedADMM` front-end's keywords describe (checked).

        `given` holds ``rho``, ``proximal_mu`` and ``rho_schedule`` (`strategy_settings`);
        `form` None is the default form (`chosen_form`).
        """
        link = Uplink() if uplink is None else option("uplink", uplink, Uplink)
        prox_only = {"regularizer": regularizer, "relaxation": relaxation, "dual_step": dual_step}
        channel: dict[str, object] = {"uplink": link.compressor, "local_dp": link.local_dp}
        form = chosen_form(form, {**given, **prox_only, **channel})
        settings = strategy_settings(
            form,
            given,
            regularizer=regularizer,
            eps_abs=convergence.eps_abs,
            eps_rel=convergence.eps_rel,
            relaxation=relaxation,
            z_average=z_average,
            dual_step=dual_step,
            channel=channel,
        )
        uplink_channel = UplinkChannel(link.compressor, link.local_dp)
        return cls(settings, check_form(form), uplink_channel, check_rules(tensor_policy), start)

    # ------------------------------------------------------------------ model
    def adopt(self, z: Arrays, layout: Layout) -> None:
        """Take z^k (the first call builds the core and the tensor split)."""
        self.layout = layout
        if self.admm is None or self.tensors is None:
            roles = roles_of(self.tensor_rules, layout.names, layout.dtypes)
            self._split(TensorSplit(roles, z, nonnegative_of(layout.names)))
            self.admm = self.settings.new_admm(self._consensus(z))
        else:
            if self._held is not None:
                self._held.adopt(z)
            self.admm.adopt_consensus(self._consensus(z))

    def _split(self, tensors: TensorSplit) -> None:
        self.tensors, self._held = tensors, None if tensors.trivial else tensors

    def _consensus(self, arrays: Sequence[NDArray[Any]]) -> list[NDArray[Any]]:
        """Return the consensus tensors of a full tensor list (what the core holds)."""
        return list(arrays) if self._held is None else self._held.consensus(arrays)

    def _merge(self, consensus: Arrays) -> Arrays:
        """Return the full tensor list: the core's consensus tensors and the held ones."""
        return consensus if self._held is None else self._held.merge(consensus)

    def model(self) -> Arrays | None:
        """Return z' with the held tensors (None before the first round)."""
        return None if self.admm is None else self._merge(self.admm.z)

    # ----------------------------------------------------------- instructions
    def round_config(self, sampled: int, population: int) -> dict[str, Scalar]:
        """Return the uplink entries; fix this round's start (z, or the momentum start)."""
        admm, _ = self._core()
        x = admm.start_point()  # z, or the linearized form's momentum start
        self._start = AS_RECEIVED if x is admm.z else self._merge(x)
        if self.uplink is None:
            return {}
        self.uplink.sampled(sampled, population)
        return self.uplink.config()

    def instruction(self, node: str, key: str | None) -> Instruction:
        """Prox form: v_i = z - y_i / rho_i, rho_i and z; linearized: the start and y_i.

        The linearized form's ``proximal-mu`` is for stock FedProx handlers (`STOCK_MU`).
        """
        admm, _ = self._core()
        self.sent_key[node] = key if key in admm.records else None
        if self.form == "linearized":  # y_i goes down; rho_i = 1 / b_i comes back
            linear: dict[str, Scalar] = {FORM: FORM_LINEARIZED, PROXIMAL_MU: STOCK_MU}
            y_i = dual_tensors(admm, self._held, key)
            return Instruction(self._start, linear, {DUAL_RECORD: y_i})
        center, rho_i = admm.center(key), admm.rho_for(key)  # v_i = z - y_i / rho_i
        arrays = AS_RECEIVED if center is admm.z else self._merge(center)
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
        assert self.layout is not None
        shapes, uplink = self.layout.shapes, self.uplink
        if reply.arrays is None:
            return None, "no model in the reply"
        if uplink is None:
            arrays, problem = read_block(reply.arrays, shapes)  # sizes first, then views
        else:
            problem = uplink.attestation_problem(reply.metrics)  # local DP
            problem = problem or parameters_problem(reply.arrays, shapes)  # before any copy
            if problem is None:  # views, or v_i + decode(payload)
                arrays = uplink.decode(reply.arrays, partial(self._sent_center, reply.node))
        if problem is not None:
            return None, problem
        problem, sq_norm = check_reply(arrays, reply.num_examples, shapes, finite=False)
        return (None if problem else (list(arrays), sq_norm)), problem

    def _sent_center(self, node: str) -> Arrays:
        """Return the center `node` was sent this round, as it received it."""
        admm, _ = self._core()
        assert self.layout is not None
        key = self.sent_key.get(node)
        center = admm.center(key)  # z, y_i and rho do not change within a round
        return self.layout.as_sent(self._merge(center))

    def fold(
        self, replies: list[tuple[Incoming, Any]], server_round: int, tally: Tally
    ) -> list[bool]:
        """Absorb w_i, n_i, f_i(w_i) of the admitted replies (NaN/inf found here: rejected)."""
        admm, _ = self._core()
        admm.begin([reply.key for reply, _ in replies])
        if self._held is not None:
            self._held.begin()
        self.marks.begin()
        prepared = [self._prepared(reply, read, tally) for reply, read in replies]
        usable = [p for p in prepared if p is not None]
        # the consensus parts together, then FedAvg of each accepted reply's averaged tensors
        refused = set(admm.absorb_all([reply for reply, _ in usable]))
        for reply, arrays in usable:
            if reply.key in refused:
                tally.reject(reply.key, NON_FINITE)
            elif self._held is not None:
                self._held.absorb(arrays, reply.num_examples)
        folded = iter(reply.key not in refused for reply, _ in usable)
        return [p is not None and next(folded) for p in prepared]

    def _prepared(
        self, reply: Incoming, read: tuple[list[NDArray[Any]], float | None], tally: Tally
    ) -> tuple[Reply, list[NDArray[Any]]] | None:
        """Return a reply's consensus part and all its arrays; None if skipped or rejected."""
        admm, _ = self._core()
        key, (arrays, sq_norm) = reply.key, read
        if admm.rho > 0 and key in admm.records and self.sent_key.get(reply.node) != key:
            # trained around another center (key_binding="reported", new node id): resync
            tally.resync(key, reply.node)
            return None
        why = None if self._held is None else self._held.problem(arrays)  # the held tensors
        if why is not None:
            tally.reject(key, why)
            return None
        scale = None
        if self.form == "prox":
            self.marks.read(key, reply.metrics, admm.rho)
        elif STEP_BUDGET not in reply.metrics:  # a stock FedProx handler: its dual held at 0
            scale = STOCK_MU  # rho_i = the mu it was sent
            self.marks.stock.add(key)
        else:  # rho_i = 1 / b_i, b_i the reply's step budget
            scale, why = budget_scale(reply.metrics)
            if why is not None:
                tally.reject(key, why)
                return None
        loss = reply.metrics.get(LOSS)
        real = isinstance(loss, int | float) and not isinstance(loss, bool)
        objective = float(loss) if real and math.isfinite(loss) else None  # type: ignore[arg-type]
        norm = sq_norm if self._held is None else None
        n = int(reply.num_examples)
        return Reply(key, self._consensus(arrays), n, objective, norm, scale), arrays

    def finish(self, server_round: int) -> tuple[dict[str, Scalar], bool]:
        """Take the z-step and the dual step; return the residuals and the next rho."""
        admm, _ = self._core()
        report = admm.finish(server_round)
        if self._held is not None:
            self._held.finish()
        missing = STEP_BUDGET if self.form == "linearized" else START_MARK
        stock = self.marks.settle(admm, partial(log, WARNING, "FedADMM: %s"), missing)  # y_i = 0
        metrics = {**report_metrics(report), NUM_STOCK_REPLIES: stock}
        if admm.momentum is not None:  # the beta this round's start was moved by
            metrics[START_MOMENTUM] = 0.0 if self._start is AS_RECEIVED else admm.momentum.beta
        if self.uplink is not None:
            metrics.update(self.uplink.round_metrics(aggregated=True))
        return metrics, report.converged

    def discard(self) -> dict[str, Scalar]:
        """Cancel the open round; return rho and the cached count, unchanged."""
        admm, _ = self._core()
        admm.cancel()
        if self._held is not None:
            self._held.begin()
        idle = {RHO: admm.rho, NUM_CLIENTS_CACHED: len(admm.records)}
        uplink = {} if self.uplink is None else self.uplink.round_metrics(aggregated=False)
        return {**idle, **uplink}

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
        self.admm, tensors = restore(self.settings, arrays, manifest)
        self._split(tensors)
        self.layout = layout
        self.sent_key = dict(manifest.get("sent_key", {}))
        if self.channel.ledger is not None:
            self.channel.ledger.load_state_dict(manifest.get("privacy", {}))

    def _core(self) -> tuple[ConsensusADMM, TensorSplit]:
        assert self.admm is not None and self.tensors is not None
        return self.admm, self.tensors


@dataclass
class StartMarks:
    """Which clients start at z, read from their replies' ``admm-started-at-z``.

    Our helpers (`TorchADMM`, `ADMMTrainStep`, `ADMMClient`) mark every reply: 1 when
    the solve started at the received z, 0 elsewhere. A reply without the mark comes
    from a stock FedProx handler, which starts at v_i = z - u_i: then w_i ~ v_i + d_i
    (d_i its drift) and u_i ~ d_i - mean(d) puts the next start opposite the drift,
    which diverges with momentum SGD (docs/torch.md). Its dual is held at 0: its
    center is z and its step FedProx's. In the linearized form a reply without
    ``admm-step-budget`` is the stock one (`FedADMMRound` adds it to `stock`).
    """

    stock: set[str] = field(default_factory=set)  # unmarked replies this round (rho > 0)
    at_z: set[str] = field(default_factory=set)  # last accepted reply started at z
    warned: set[str] = field(default_factory=set)  # stock keys already logged

    def begin(self) -> None:
        """Open a round: no stock reply seen yet."""
        self.stock = set()

    def read(self, key: str, metrics: Mapping[str, Any], rho: float) -> None:
        """Note the mark of `key`'s reply (a FedADMM round with rho > 0 only)."""
        if rho <= 0:
            return
        mark = metrics.get(START_MARK)
        if mark is None:
            self.stock.add(key)
        if mark == 1:
            self.at_z.add(key)
        else:
            self.at_z.discard(key)

    def settle(self, admm: ConsensusADMM, warn: Callable[[str], None], missing: str) -> int:
        """Hold the stock clients' duals at 0 (after the round); warn once per key.

        `missing` names what the stock replies lacked. Returns how many replies of the
        round were stock ones.
        """
        held = admm.reset_duals(self.stock)
        for key in sorted(set(held) - self.warned):
            warn(
                f"{key} replied without {missing!r} (a stock FedProx handler): its dual "
                "is held at 0, so it runs FedProx's step around z; "
                "flwr_admm.torch.TorchADMM or flwr_admm.clientapp.ADMMTrainStep run the "
                "ADMM step"
            )
            self.warned.add(key)
        return len(self.stock)

    def forget(self, keys: set[str]) -> None:
        """Drop evicted keys."""
        self.at_z -= keys
        self.warned -= keys
