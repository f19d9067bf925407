"""FedADMMClientDuals for Flower's Message API: consensus ADMM, the duals kept by the nodes."""

from __future__ import annotations

import os
from logging import INFO
from typing import Any, ClassVar

from flwr.app import (
    ArrayRecord,
    ConfigRecord,
    Message,
    MessageType,
    RecordDict,
)
from flwr.common.logger import log
from numpy.typing import NDArray

from flwr_admm.core.acceleration import DEFAULT_ETA
from flwr_admm.core.dual_momentum import fast_config
from flwr_admm.core.health import DEFAULT_HEALTH, HealthCheck
from flwr_admm.core.kernels import single_thread_blas
from flwr_admm.core.linearized import FormSpec, check_form, client_held_steps
from flwr_admm.core.regularizers import Regularizer
from flwr_admm.core.settings import given_rho
from flwr_admm.core.types import Arrays
from flwr_admm.protocol import (
    ACCEL_Z_RECORD,
    FORM,
    FORM_LINEARIZED,
    MESSAGE_SERVER_ROUND,
    MODE_CLIENT,
    MODE_KEY,
    NUM_EXAMPLES,
    NUM_RESYNCED,
    NUM_STATE_MISMATCH,
    PREVIOUS_ROUND,
    RHO,
    SHARE_RECORD,
)
from flwr_admm.rounds.client_duals_replies import (
    RoundStats,
)
from flwr_admm.rounds.client_duals_state import STRATEGY, ClientDualsState
from flwr_admm.serverapp.base import ConsensusStrategy
from flwr_admm.serverapp.payloads import decoded_or_problem
from flwr_admm.serverapp.records_old import Layout, MetricsAggrFn, ReadReply, read_reply
from flwr_admm.uplink.channel import UplinkChannel
from flwr_admm.uplink.compression import Compressor, checked_uplink

__all__ = ["FedADMMClientDuals"]


