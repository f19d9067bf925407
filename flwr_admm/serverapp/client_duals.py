"""FedADMMClientDuals for Flower's Message API: consensus ADMM, the duals kept by the nodes."""

from __future__ import annotations

from logging import INFO

from flwr.common.logger import log

from flwr_admm.core.health import DEFAULT_HEALTH, HealthCheck
from flwr_admm.core.linearized import FormSpec
from flwr_admm.core.regularizers import Regularizer
from flwr_admm.core.schedules import DualStep
from flwr_admm.core.types import Arrays
from flwr_admm.options import Checkpointing, ClientPolicy, Convergence, Uplink
from flwr_admm.protocol import NUM_EXAMPLES
from flwr_admm.rounds.client_duals import ClientDualsRound
from flwr_admm.rounds.client_duals_state import ClientDualsState
from flwr_admm.serverapp.records import MetricsAggrFn
from flwr_admm.serverapp.strategy import RoundStrategy

__all__ = ["FedADMMClientDuals"]


class FedADMMClientDuals(RoundStrategy):
    """Federated consensus ADMM with client-held duals (Message API).

    The protocol, its round and its round metrics are `flwr_admm.rounds.client_duals`'s
    (the legacy `flwr_admm.server.FedADMMClientDuals` runs the same round). The server
    keeps z, S = sum_i n_i c_i, N = sum_i n_i and two integers per client key; node i
    keeps w_i and u_i in its ``context.state``.

    Wire. Each sampled node gets z^k under ``arrays`` (one record for all) and, in
    ``config``, a copy of the given config plus ``rho``, ``server-round``,
    ``admm-duals`` = "client" and the protocol's keys (``admm-ack-round``,
    ``admm-rebuild``, ...; `flwr_admm.protocol`). A reply carries
    Delta_i under ``arrays`` (the model's tensor names and shapes, any real dtype: send
    float64, it is a change of a sum), with ``admm-rebuild`` = 1 also sigma_i' under
    ``admm-share``, and one MetricRecord with ``num-examples``, the client key as in
    `FedADMM` and the protocol metrics (``admm-previous-round``,
    ``admm-examples-change``, ``admm-w-sq-norm``, ``admm-u-sq-norm``,
    ``admm-delayed-sq-residual``, ``admm-resync``, ...). Bad replies (error replies:
    ``num_failures``; missing arrays, other names, shapes or dtypes, NaN/inf, a bad
    ``num-examples``, missing or inconsistent protocol metrics: ``num_rejected``) never
    touch S; the run goes on. `flwr_admm.clientapp.make_client_app` and
    `flwr_admm.clientapp.ADMMTrainStep` speak it.

    Parameters
    ----------
    fraction_train, fraction_evaluate, min_train_nodes, min_evaluate_nodes,
    min_available_nodes, weighted_by_key, arrayrecord_key, configrecord_key,
    train_metrics_aggr_fn, evaluate_metrics_aggr_fn
        As in `FedADMM`.
    rho, proximal_mu : float
        The prox form's constant penalty rho > 0 (default 0.1; giving it selects that
        form), as in `FedADMM`. A rho schedule, per-client rho or over-relaxation would
        need every dual on the server: use `FedADMM` for them.
    regularizer : Regularizer, optional
        Server regularizer g (`L1`, `L2`); the z-step is prox_{g/rho}(S / N).
    dual_step : float in (0, 1], AdaptiveDualStep or None
        The prox form's dual step gamma (None: 1): u_i += gamma (w_i - z^k), sent as
        ``admm-dual-step`` when it is not 1. An `AdaptiveDualStep` sets it each round
        from the alignment terms the nodes report (``admm-align-*``; docs/client_duals.md).
    form : {"prox", "linearized"}, Linearized or None
        The linearized form with client-held duals (module docstring of
        `flwr_admm.rounds.client_duals`) or the prox form. None (default): as `FedADMM`,
        ``Linearized()`` unless a prox-form setting is given (rho, proximal_mu,
        regularizer, dual_step, a compressor), then "prox".
    convergence, sampling_seed, clients, checkpoint, health
        As in `FedADMM`; the stopping test uses the delayed primal residual, an evicted
        key's share leaves S through the rebuild sweep, and a checkpoint holds no
        duals (the nodes must keep their state).
    uplink : Uplink, optional
        A compressor with error feedback (``local_dp``: ValueError); the node sends
        the compressed Delta_i under ``admm-payload`` (one uint8 tensor of bytes per
        model tensor) instead of ``arrays``.

    """

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
        dual_step: DualStep | None = None,
        form: FormSpec | None = None,
        convergence: Convergence = Convergence(),
        sampling_seed: int | None = 0,
        clients: ClientPolicy = ClientPolicy(),
        checkpoint: Checkpointing | None = None,
        uplink: Uplink | None = None,
        health: HealthCheck | None = DEFAULT_HEALTH,
    ) -> None:
        self.algorithm = ClientDualsRound(
            rho=rho,
            proximal_mu=proximal_mu,
            regularizer=regularizer,
            convergence=convergence,
            dual_step=dual_step,
            uplink=uplink,
            form=form,
        )
        super().__init__(
            self.algorithm,
            {
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
            sampling_seed=sampling_seed,
            clients=clients,
            checkpoint=checkpoint,
            health=health,
            stop_on_convergence=convergence.stop,
        )

    def summary(self) -> None:
        """Log the ADMM settings, then FedAvg's."""
        log(INFO, "\t├──> FedADMMClientDuals settings (duals held by the nodes):")
        log(INFO, "\t│\t└── rho: %s, regularizer: %s", self.state.rho, self.state.regularizer)
        super().summary()

    @property
    def state(self) -> ClientDualsState:
        """The server state: z, S, N, the per-key entries and the sweep (`algorithm` holds it)."""
        return self.algorithm.state

    @property
    def z(self) -> Arrays | None:
        """The consensus the next round sends (z^_{k+1} with fast ADMM)."""
        return self.algorithm.state.z

    def __repr__(self) -> str:
        state = self.algorithm.state
        return f"FedADMMClientDuals(rho={state.rho}, regularizer={state.regularizer!r})"
