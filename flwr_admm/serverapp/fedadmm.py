"""FedADMM for Flower's Message API: a drop-in for `flwr.serverapp.strategy.FedProx`."""

from __future__ import annotations

import os
from collections.abc import Mapping
from functools import partial
from logging import INFO, WARNING
from typing import Any, ClassVar

import numpy as np
from flwr.app import ArrayRecord, Message
from flwr.common.logger import log
from numpy.typing import NDArray

from flwr_admm.core import ConsensusADMM, HealthCheck, Reply, RhoSchedule
from flwr_admm.core.acceleration import DEFAULT_ETA
from flwr_admm.core.health import DEFAULT_HEALTH
from flwr_admm.core.linearized import FormSpec, budget_scale, check_form, strategy_settings
from flwr_admm.core.regularizers import Regularizer
from flwr_admm.core.settings import DEFAULT_ACCELERATION
from flwr_admm.core.snapshot import restore, snapshot
from flwr_admm.core.start_marks import StartMarks
from flwr_admm.core.tensor_policy import (
    TensorSplit,
    absorb_together,
    check_rules,
    nonnegative_of,
    roles_of,
)
from flwr_admm.core.types import NON_FINITE, ClientRho
from flwr_admm.core.z_average import ZAverage
from flwr_admm.protocol import (
    NUM_CLIENTS_CACHED,
    NUM_EXAMPLES,
    NUM_RESYNCED,
    NUM_STOCK_REPLIES,
    RHO,
)
from flwr_admm.rounds.report import report_metrics
from flwr_admm.serverapp.base import ConsensusStrategy
from flwr_admm.serverapp.instructions import linearized_records, prox_records, train_message
from flwr_admm.serverapp.payloads import decoded_or_problem
from flwr_admm.serverapp.records import Layout, MetricsAggrFn, ReadReply, read_reply
from flwr_admm.uplink.channel import Residual, UplinkChannel
from flwr_admm.uplink.compression import Compressor
from flwr_admm.uplink.privacy import LocalDP

__all__ = ["FedADMM"]


