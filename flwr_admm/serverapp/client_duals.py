"""FedADMMClientDuals for Flower's Message API: consensus ADMM, the duals kept by the nodes."""

from __future__ import annotations

from logging import INFO

from flwr.common.logger import log

from flwr_admm.core.health import DEFAULT_HEALTH, HealthCheck
from flwr_admm.core.linearized import FormSpec
from flwr_admm.core.regularizers import Regularizer
from flwr_admm.core.types import Arrays
from flwr_admm.options import Checkpointing, ClientPolicy, Convergence, Uplink
from flwr_admm.protocol import NUM_EXAMPLES
from flwr_admm.rounds.client_duals import ClientDualsRound
from flwr_admm.rounds.client_duals_state import ClientDualsState
from flwr_admm.serverapp.records import MetricsAggrFn
from flwr_admm.serverapp.strategy import RoundStrategy

__all__ = ["FedADMMClientDuals"]


class FedADMMClientDuals(RoundStrategy):
    r"""Federated consensus ADMM with client-held duals (Message API).

    The protocol, math and server arithmetic of the legacy `flwr_admm.server.FedADMMClientDuals`
    (read its module docstring); the round is `flwr_admm.rounds.client_duals.ClientDualsRound`,
    the same the legacy strategy runs: node i keeps w_i and its scaled dual u_i in its
    ``context.state``; the server keeps z, S = sum_i n_i c_i (c_i = w_i + u_i),
    N = sum_i n_i and, per client key, n_i and the round it last took part in.

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
    dual_step : float in (0, 1]
        The clients' dual step gamma: u_i += gamma (w_i - z^k), sent as
        ``admm-dual-step`` when it is not 1 (as `FedADMM`'s ``dual_step``; the same
        fixed point).
    acceleration : {None, "nesterov"}
        Fast ADMM with restart, as in the legacy class (`flwr_admm.core.dual_momentum`):
        the server extrapolates z and sends z_k under ``admm-accel-z`` with the
        coefficient g; each node extrapolates its own dual.
    form : {"prox", "linearized"} or Linearized
        The linearized form with client-held duals, as in the legacy class (config
        ``admm-form``; a reply without ``admm-step-budget`` is rejected).
    convergence, sampling_seed :
        As in `FedADMM` (convergence uses the delayed primal residual).
    clients : ClientPolicy
        Identity and eviction as in `FedADMM`; an evicted key's share leaves S
        through the rebuild sweep.
    checkpoint : Checkpointing, optional
        Checkpoints of z, S, N, the per-key entries and the sweep (`ClientDualsState`).
        The duals stay on the nodes: a resumed run continues exactly if they kept
        their ``context.state``; a node that lost it resynchronizes.
    uplink : Uplink, optional
        Uplink compression of Delta_i with error feedback, as in the legacy class (each
        node keeps its residual e_i; S = sum_i n_i c_i - sum_i e_i); a compressor only
        (``local_dp`` or ``residual="dual"``: ValueError). The node sends the
        payload under ``admm-payload`` (one uint8 tensor of bytes per model tensor)
        instead of ``arrays``; ``uplink_bytes`` counts the payload bytes per round.
    health : HealthCheck or None
        Divergence watchdog, as in `FedADMM` (`flwr_admm.core.health`); None: off.

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
        dual_step: float = 1.0,
        acceleration: str | None = None,
        form: FormSpec = "prox",
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
            acceleration=acceleration,
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
