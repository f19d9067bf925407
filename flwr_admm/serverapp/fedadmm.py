"""FedADMM for Flower's Message API: a drop-in for `flwr.serverapp.strategy.FedProx`."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from functools import partial
from logging import INFO, WARNING
from typing import Any

from flwr.app import (
    ArrayRecord,
    ConfigRecord,
    Message,
    MessageType,
    MetricRecord,
    RecordDict,
)
from flwr.common.logger import log
from flwr.serverapp import Grid
from flwr.serverapp.strategy import FedAvg

from flwr_admm.core import ConsensusADMM, Reply, RhoSchedule
from flwr_admm.core.acceleration import DEFAULT_ETA
from flwr_admm.core.regularizers import Regularizer
from flwr_admm.core.settings import (
    DEFAULT_ACCELERATION,
    SETTING_VIEWS,
    ConsensusSettings,
    SettingView,
    strategy_defaults,
)
from flwr_admm.core.types import NON_FINITE, ClientRho, NonFiniteReplyError
from flwr_admm.protocol import (
    MESSAGE_PROXIMAL_MU,
    MESSAGE_SERVER_ROUND,
    NUM_CLIENTS_CACHED,
    NUM_EVICTED,
    NUM_EXAMPLES,
    NUM_FAILURES,
    NUM_KEY_CONFLICTS,
    NUM_REJECTED,
    RHO,
    ROUND,
)
from flwr_admm.server.identity import KeyBinding
from flwr_admm.server.report import report_metrics
from flwr_admm.server.sampling import sample_ids
from flwr_admm.serverapp.config import check_fields, copy_config, refuse_planned
from flwr_admm.serverapp.nodes import admit, wait_for_nodes
from flwr_admm.serverapp.records import (
    Layout,
    ReadReply,
    has_weight,
    merge_metrics,
    plain_metrics,
    read_reply,
)

__all__ = ["FedADMM"]

MetricsAggrFn = Callable[[list[RecordDict], str], MetricRecord]


class FedADMM(FedAvg):
    r"""Federated inexact consensus ADMM with server-held duals (Message API).

    Same math and numpy core (`flwr_admm.core.ConsensusADMM`) as the legacy
    `flwr_admm.FedADMM`: identical replies give identical iterates. Per round k,
    with u_i = y_i / rho_i the scaled dual of client i:

        v_i  = z - u_i                                   (center sent to node i)
        w_i ~ argmin f_i(w) + rho_i/2 ||w - v_i||^2      (the node's local solve)
        z'   = prox_{g/rho}(sum_i p_i (w_i + u_i)),  u_i += w_i - z'

    Wire contract (what Flower's Message-API ``FedProx`` client already does): each
    sampled node gets its own center v_i under ``arrays`` (same tensor names, dtypes
    and shapes as the global model) and, in ``config``, a copy of the given config
    plus ``rho`` and ``proximal-mu`` (both rho_i) and ``server-round``. So an
    unmodified FedProx-style ``@app.train()`` handler (start at the received arrays,
    add proximal-mu/2 ||w - received||^2) runs a valid inexact ADMM w-step. A reply
    carries one ArrayRecord (w_i) and one MetricRecord with ``num-examples`` (a
    positive int), optionally ``loss`` (f_i(w_i)) and the client's key:
    ``client-key`` (int), else ``partition-id``, else the sending node's id.

    Robustness: error replies count as ``num_failures``; replies with missing or extra
    records, other tensor names, shapes or non-numeric dtypes, NaN/inf, or a bad
    ``num-examples`` are rejected (``num_rejected``) and the round goes on (Flower's
    FedAvg would raise `InconsistentMessageReplies`). A key is accepted only from the
    node it was first accepted from (``num_key_conflicts``; see
    `flwr_admm.server.identity.KeyBinding`); replies sharing a key are rejected.
    Nodes are sampled after waiting for ``min_available_nodes`` (FedAvg sizes the
    sample before waiting); with ``sampling_seed`` the draw is reproducible and the
    same as the legacy strategy's.

    Parameters
    ----------
    fraction_train, fraction_evaluate, min_train_nodes, min_evaluate_nodes,
    min_available_nodes, weighted_by_key, arrayrecord_key, configrecord_key,
    train_metrics_aggr_fn, evaluate_metrics_aggr_fn
        As in Flower's Message-API `FedAvg`. ``train_metrics_aggr_fn`` sees the
        accepted replies only; where a name it returns is one of ours, ours wins.
    rho : float
        Penalty rho >= 0; rho = 0 is FedAvg.
    rho_schedule : RhoSchedule or str, optional
        `Constant`, `Geometric`, `StallIncrease`, `ResidualBalancing`, or a name.
        None (default): `ResidualBalancing()` from rho when rho > 0, else `Constant()`.
    regularizer : Regularizer, optional
        Server regularizer g (`L1`, `L2`); the z-step is its prox.
    client_rho : {"uniform", "data_size"}
        rho_i = rho or rho * n_i / max_j n_j.
    relaxation : float or None
        Over-relaxation alpha in (0, 2); 1 is plain ADMM. None (default): 1.6 when
        rho > 0, else 1.
    eps_abs, eps_rel : float
        Tolerances of Boyd's stopping thresholds eps_pri / eps_dual.
    acceleration : {None, "nesterov", "goldstein"}
        Fast ADMM with restart (Goldstein et al. 2014; `flwr_admm.core.acceleration`):
        z and the replying clients' duals are extrapolated between rounds, restarting
        when the combined residual grows; "nesterov" restarts from the current point
        (use it with partial participation), "goldstein" from the previous one.
        "nesterov" by default; None is plain ADMM. No effect with rho = 0.
        Defaults measured with ``python -m benchmarks.defaults`` (docs/tuning.md); the
        textbook iteration is ``rho_schedule=Constant(), relaxation=1,
        acceleration=None``.
    restart_eta : float
        Restart when c_k >= restart_eta c_{k-1}; in (0, 1].
    stop_on_convergence : bool
        Sample no nodes once r <= eps_pri and s <= eps_dual.
    sampling_seed : int or None
        Seed of the node sample (None: Python's `random`, as Flower).

    Not yet supported here (planned; use the legacy `flwr_admm.FedADMM`): checkpoints
    (``checkpoint_dir``, ``checkpoint_every``, ``resume``), uplink compression
    (``uplink``, ``uplink_residual``), local DP (``local_dp``) and eviction
    (``max_client_age``, ``max_clients``): passing one raises ValueError.

    Attributes
    ----------
    admm : ConsensusADMM or None
        The server state (built from the first z received).
    history : list of dict
        The round metrics of every aggregation, with ``round``.

    """

    # Read-only views of `admm_settings` (`ConsensusSettings`), the core's settings.
    rho, rho_schedule, regularizer, client_rho, eps_abs, eps_rel, relaxation = SETTING_VIEWS
    acceleration: SettingView[str | None] = SettingView()
    restart_eta: SettingView[float] = SettingView()

    def __init__(
        self,
        *,
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
        rho: float = 1.0,
        rho_schedule: RhoSchedule | str | None = None,
        regularizer: Regularizer | None = None,
        client_rho: ClientRho = "uniform",
        relaxation: float | None = None,
        eps_abs: float = 1e-6,
        eps_rel: float = 1e-4,
        acceleration: str | None = DEFAULT_ACCELERATION,
        restart_eta: float = DEFAULT_ETA,
        stop_on_convergence: bool = False,
        sampling_seed: int | None = 0,
        **planned: Any,
    ) -> None:
        refuse_planned(planned)
        super().__init__(
            fraction_train=fraction_train,
            fraction_evaluate=fraction_evaluate,
            min_train_nodes=min_train_nodes,
            min_evaluate_nodes=min_evaluate_nodes,
            min_available_nodes=min_available_nodes,
            weighted_by_key=weighted_by_key,
            arrayrecord_key=arrayrecord_key,
            configrecord_key=configrecord_key,
            train_metrics_aggr_fn=train_metrics_aggr_fn,
            evaluate_metrics_aggr_fn=evaluate_metrics_aggr_fn,
        )
        check_fields(self, sampling_seed)
        schedule, alpha = strategy_defaults(rho, rho_schedule, relaxation)
        self.admm_settings = ConsensusSettings(
            rho=rho,
            rho_schedule=schedule,
            regularizer=regularizer,
            client_rho=client_rho,
            eps_abs=eps_abs,
            eps_rel=eps_rel,
            relaxation=alpha,
            acceleration=acceleration,
            restart_eta=restart_eta,
        )
        self.stop_on_convergence = bool(stop_on_convergence)
        self.sampling_seed = None if sampling_seed is None else int(sampling_seed)
        self.admm: ConsensusADMM | None = None
        self.layout: Layout | None = None
        self.binding = KeyBinding("node")
        self.history: list[dict[str, Any]] = []
        self.converged = False
        self._clock = 0  # rounds begun

    def summary(self) -> None:
        """Log the ADMM settings, then FedAvg's."""
        log(INFO, "\t├──> FedADMM settings:")
        log(INFO, "\t│\t├── rho: %s (%s)", self.rho, type(self.rho_schedule).__name__)
        log(INFO, "\t│\t├── regularizer: %s, client_rho: %s", self.regularizer, self.client_rho)
        log(INFO, "\t│\t├── relaxation: %s, acceleration: %s", self.relaxation, self.acceleration)
        log(INFO, "\t│\t└── sampling_seed: %s", self.sampling_seed)
        super().summary()

    # ------------------------------------------------------------------ train
    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> list[Message]:
        """Adopt z, wait for the nodes, sample them, send each its center v_i and rho_i."""
        user = copy_config(config, check=True)  # Strategy.start reuses `config` every round
        admm = self._adopt(arrays)
        self._clock += 1
        if self.stop_on_convergence and self.converged:
            log(INFO, "FedADMM: converged (r <= eps_pri, s <= eps_dual); no nodes sampled")
            return []
        if self.fraction_train == 0.0:
            return []
        messages = []
        sampled = self._sample(grid, server_round, self.fraction_train, self.min_train_nodes, True)
        for node_id in sampled:
            key = self.binding.key_of.get(str(node_id))
            center, rho_i = admm.center(key), admm.rho_for(key)  # v_i = z - y_i / rho_i
            payload = arrays if center is admm.z else self._record(center)
            node_config = ConfigRecord(
                {**user, RHO: rho_i, MESSAGE_PROXIMAL_MU: rho_i, MESSAGE_SERVER_ROUND: server_round}
            )
            records: dict[str, ArrayRecord | ConfigRecord | MetricRecord] = {
                self.arrayrecord_key: payload,
                self.configrecord_key: node_config,
            }
            messages.append(
                Message(RecordDict(records), dst_node_id=node_id, message_type=MessageType.TRAIN)
            )
        return messages

    def aggregate_train(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """Fold the usable replies in client-key order; return z' and the round metrics."""
        counts = {NUM_FAILURES: 0, NUM_REJECTED: 0, NUM_KEY_CONFLICTS: 0, NUM_EVICTED: 0}
        if self.admm is None or self.layout is None:
            return None, None
        usable: list[ReadReply] = []
        for message in replies:
            if message.has_error():
                counts[NUM_FAILURES] += 1
                log(INFO, "FedADMM: error reply from node %s", message.metadata.src_node_id)
                continue
            reply = read_reply(message, self.layout, self.weighted_by_key)
            if reply.problem is None:
                usable.append(reply)
            else:
                self._reject(reply.key, reply.problem, counts)
        admitted, freed = admit(usable, self.binding, partial(self._refuse, counts))
        if freed:  # their nodes left: new nodes start fresh under these keys
            counts[NUM_EVICTED] = len(self.admm.evict(freed))
            self.binding.forget(freed)
        accepted = self._fold(admitted, counts)
        if not accepted:
            log(WARNING, "FedADMM round %s: no usable reply; state unchanged", server_round)
            self.admm.cancel()
            idle = {RHO: self.admm.rho, NUM_CLIENTS_CACHED: len(self.admm.records)}
            return None, plain_metrics({**counts, **idle})
        contents = [r.content for r in accepted if r.content is not None]
        ours = {**self._finish(server_round), **counts}
        metrics = merge_metrics(self.train_metrics_aggr_fn, contents, self.weighted_by_key, ours)
        self.history.append({ROUND: server_round, **metrics})
        return self._record(self.admm.z), metrics

    def _fold(self, admitted: list[ReadReply], counts: dict[str, int]) -> list[ReadReply]:
        """Absorb w_i, n_i, f_i(w_i) of each admitted reply (natural key order)."""
        assert self.admm is not None
        self.admm.begin([r.key for r in admitted])
        accepted = []
        for r in admitted:
            try:
                self.admm.absorb(Reply(r.key, r.arrays, r.num_examples, r.loss, r.sq_norm))
            except NonFiniteReplyError:  # found while folding it in; state rolled back
                self._reject(r.key, NON_FINITE, counts)
                continue
            self.binding.bind(r.key, str(r.node_id), self._clock)
            accepted.append(r)
        return accepted

    def _finish(self, server_round: int) -> dict[str, Any]:
        """Take the z-step and the dual step; return the residuals and the next rho."""
        assert self.admm is not None
        report = self.admm.finish(server_round)
        self.converged = report.converged
        return report_metrics(report)

    def _reject(self, key: str, problem: str, counts: dict[str, int]) -> None:
        log(WARNING, "FedADMM: rejected reply of %s: %s", key, problem)
        counts[NUM_REJECTED] += 1

    def _refuse(self, counts: dict[str, int], key: str, problem: str, conflict: bool) -> None:
        """Reject a reply `KeyBinding.admit` refused; count key conflicts too."""
        self._reject(key, problem, counts)
        counts[NUM_KEY_CONFLICTS] += int(conflict)

    # --------------------------------------------------------------- evaluate
    def configure_evaluate(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> list[Message]:
        """Send z and a copy of `config` (with ``server-round``) to sampled nodes."""
        if self.fraction_evaluate == 0.0:
            return []
        sampled = self._sample(grid, server_round, self.fraction_evaluate, self.min_evaluate_nodes)
        node_config = ConfigRecord({**copy_config(config), MESSAGE_SERVER_ROUND: server_round})
        content = RecordDict({self.arrayrecord_key: arrays, self.configrecord_key: node_config})
        return [
            Message(content=content, dst_node_id=n, message_type=MessageType.EVALUATE)
            for n in sampled
        ]

    def aggregate_evaluate(
        self, server_round: int, replies: Iterable[Message]
    ) -> MetricRecord | None:
        """Aggregate the replies with one MetricRecord and a positive weight; never raise."""
        key = self.weighted_by_key
        usable = [m.content for m in replies if not m.has_error() and has_weight(m, key)]
        if not usable:
            return None
        try:
            return self.evaluate_metrics_aggr_fn(usable, self.weighted_by_key)
        except Exception as error:  # a user function must not end the run
            log(WARNING, "FedADMM: evaluate_metrics_aggr_fn failed (%r)", error)
            return None

    # ------------------------------------------------------------------ nodes
    def _sample(
        self, grid: Grid, server_round: int, fraction: float, minimum: int, train: bool = False
    ) -> list[int]:
        """Wait for the nodes, THEN size the sample from those connected; draw it.

        A train round also tells the key binding who is connected (a key whose node
        is gone may then be taken over by a new node).
        """
        node_ids = wait_for_nodes(grid, max(self.min_available_nodes, minimum))
        size = max(int(len(node_ids) * fraction), minimum)
        if train:
            self.binding.connected(str(n) for n in node_ids)
        key_of = self.binding.key_of
        sampled = sample_ids(node_ids, size, server_round, self.sampling_seed, key_of)
        log(INFO, "FedADMM: sampled %s nodes (out of %s)", len(sampled), len(node_ids))
        return sampled

    # ------------------------------------------------------------------ state
    def _adopt(self, arrays: ArrayRecord) -> ConsensusADMM:
        """Take the received ArrayRecord as z (the first one fixes the layout)."""
        if self.layout is None:
            self.layout = Layout.of(arrays)
        z = self.layout.read(arrays)
        if self.admm is None:
            self.admm = self.admm_settings.new_admm(z)
        else:
            self.admm.adopt_consensus(z)
        return self.admm

    def _record(self, arrays: list[Any]) -> ArrayRecord:
        assert self.layout is not None
        return self.layout.record(arrays)