class FedADMM(ConsensusStrategy):
    r"""Federated inexact consensus ADMM with server-held duals (Message API).

    The round (the reference for every module of the package), with u_i = y_i / rho_i
    the scaled dual of client i, p_i = n_i / sum_j n_j over every client seen:

        send  v_i = z - u_i, rho_i and z                 (center, penalty, start)
        w_i ~ argmin f_i(w) + rho_i/2 ||w - v_i||^2      (local solve, started at z)
        z'   = prox_{g/rho}(sum_i p_i (w_i + u_i))       (stale w_i, u_i of absent
        u_i += gamma (w_i - z')                           clients keep counting)

    The linearized form (``form="linearized"``, Scaffnew; `flwr_admm.core.linearized`
    derives it and its identity with SCAFFOLD option II) sends z and y_i instead of
    v_i, and takes rho_i = 1 / b_i from each reply's step budget b_i = K_i lr_i:

        w_i  = K_i steps w <- w - lr_i (grad f_i(w) + y_i) from z    (no prox term)
        z'   = sum_i p_i (rho_i w_i + y_i) / sum_i p_i rho_i,   y_i += rho_i (w_i - z')

    The core is `flwr_admm.core.ConsensusADMM` (over-relaxation, per-client rho,
    acceleration); the legacy `flwr_admm.server.FedADMM` runs the same round.

    Wire contract: what each sampled node gets is in `flwr_admm.serverapp.instructions`
    (prox form: v_i, z and rho_i). A reply carries one ArrayRecord (w_i) and one MetricRecord with
    ``num-examples``, optionally ``loss`` (f_i(w_i)), the client's key (``client-key``,
    else ``partition-id``, else the node id) and ``admm-started-at-z``, which our
    helpers (`flwr_admm.torch.TorchADMM`, `flwr_admm.clientapp.ADMMTrainStep`) set.
    A reply without it comes from a stock FedProx handler, which starts at v_i: with
    momentum SGD that start feeds the dual back into the drift and diverges, so such
    a node's dual is held at 0 and it runs FedProx's step around z
    (`flwr_admm.core.start_marks`, ``num_stock_replies``).

    Robustness: error replies count as ``num_failures``; replies with missing or extra
    records, other tensor names, shapes or non-numeric dtypes, NaN/inf, or a bad
    ``num-examples`` are rejected (``num_rejected``) and the round goes on (Flower's
    FedAvg would raise `InconsistentMessageReplies`). A key is accepted only from the
    node it was first accepted from (``num_key_conflicts``, `KeyBinding`). Nodes are
    sampled after waiting for ``min_available_nodes``; with ``sampling_seed`` the draw
    is reproducible and the same as the legacy strategy's.

    Parameters
    ----------
    fraction_train, fraction_evaluate, min_train_nodes, min_evaluate_nodes,
    min_available_nodes, weighted_by_key, arrayrecord_key, configrecord_key,
    train_metrics_aggr_fn, evaluate_metrics_aggr_fn
        As in Flower's Message-API `FedAvg`, and positional in its order; the rest is
        keyword-only (Flower's FedProx takes proximal_mu 11th: here a TypeError).
        ``train_metrics_aggr_fn`` sees the accepted replies only; where a name it
        returns is one of ours, ours wins; identity and protocol keys are dropped.
    rho, proximal_mu : float
        Penalty rho >= 0 (default 0.1); rho = 0 is FedAvg. ``proximal_mu`` is FedProx's
        name for it: give either (both: equal, else ValueError; `given_rho`).
    rho_schedule : RhoSchedule or str, optional
        `Constant`, `Geometric`, `StallIncrease`, `ResidualBalancing`, or a name.
        None (default): `ResidualBalancing()` from rho when rho > 0, else `Constant()`.
    regularizer : Regularizer, optional
        Server regularizer g (`L1`, `L2`); the z-step is its prox.
    client_rho : {"uniform", "data_size"}
        rho_i = rho or rho * n_i / max_j n_j.
    relaxation : float or None
        Over-relaxation alpha in (0, 2); 1 (default, also None) is plain ADMM.
    eps_abs, eps_rel : float
        Tolerances of Boyd's stopping thresholds eps_pri / eps_dual.
    acceleration : {None, "nesterov"}
        Fast ADMM with restart (Goldstein et al. 2014; `flwr_admm.core.acceleration`):
        z and the replying clients' duals are extrapolated between rounds, restarting
        from the current point when the combined residual grows. None (default) is
        plain ADMM. The defaults are measured on the CNN task and the convex ones
        (`flwr_admm.core.settings`, docs/tuning.md); ``**TEXTBOOK`` is the seeds'
        iteration, ``**FAST_CONVEX`` the faster one for full-batch convex clients.
    restart_eta : float
        Restart when c_k >= restart_eta c_{k-1}; in (0, 1].
    z_average : {"cached", "replies"}
        The z-step averages the last w_i of every client seen ("cached", default) or
        only the round's replies (as FedDyn): faster with partial participation
        (docs/peers.md), the same with every client replying. Fingerprinted if set.
    dual_step : float
        The dual step gamma in (0, 1]: y_i += gamma rho_i (w_i - z'); 1 is the textbook
        step. The default damps the feedback a noisy local solve (momentum SGD,
        minibatches) puts into its own dual (docs/torch.md); the fixed point is the same.
    stop_on_convergence : bool
        Sample no nodes once r <= eps_pri and s <= eps_dual.
    sampling_seed : int or None
        Seed of the node sample (None: Python's `random`, as Flower).
    checkpoint_dir, checkpoint_every, resume :
        The state (z, every cached w_i and dual, the sums, rho and its schedule, key
        bindings) after every `checkpoint_every` aggregations; with `resume` the
        strategy starts from it and continues bit-identically (`ConsensusStrategy`).
    key_binding, max_client_age, max_clients :
        Client identity and eviction: under ``"node"`` (default) a key is accepted
        only from its node; keys unheard for more than `max_client_age` rounds, or the
        least recently heard beyond `max_clients`, are evicted (their w_i and dual
        leave the sums).
    uplink, uplink_residual, local_dp :
        Uplink compression and local DP (`flwr_admm.uplink`): nodes send the
        compressed w_i - v_i under
        ``admm-payload`` (one uint8 tensor of bytes per model tensor) and the server
        rebuilds w_i = v_i + decode(payload); ``uplink_bytes`` and, with noise,
        ``dp_epsilon`` are reported every round.
    tensor_policy : mapping, optional
        ``{name pattern: role}`` over the ArrayRecord's tensor names, roles
        ``"consensus"`` (ADMM), ``"average"`` (FedAvg, no dual) or ``"keep"`` (never
        changed); unmatched tensors: integer dtypes keep, ``*running_mean`` /
        ``*running_var`` average, the rest consensus (`flwr_admm.core.tensor_policy`).
        The held (non-consensus) tensors are in the checkpoints too.
    health : HealthCheck or None
        Divergence watchdog (`flwr_admm.core.health`, `ConsensusStrategy`); None: off.
    form : {"prox", "linearized"} or Linearized
        The prox step around v_i ("prox", default, the seeds' iteration) or the
        linearized one above with a `Linearized`'s server steps ("linearized" is
        ``Linearized()``; `flwr_admm.core.linearized`). That form fixes rho,
        proximal_mu, rho_schedule, relaxation, dual_step, regularizer, client_rho and
        acceleration (given: ValueError), takes no uplink or local_dp, and rejects a
        reply without ``admm-step-budget`` (wire: `flwr_admm.serverapp.instructions`).

    Attributes
    ----------
    admm : ConsensusADMM or None
        The server state (built from the first z received).
    history : list of dict
        The round metrics of every aggregation, with ``round``.

    """

    label: ClassVar[str] = "FedADMM"
    counters: ClassVar[tuple[str, ...]] = (NUM_RESYNCED,)

    def __init__(
        self,
        fraction_train: float = 1.0,
        fraction_evaluate: float = 1.0,
        min_train_nodes: int = 2,
        min_evaluate_nodes: int = 2,
        min_available_nodes: int = 2,
        weighted_by_key: str = NUM_EXAMPLES,
        arrayrecord_key: str = "arrays",
        configrecord_key: str = "config",
        train_metrics_aggr_fn: MetricsAggrFn | None = None,
        evaluate_metrics_aggr_fn: MetricsAggrFn | None = None,
        *,
        rho: float | None = None,
        proximal_mu: float | None = None,
        rho_schedule: RhoSchedule | str | None = None,
        regularizer: Regularizer | None = None,
        client_rho: ClientRho = "uniform",
        relaxation: float | None = None,
        eps_abs: float = 1e-6,
        eps_rel: float = 1e-4,
        acceleration: str | None = DEFAULT_ACCELERATION,
        restart_eta: float = DEFAULT_ETA,
        z_average: ZAverage = "cached",
        dual_step: float | None = None,
        stop_on_convergence: bool = False,
        sampling_seed: int | None = 0,
        checkpoint_dir: str | os.PathLike[str] | None = None,
        checkpoint_every: int = 1,
        resume: bool = True,
        key_binding: str = "node",
        max_client_age: int | None = None,
        max_clients: int | None = None,
        uplink: Compressor | None = None,
        uplink_residual: Residual = "update",
        local_dp: LocalDP | None = None,
        tensor_policy: Mapping[str, str] | None = None,
        health: HealthCheck | None = DEFAULT_HEALTH,
        form: FormSpec = "prox",
    ) -> None:
        self.form = check_form(form)
        self.tensor_rules = check_rules(tensor_policy)
        self.tensors: TensorSplit | None = None  # the non-consensus tensors, from the first z
        super().__init__(
            fedavg={
                "fraction_train": fraction_train,
                "fraction_evaluate": fraction_evaluate,
                "min_train_nodes": min_train_nodes,
                "min_evaluate_nodes": min_evaluate_nodes,
                "min_available_nodes": min_available_nodes,
                "weighted_by_key": weighted_by_key,
                "arrayrecord_key": arrayrecord_key,
                "configrecord_key": configrecord_key,
                "train_metrics_aggr_fn": train_metrics_aggr_fn,
                "evaluate_metrics_aggr_fn": evaluate_metrics_aggr_fn,
            },
            stop_on_convergence=stop_on_convergence,
            sampling_seed=sampling_seed,
            checkpoint_dir=checkpoint_dir,
            checkpoint_every=checkpoint_every,
            key_binding=key_binding,
            max_client_age=max_client_age,
            max_clients=max_clients,
            health=health,
        )
        self.admm_settings = strategy_settings(
            form,
            {"rho": rho, "proximal_mu": proximal_mu, "rho_schedule": rho_schedule},
            regularizer=regularizer,
            client_rho=client_rho,
            eps_abs=eps_abs,
            eps_rel=eps_rel,
            relaxation=relaxation,
            acceleration=acceleration,
            restart_eta=restart_eta,
            z_average=z_average,
            dual_step=dual_step,
            channel={"uplink": uplink, "local_dp": local_dp},
        )
        self.channel = UplinkChannel(uplink, local_dp, uplink_residual)
        self.admm: ConsensusADMM | None = None
        self._sent_key: dict[str, str | None] = {}  # node id -> key whose center it got
        self._sent_rho: dict[str, float] = {}  # node id -> the rho_i of that center
        self.marks = StartMarks()  # stock FedProx handlers: their duals are held at 0
        self._resume(resume)

    def summary(self) -> None:
        """Log the ADMM settings, then FedAvg's."""
        s = self.admm_settings
        log(INFO, "\t├──> FedADMM settings:")
        log(INFO, "\t│\t├── rho: %s (%s)", s.rho, type(s.rho_schedule).__name__)
        log(INFO, "\t│\t├── regularizer: %s, client_rho: %s", s.regularizer, s.client_rho)
        log(INFO, "\t│\t├── relaxation: %s, acceleration: %s", s.relaxation, s.acceleration)
        log(INFO, "\t│\t├── form: %s", self.form)
        log(INFO, "\t│\t└── dual_step: %s, sampling_seed: %s", s.dual_step, self.sampling_seed)
        super().summary()

    # ------------------------------------------------------------------ train
    def _train_messages(
        self, sampled: list[int], arrays: ArrayRecord, user: dict[str, Any], server_round: int
    ) -> list[Message]:
        """Send each sampled node its center v_i = z - y_i / rho_i, rho_i and z (the start)."""
        assert self.admm is not None
        admm, messages = self.admm, []
        user = {**user, **self.channel.config()}
        self.channel.sampled(len(sampled), self.population)
        keys = (self.arrayrecord_key, self.configrecord_key)
        x = admm.start_point()  # z, or the linearized form's momentum start
        start = arrays if x is admm.z else self._record(self._merge(x))
        for node_id in sampled:
            key = self.binding.key_of.get(str(node_id))
            self._sent_key[str(node_id)] = key if key in admm.records else None
            if self.form == "linearized":  # z, y_i
                assert self.layout is not None
                spec = (self._split(), self.layout, key, start, user, server_round, keys)
                records = linearized_records(admm, *spec)
            else:
                center, rho_i = admm.center(key), admm.rho_for(key)  # v_i = z - y_i / rho_i
                self._sent_rho[str(node_id)] = rho_i
                payload = arrays if center is admm.z else self._record(self._merge(center))
                records = prox_records(payload, arrays, rho_i, user, server_round, keys)
            messages.append(train_message(records, node_id, server_round))
        return messages

    def _read(self, message: Message) -> ReadReply:
        """Read w_i (v_i + decode(payload) when compressed), n_i, f_i(w_i)."""
        assert self.layout is not None
        sent = partial(self._center_sent_to, str(message.metadata.src_node_id))
        plain = decoded_or_problem(
            message, self.layout, self.channel, sent, self.arrayrecord_key, add_center=True
        )
        if isinstance(plain, ReadReply):
            return plain
        return read_reply(plain, self.layout, self.weighted_by_key)

    def _center_sent_to(self, node: str) -> list[Any]:
        """Return the center node `node` was sent this round (with its rho_i), as received."""
        assert self.admm is not None and self.layout is not None
        admm, key = self.admm, self._sent_key.get(node)
        center = admm.center(key, self._sent_rho.get(node, admm.rho_for(key)))  # as sent
        return [
            np.asarray(np.asarray(c, dtype=d), dtype=np.float64)
            for c, d in zip(self._merge(center), self.layout.dtypes, strict=True)
        ]

    def _open_round(self, keys: list[str]) -> None:
        assert self.admm is not None
        self.admm.begin(keys)
        self._split().begin()
        self.marks.begin()

    def _fold_reply(self, reply: ReadReply, server_round: int, counts: dict[str, int]) -> bool:
        """Absorb w_i, n_i, f_i(w_i) of an admitted reply (NaN/inf found here: rejected)."""
        return self._fold_all([reply], server_round, counts)[0]

    def _fold_all(
        self, replies: list[ReadReply], server_round: int, counts: dict[str, int]
    ) -> list[bool]:
        """Check every reply, then absorb the usable ones together (`absorb_together`)."""
        assert self.admm is not None
        prepared = [self._prepared(r, counts) for r in replies]
        usable = [p for p in prepared if p is not None]
        refuse = partial(self._reject, problem=NON_FINITE, counts=counts)
        folded = iter(absorb_together(self.admm.absorb_all, self._split(), usable, refuse))
        return [p is not None and next(folded) for p in prepared]

    def _prepared(self, r: ReadReply, counts: dict[str, int]) -> tuple[Reply, list[Any]] | None:
        """Return a reply's consensus part and all its arrays; None if skipped or rejected."""
        assert self.admm is not None
        cached = self.admm.rho > 0 and r.key in self.admm.records
        if cached and self._sent_key.get(str(r.node_id)) != r.key:
            # trained around another center (key_binding="reported", new node id): resync
            log(INFO, "FedADMM: %s re-identified under node %s; resynced", r.key, r.node_id)
            self.binding.bind(r.key, str(r.node_id), self._clock)
            counts[NUM_RESYNCED] += 1
            return None
        split = self._split()
        why = split.problem(r.arrays)  # the core checks the consensus tensors only
        if why is not None:
            self._reject(r.key, why, counts)
            return None
        scale = None
        if self.form == "linearized":  # rho_i = 1 / b_i, b_i the reply's step budget
            scale, why = budget_scale(r.metrics)
            if why is not None:
                self._reject(r.key, why, counts)
                return None
        else:
            self.marks.read(r.key, r.metrics, self.admm.rho)
        sq_norm = r.sq_norm if split.trivial else None
        w = split.consensus(r.arrays)
        return Reply(r.key, w, r.num_examples, r.loss, sq_norm, scale), r.arrays

    def _finish_round(self, server_round: int) -> dict[str, Any]:
        """Take the z-step and the dual step; return the residuals and the next rho."""
        assert self.admm is not None
        report = self.admm.finish(server_round)
        self._split().finish()
        self.converged = report.converged
        stock = self.marks.settle(self.admm, partial(log, WARNING, "FedADMM: %s"))  # y_i = 0
        return {
            **report_metrics(report),
            NUM_STOCK_REPLIES: stock,
            **self.channel.round_metrics(aggregated=True),
        }

    def _discard_round(self) -> dict[str, Any]:
        assert self.admm is not None
        self.admm.cancel()
        self._split().begin()
        idle = {RHO: self.admm.rho, NUM_CLIENTS_CACHED: len(self.admm.records)}
        return {**idle, **self.channel.round_metrics(aggregated=False)}

    def _evict(self, keys: list[str]) -> int:
        gone = set(keys)
        self.marks.forget(gone)
        self._sent_key = {n: None if k in gone else k for n, k in self._sent_key.items()}
        return 0 if self.admm is None else len(self.admm.evict(keys))

    # ------------------------------------------------------------------ state
    def _adopt(self, arrays: ArrayRecord) -> None:
        """Take the received ArrayRecord as z (the first one fixes the layout)."""
        if self.layout is None:
            self.layout = Layout.of(arrays)
        z = self.layout.read(arrays)
        if self.admm is None or self.tensors is None:
            roles = roles_of(self.tensor_rules, self.layout.names, self.layout.dtypes)
            self.tensors = TensorSplit(roles, z, nonnegative_of(self.layout.names))
            self.admm = self.admm_settings.new_admm(self.tensors.consensus(z))
        else:
            self.tensors.adopt(z)
            self.admm.adopt_consensus(self.tensors.consensus(z))

    def _split(self) -> TensorSplit:
        assert self.tensors is not None
        return self.tensors

    def _merge(self, consensus: list[Any]) -> list[Any]:
        """Return the full tensor list: the core's consensus tensors and the held ones."""
        return self._split().merge(consensus)

    def _broadcast(self) -> ArrayRecord:
        assert self.admm is not None
        return self._record(self._merge(self.admm.z))

    def _record(self, arrays: list[Any]) -> ArrayRecord:
        assert self.layout is not None
        return self.layout.record(arrays)

    # ------------------------------------------------------------- checkpoints
    def configuration(self) -> dict[str, Any]:
        """Return rho, rho_schedule, regularizer, client_rho, eps, relaxation (JSON)."""
        rules = [list(r) for r in self.tensor_rules]
        return {
            **({"tensor_policy": rules} if rules else {}),
            "strategy": self.label,
            **({} if self.form == "prox" else {"form": self.form}),  # prox: as before
            **self.admm_settings.describe(),
            **self.channel.describe(),
        }

    def _state_dict(self) -> tuple[dict[str, NDArray[Any]], dict[str, Any]]:
        """Return z, every cached w_i and dual, the sums, rho and the schedule state."""
        assert self.admm is not None
        arrays, manifest = snapshot(self.admm, self._split())
        ledger = self.channel.ledger
        return arrays, {**manifest, "privacy": ledger.state_dict() if ledger is not None else {}}

    def _load_state_dict(self, arrays: dict[str, NDArray[Any]], manifest: dict[str, Any]) -> None:
        self.admm, self.tensors = restore(self.admm_settings, arrays, manifest)
        if self.channel.ledger is not None:
            self.channel.ledger.load_state_dict(manifest.get("privacy", {}))