class FedADMMClientDuals(ConsensusStrategy):
    r"""Federated consensus ADMM with client-held duals (Message API).

    The protocol, math and server arithmetic of the legacy `flwr_admm.server.FedADMMClientDuals`
    (read its module docstring; `flwr_admm.rounds.client_duals_replies`,
    `flwr_admm.rounds.client_duals_sweep`): node i keeps w_i and its scaled dual u_i in
    its ``context.state``; the server keeps z, S = sum_i n_i c_i (c_i = w_i + u_i),
    N = sum_i n_i and, per client key, n_i and the round it last took part in. Round k:

        node    if it took part before:  u_i += gamma (w_i - z^k)
                w_i' ~ argmin f_i(w) + rho/2 ||w - (z^k - u_i)||^2
                sends Delta_i = n_i' (w_i' + u_i) - n_i c_i
        server  S += Delta_i, N += n_i' - n_i,  z^{k+1} = prox_{g/rho}(S / N)

    Wire (Message API). Each sampled node gets z^k under ``arrays`` (one record for
    all) and, in ``config``, a copy of the given config plus ``rho``, ``server-round``,
    ``admm-duals`` = "client", ``admm-ack-round`` (the round whose contribution S holds
    for its key, 0: none) and ``admm-rebuild`` (1 while the rebuild sweep needs its full
    share). A reply carries Delta_i under ``arrays`` (the model's tensor names and
    shapes, any real dtype: send float64, it is a change of a sum), with
    ``admm-rebuild`` = 1 also sigma_i' = n_i' c_i' under ``admm-share``, and one
    MetricRecord with ``num-examples`` and the protocol metrics (``admm-previous-round``,
    ``admm-examples-change``, ``admm-w-sq-norm``, ``admm-u-sq-norm``,
    ``admm-delayed-sq-residual``, ``admm-resync``) and the client key as in `FedADMM`.
    `flwr_admm.clientapp.make_client_app` and `flwr_admm.clientapp.ADMMTrainStep` speak it.

    Acknowledgement, state-mismatch rejection (``num_state_mismatch``), resync
    (``num_resynced``) and the rebuild sweep (``rebuilding``) are the legacy ones, as are
    the round metrics. Bad replies (error replies: ``num_failures``; missing arrays,
    other names, shapes or dtypes, NaN/inf, a bad ``num-examples``, missing or
    inconsistent protocol metrics: ``num_rejected``) never touch S; the run goes on.

    Parameters
    ----------
    fraction_train, fraction_evaluate, min_train_nodes, min_evaluate_nodes,
    min_available_nodes, weighted_by_key, arrayrecord_key, configrecord_key,
    train_metrics_aggr_fn, evaluate_metrics_aggr_fn
        As in Flower's Message-API `FedAvg`, and positional in its order; the rest is
        keyword-only (Flower's FedProx takes proximal_mu 11th: here a TypeError).
        Metrics as in `FedADMM` (identity and protocol keys dropped).
    rho, proximal_mu : float
        Constant penalty rho > 0 (default 1). ``proximal_mu`` is FedProx's name for
        it: give either (both: equal, else ValueError; `given_rho`).
    regularizer : Regularizer, optional
        Server regularizer g (`L1`, `L2`); the z-step is prox_{g/rho}(S / N).
    eps_abs, eps_rel, stop_on_convergence, sampling_seed :
        As in `FedADMM` (convergence uses the delayed primal residual).
    checkpoint_dir, checkpoint_every, resume :
        Checkpoints of z, S, N, the per-key entries and the sweep (the legacy format).
        The duals stay on the nodes: a resumed run continues exactly if they kept
        their ``context.state``; a node that lost it resynchronizes.
    key_binding, max_client_age, max_clients :
        Identity and eviction as in `FedADMM`; an evicted key's share leaves S
        through the rebuild sweep.
    uplink : Compressor, optional
        Uplink compression of Delta_i with error feedback, as in the legacy class (each
        node keeps its residual e_i; S = sum_i n_i c_i - sum_i e_i). The node sends the
        payload under ``admm-payload`` (one uint8 tensor of bytes per model tensor)
        instead of ``arrays``; ``uplink_bytes`` counts the payload bytes per round.
    acceleration, restart_eta :
        Fast ADMM with restart, as in the legacy class (`flwr_admm.core.dual_momentum`):
        the server extrapolates z and sends z_k under ``admm-accel-z`` with the
        coefficient g; each node extrapolates its own dual.
    rho_schedule, client_rho, relaxation :
        Accepted only at their defaults (None, "uniform", 1), as in the legacy
        class (`flwr_admm.rounds.client_duals_settings`).
    dual_step : float in (0, 1]
        The clients' dual step gamma: u_i += gamma (w_i - z^k), sent as
        ``admm-dual-step`` when it is not 1 (as `FedADMM`'s ``dual_step``; the same
        fixed point).

    health : HealthCheck or None
        Divergence watchdog, as in `FedADMM` (`flwr_admm.core.health`); None: off.

    """

    label: ClassVar[str] = STRATEGY
    counters: ClassVar[tuple[str, ...]] = (NUM_STATE_MISMATCH, NUM_RESYNCED)

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
        regularizer: Regularizer | None = None,
        eps_abs: float = 1e-6,
        eps_rel: float = 1e-4,
        stop_on_convergence: bool = False,
        sampling_seed: int | None = 0,
        rho_schedule: Any = None,
        client_rho: str = "uniform",
        relaxation: float = 1.0,
        dual_step: float = 1.0,
        acceleration: str | None = None,
        restart_eta: float = DEFAULT_ETA,
        checkpoint_dir: str | os.PathLike[str] | None = None,
        checkpoint_every: int = 1,
        resume: bool = True,
        uplink: Compressor | None = None,
        key_binding: str = "node",
        max_client_age: int | None = None,
        max_clients: int | None = None,
        health: HealthCheck | None = DEFAULT_HEALTH,
        form: FormSpec = "prox",
    ) -> None:
        self.form = check_form(form)
        if self.form == "linearized":  # rho = 1: rho_i = 1 / b_i on the nodes
            given: dict[str, object] = {"rho": rho, "proximal_mu": proximal_mu}
            given.update(regularizer=regularizer, rho_schedule=rho_schedule, uplink=uplink)
            given.update(client_rho=client_rho, relaxation=relaxation, dual_step=dual_step)
            dual_step, rho = client_held_steps(form, {**given, "acceleration": acceleration})
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
        self.state = ClientDualsState(
            rho=given_rho(rho, proximal_mu),
            regularizer=regularizer,
            eps_abs=eps_abs,
            eps_rel=eps_rel,
            acceleration=acceleration,
            restart_eta=restart_eta,
            rho_schedule=rho_schedule,
            client_rho=client_rho,
            relaxation=relaxation,
            dual_step=dual_step,
            restores=self.form == "prox" and uplink is None,  # c_i is then the whole state
            linearized=self.form == "linearized",
        )
        self.channel = UplinkChannel(checked_uplink(uplink))
        self._sent_record: ArrayRecord | None = None  # what we returned last (z in the layout)
        self._resume(resume)

    def __repr__(self) -> str:
        state = self.state
        return f"FedADMMClientDuals(rho={state.rho}, regularizer={state.regularizer!r})"

    @property
    def z(self) -> Arrays | None:
        """The consensus the next round sends (z^_{k+1} with fast ADMM)."""
        return self.state.z

    def summary(self) -> None:
        """Log the ADMM settings, then FedAvg's."""
        log(INFO, "\t├──> FedADMMClientDuals settings (duals held by the nodes):")
        log(INFO, "\t│\t└── rho: %s, regularizer: %s", self.state.rho, self.state.regularizer)
        super().summary()

    # ------------------------------------------------------------------ train
    def _train_messages(
        self, sampled: list[int], arrays: ArrayRecord, user: dict[str, Any], server_round: int
    ) -> list[Message]:
        """Send z^k (one record for all), rho, and each node's ack round and rebuild flag."""
        common = {
            **user,
            **self.channel.config(),
            RHO: self.state.rho,
            MODE_KEY: MODE_CLIENT,
            MESSAGE_SERVER_ROUND: server_round,
            **({FORM: FORM_LINEARIZED} if self.form == "linearized" else {}),
        }
        extra: dict[str, ArrayRecord] = {}
        momentum = self.state.momentum
        if momentum is not None:  # fast ADMM: g, the restart kind and z_k
            assert self.layout is not None
            common.update(fast_config(momentum))
            last = momentum.last  # none yet: z_k = z^ (g = 0)
            extra[ACCEL_Z_RECORD] = arrays if last is None else self.layout.record(last.z)
        self.channel.sampled(len(sampled), len(sampled))  # resets the round's byte count
        messages = []
        for node_id in sampled:
            key = self.binding.key_of.get(str(node_id))
            config = ConfigRecord({**common, **self.state.instructions(key)})
            content = RecordDict(
                {self.arrayrecord_key: arrays, self.configrecord_key: config, **extra}
            )
            messages.append(  # group_id: SuperNodes log "[RUN r, ROUND k]" as in legacy
                Message(
                    content,
                    dst_node_id=node_id,
                    message_type=MessageType.TRAIN,
                    group_id=str(server_round),
                )
            )
        return messages

    def _read(self, message: Message) -> ReadReply:
        """Read Delta_i (decoded from ``admm-payload`` when compressed) and sigma_i'."""
        assert self.layout is not None
        z = self.state.z
        assert z is not None
        plain = decoded_or_problem(
            message, self.layout, self.channel, lambda: z, self.arrayrecord_key
        )
        if isinstance(plain, ReadReply):
            return plain
        return read_reply(
            plain, self.layout, self.weighted_by_key, share_key=SHARE_RECORD, finite=True
        )

    def _open_round(self, keys: list[str]) -> None:
        self.state.stats = RoundStats()

    def _fold_reply(self, reply: ReadReply, server_round: int, counts: dict[str, int]) -> bool:
        """Fold a reply that keeps the protocol: S += Delta_i, N += n_i' - n_i.

        A full contribution (previous round 0) for a key S holds is a resync: its old
        share goes stale and the sweep takes it out of S.
        """
        key, metrics, n = reply.key, reply.metrics, reply.num_examples
        report = self.state.problem(key, metrics, n)
        if report is not None:
            problem, mismatch = report
            self._reject(key, problem, counts)
            counts[NUM_STATE_MISMATCH] += mismatch
            return False
        full = metrics[PREVIOUS_ROUND] == 0
        with single_thread_blas():
            resync = self.state.fold(
                key, reply.arrays, reply.share, n, server_round, metrics, full=full
            )
        counts[NUM_RESYNCED] += int(resync)
        return True

    def _evict(self, keys: list[str]) -> int:
        """Forget `keys`: drop their entries, N -= n_i; the sweep removes their shares."""
        return self.state.evict(keys)

    def _discard_round(self) -> dict[str, Any]:
        return {**self.state.discard_metrics(), **self.channel.round_metrics(aggregated=False)}

    def _finish_round(self, server_round: int) -> dict[str, Any]:
        """Take the z-step z = prox_{g/rho}(S / (N + N_stale)); return the residuals."""
        metrics, self.converged = self.state.finish_round()
        return {**metrics, **self.channel.round_metrics(aggregated=True)}

    # ------------------------------------------------------------------ state
    def _adopt(self, arrays: ArrayRecord) -> None:
        """Take the broadcast z as z^k (read unless it is what we returned)."""
        if arrays is self._sent_record and self.state.z is not None:
            return
        if self.layout is None:
            self.layout = Layout.of(arrays)
        self.state.adopt(self.layout.read(arrays))

    def _broadcast(self) -> ArrayRecord:
        assert self.state.z is not None and self.layout is not None
        self._sent_record = self.layout.record(self.state.z)
        return self._sent_record

    # ------------------------------------------------------------- checkpoints
    def configuration(self) -> dict[str, Any]:
        """Return the configuration a checkpoint must agree with (JSON)."""
        compressor = self.channel.compressor
        return {
            **self.state.configuration(STRATEGY),
            **({} if self.form == "prox" else {"form": self.form}),
            "uplink": None if compressor is None else compressor.config(),
        }

    def _state_dict(self) -> tuple[dict[str, NDArray[Any]], dict[str, Any]]:
        """Return z, S, N, the per-key entries (n_i, last round) and the sweep."""
        return self.state.state_dict()

    def _load_state_dict(self, arrays: dict[str, NDArray[Any]], manifest: dict[str, Any]) -> None:
        assert self.layout is not None
        self.state.load_state_dict(arrays, manifest, list(self.layout.shapes))
        self._sent_record = None
