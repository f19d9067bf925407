"""FedADMM for Flower's Message API: a drop-in for `flwr.serverapp.strategy.FedProx`."""

from __future__ import annotations

import functools
from collections.abc import Mapping
from logging import INFO

from flwr.common.logger import log

from flwr_admm.core import ConsensusADMM, HealthCheck, RhoSchedule
from flwr_admm.core.health import DEFAULT_HEALTH
from flwr_admm.core.linearized import FormSpec
from flwr_admm.core.regularizers import Regularizer
from flwr_admm.core.schedules import DualStep
from flwr_admm.core.settings import TEXTBOOK, ConsensusSettings
from flwr_admm.core.steps import ZAverage
from flwr_admm.options import Checkpointing, ClientPolicy, Convergence, Uplink, option
from flwr_admm.protocol import NUM_EXAMPLES
from flwr_admm.rounds.fedadmm import FedADMMRound
from flwr_admm.serverapp.records import MetricsAggrFn
from flwr_admm.serverapp.strategy import RoundStrategy

__all__ = ["FedADMM", "textbook"]


class FedADMM(RoundStrategy):
    r"""Federated inexact consensus ADMM with server-held duals (Message API).

    The round, the reference for every module of the package, with y_i the dual of
    client i and p_i = n_i / sum_j n_j over every client seen. The default, linearized
    form (Scaffnew; `flwr_admm.core.linearized` derives it and its identity with
    SCAFFOLD option II) sends z and y_i and takes rho_i = 1 / b_i from each reply's
    step budget b_i = K_i lr_i (no penalty knob):

        w_i  = K_i steps w <- w - lr_i (grad f_i(w) + y_i) from x    (no prox term)
        z'   = sum_i p_i (rho_i w_i + y_i) / sum_i p_i rho_i         (stale w_i, y_i of
        y_i += gamma rho_i (w_i - z')                                  absent clients count)

    with x = z, or x = z + beta (z - z_prev) while the momentum's gate is open (opened
    by two rounds in a row in which every client replied and the step z' - x kept its
    direction, shut by a restart or a partial round; `flwr_admm.core.start_momentum`).

    The prox form (``form="prox"``, the seeds' iteration), with u_i = y_i / rho_i:

        send  v_i = z - u_i, rho_i and z                 (center, penalty, start)
        w_i ~ argmin f_i(w) + rho_i/2 ||w - v_i||^2      (local solve, started at z)
        z'   = prox_{g/rho}(sum_i p_i (w_i + u_i))
        u_i += gamma (w_i - z')

    The general form (over-relaxation, per-client rho, unscaled duals) is
    `flwr_admm.core.ConsensusADMM`'s; the legacy `flwr_admm.server.FedADMM` runs the
    same round (`flwr_admm.rounds.fedadmm.FedADMMRound`).

    Wire. In the linearized form each sampled node gets z (or the momentum start)
    under ``arrays``, y_i under ``admm-dual``, ``admm-form`` = "linearized" and
    ``proximal-mu`` = 0.1 (`STOCK_MU`) in the config; in the prox form v_i under
    ``arrays``, z under ``admm-start`` (when rho_i > 0) and ``rho`` = ``proximal-mu`` =
    rho_i. A reply carries one ArrayRecord (w_i) and one MetricRecord with
    ``num-examples``, optionally ``loss`` (f_i(w_i)), the client's key
    (``client-key``, else ``partition-id``, else the node id), ``admm-step-budget`` b_i
    (linearized form) and ``admm-started-at-z`` (prox form), both set by
    `flwr_admm.torch.TorchADMM` and `flwr_admm.clientapp.ADMMTrainStep`. A reply
    without them comes from a stock FedProx handler, which runs FedProx around what it
    was sent under ``arrays`` (z; in the prox form v_i): its dual is held at 0, its
    rho_i is the mu it was sent, so it runs FedProx's step around z
    (``num_stock_replies``; why: `flwr_admm.rounds.fedadmm`).

    Robustness: error replies count as ``num_failures``; replies with missing or extra
    records, other tensor names, shapes or non-numeric dtypes, NaN/inf, or a bad
    ``num-examples`` are rejected (``num_rejected``) and the round goes on (Flower's
    FedAvg would raise `InconsistentMessageReplies`). Nodes are sampled after waiting
    for ``min_available_nodes``.

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
        The prox form's penalty rho >= 0 (default 0.1; giving it selects that form);
        rho = 0 is FedAvg. ``proximal_mu`` is FedProx's name for it: give either
        (both: equal, else ValueError).
    rho_schedule : RhoSchedule or str, optional
        `Constant`, `ResidualBalancing`, or a name.
        None (default): `ResidualBalancing()` from rho when rho > 0, else `Constant()`.
    regularizer : Regularizer, optional
        Server regularizer g (`L1`, `L2`); the z-step is its prox.
    relaxation : float or None
        Over-relaxation alpha in (0, 2); 1 (default, also None) is plain ADMM.
    dual_step : float, AdaptiveDualStep or None
        The dual step gamma in (0, 1]; 1 is the textbook step. None (default):
        ``AdaptiveDualStep()``, gamma from 0.2, raised toward 1 while the replies'
        residuals keep pointing along their duals (`flwr_admm.core.schedules`). gamma <
        1 damps the feedback a noisy local solve (momentum SGD, minibatches) puts into
        its own dual (docs/torch.md); the fixed point is the same.
    z_average : {"cached", "replies"}
        The z-step averages the last w_i of every client seen ("cached", default) or
        only the round's replies (as FedDyn): faster with partial participation
        (docs/peers.md), the same with every client replying. Fingerprinted if set.
    form : {"prox", "linearized"}, Linearized or None
        The linearized step above with a `Linearized`'s server steps ("linearized" is
        ``Linearized()``) or the prox step around v_i ("prox"). None (default):
        ``Linearized()``, or "prox" when a setting of the prox form only is given (rho,
        proximal_mu, rho_schedule, regularizer, relaxation, dual_step, a compressor or
        local DP), so ``FedProx(proximal_mu=mu)`` -> ``FedADMM(proximal_mu=mu)`` keeps
        mu. The linearized form fixes those settings (given with it: ValueError).
        ``Linearized()``: the adaptive dual step and the gated momentum start (beta 0.9,
        gate 0.9). ``form=LINEARIZED_CONVEX`` (`flwr_admm.core.linearized`, no gate)
        is the fastest setting measured on full-batch convex clients and diverges on
        the CNN task (docs/options.md).
    convergence : Convergence
        Boyd's stopping thresholds (`flwr_admm.options.Convergence`).
    sampling_seed : int or None
        Seed of the node sample: round k draws ``default_rng([seed, k])`` from the nodes
        ordered by client key, so both APIs pick the same nodes (None: Python's
        `random`, as Flower).
    clients : ClientPolicy
        Client identity and eviction (`flwr_admm.options.ClientPolicy`): an evicted
        key's w_i and dual leave the sums; rejected claims count as
        ``num_key_conflicts``.
    checkpoint : Checkpointing, optional
        Where and how often the state is written (`flwr_admm.options.Checkpointing`):
        z, every cached w_i and dual, the sums, rho and its schedule, the key bindings
        and the held tensors; a resumed run continues bit-identically.
    uplink : Uplink, optional
        Compression and local DP of the updates (`flwr_admm.options.Uplink`): nodes
        send the compressed w_i - v_i under ``admm-payload`` (one uint8 tensor of bytes
        per model tensor) and the server rebuilds w_i = v_i + decode(payload);
        ``uplink_bytes`` and, with noise, ``dp_epsilon`` are reported every round.
    tensor_policy : mapping, optional
        ``{name pattern: role}`` over the ArrayRecord's tensor names, roles
        ``"consensus"`` (ADMM), ``"average"`` (FedAvg, no dual) or ``"keep"`` (never
        changed); unmatched tensors: integer dtypes keep, ``*running_mean`` /
        ``*running_var`` average, the rest consensus (`flwr_admm.core.tensor_policy`).
    health : HealthCheck or None
        Divergence watchdog (`flwr_admm.core.health`); None: off.

    Attributes
    ----------
    admm : ConsensusADMM or None
        The server state (built from the first z received).
    history : list of dict
        The round metrics of every aggregation, with ``round``.

    See Also
    --------
    textbook : the seeds' iteration (docs/options.md).

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
        rho_schedule: RhoSchedule | str | None = None,
        regularizer: Regularizer | None = None,
        relaxation: float | None = None,
        dual_step: DualStep | None = None,
        z_average: ZAverage = "cached",
        form: FormSpec | None = None,
        convergence: Convergence = Convergence(),
        sampling_seed: int | None = 0,
        clients: ClientPolicy = ClientPolicy(),
        checkpoint: Checkpointing | None = None,
        uplink: Uplink | None = None,
        tensor_policy: Mapping[str, str] | None = None,
        health: HealthCheck | None = DEFAULT_HEALTH,
    ) -> None:
        stopping = option("convergence", convergence, Convergence)
        self.algorithm = FedADMMRound.of(
            {"rho": rho, "proximal_mu": proximal_mu, "rho_schedule": rho_schedule},
            regularizer=regularizer,
            relaxation=relaxation,
            dual_step=dual_step,
            z_average=z_average,
            form=form,
            convergence=stopping,
            uplink=uplink,
            tensor_policy=tensor_policy,
            start="always",
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
            stop_on_convergence=stopping.stop,
        )

    @property
    def admm(self) -> ConsensusADMM | None:
        """The server state (built from the first z received; `algorithm` holds it)."""
        return self.algorithm.admm

    @property
    def admm_settings(self) -> ConsensusSettings:
        """The checked core settings (``rho``, ``relaxation``, ...)."""
        return self.algorithm.settings

    def summary(self) -> None:
        """Log the ADMM settings, then FedAvg's."""
        s = self.admm_settings
        log(INFO, "\t├──> FedADMM settings:")
        log(INFO, "\t│\t├── rho: %s (%s)", s.rho, type(s.rho_schedule).__name__)
        log(INFO, "\t│\t├── regularizer: %s", s.regularizer)
        log(INFO, "\t│\t├── relaxation: %s", s.relaxation)
        log(INFO, "\t│\t├── form: %s", self.algorithm.form)
        if s.start_momentum > 0:  # the linearized form's start: beta, and its gate
            log(INFO, "\t│\t├── momentum start: %s (gate %s)", s.start_momentum, s.start_steady)
        log(INFO, "\t│\t└── dual_step: %s, sampling_seed: %s", s.dual_step, self.sampling_seed)
        super().summary()


#: The seeds' textbook iteration: constant rho, alpha = 1, gamma = 1.
textbook = functools.partial(FedADMM, **TEXTBOOK)
