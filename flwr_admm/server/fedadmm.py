"""FedADMM: Flower strategy for inexact consensus ADMM with server-held duals.

The strategy is a thin adapter over `flwr_admm.consensus.ConsensusADMM`:

- ``configure_fit`` sends client i its prox center v_i = z - u_i as the parameters and
  ``rho`` (and ``proximal_mu`` = rho) in the config. An unmodified FedProx client, one
  that starts at the received parameters and adds proximal_mu/2 ||w - received||^2,
  therefore runs a valid inexact ADMM w-step with FedADMM out of the box.
- ``aggregate_fit`` validates every reply, keys it by the client's ``client-key`` or
  ``partition-id`` metric (else ``ClientProxy.cid``), and runs the z- and dual steps.

Clients MUST minimize (approximately) f_i(w) + rho/2 ||w - v_i||^2 and return w_i.

Reply checks and folding are in `flwr_admm.server.reply_folding`, checkpoints in
`flwr_admm.server.strategy_checkpoint`, client keys and seeded sampling in
`flwr_admm.server.sampling`.
"""

from __future__ import annotations

import os
from logging import INFO, WARNING
from pathlib import Path
from typing import Any

import numpy as np
from flwr.common import (
    FitIns,
    FitRes,
    NDArrays,
    Parameters,
    Scalar,
    ndarrays_to_parameters,
    parameters_to_ndarrays,
)
from flwr.common.logger import log
from flwr.server.client_manager import ClientManager
from flwr.server.client_proxy import ClientProxy
from flwr.server.strategy import FedAvg

from flwr_admm.core.consensus import ClientRho, ConsensusADMM
from flwr_admm.core.kernels import single_thread_blas
from flwr_admm.core.regularizers import Regularizer
from flwr_admm.core.schedules import Constant, RhoSchedule, make_schedule
from flwr_admm.server.checkpoint import CheckpointError, checkpoint_every_value, has_checkpoint
from flwr_admm.server.reply_folding import ReplyFolding
from flwr_admm.server.sampling import check_flower_fields, client_key, record_round, sample_clients
from flwr_admm.server.strategy_checkpoint import StrategyCheckpoint
from flwr_admm.uplink.channel import Residual, UplinkChannel
from flwr_admm.uplink.compression import Compressor
from flwr_admm.uplink.privacy import LocalDP

__all__ = [
    "CheckpointError",
    "FedADMM",
    "check_flower_fields",
    "client_key",
    "sample_clients",
]


class FedADMM(ReplyFolding, StrategyCheckpoint, FedAvg):
    """Federated inexact consensus ADMM (server-held duals).

    Takes every keyword of Flower's `FedAvg` plus:

    Parameters
    ----------
    rho : float
        Penalty rho >= 0 (rho = 0 reproduces FedAvg).
    rho_schedule : RhoSchedule or str, optional
        `Constant` (default), `Geometric`, `StallIncrease`, `ResidualBalancing`, or
        one of their names.
    regularizer : Regularizer, optional
        Server regularizer g (`L1`, `L2`); the z-step is its prox.
    client_rho : {"uniform", "data_size"}
        rho_i = rho or rho * n_i / max_j n_j.
    eps_abs, eps_rel : float
        Tolerances of Boyd's stopping thresholds eps_pri / eps_dual.
    relaxation : float
        Over-relaxation alpha in (0, 2) (Boyd et al. 2011, 3.4.3): replies enter the
        z-step and the dual step as alpha w_i + (1 - alpha) z. 1 (default) is plain
        ADMM; 1.5-1.8 often needs fewer rounds.
    stop_on_convergence : bool
        Sample no clients once r <= eps_pri and s <= eps_dual.
    sampling_seed : int or None
        Seeded client sampling (clients ordered by key, then cid); None uses
        Flower's unseeded `ClientManager.sample`.
    checkpoint_dir : path, optional
        Write the server state (z, duals, cached w_i, weights, rho and schedule state,
        round, config fingerprint) there after every `checkpoint_every` aggregations.
        If it already holds a checkpoint and `resume` is true, start from it.
    checkpoint_every : int
        Aggregations between checkpoints.
    resume : bool
        Resume from an existing checkpoint in `checkpoint_dir` (a mismatched or
        damaged checkpoint is an error, never a silent fresh start).
    uplink : Compressor, optional
        Compress client updates w_i - v_i (`StochasticQuantizer`, `TopK`); replies are
        decoded against the center each client was sent before validation.
    uplink_residual : {"update", "dual"}
        Where a client's compression residual goes (with ``error_feedback``): into its
        next update (error feedback, default) or into its share of the dual.
    local_dp : LocalDP, optional
        Clients clip w_i - v_i to norm C and add N(0, (sigma C)^2); ``dp_epsilon`` is
        reported every round (`flwr_admm.uplink.privacy`).

    """

    def __init__(
        self,
        *,
        rho: float = 1.0,
        rho_schedule: RhoSchedule | str | None = None,
        regularizer: Regularizer | None = None,
        client_rho: ClientRho = "uniform",
        eps_abs: float = 1e-6,
        eps_rel: float = 1e-4,
        relaxation: float = 1.0,
        stop_on_convergence: bool = False,
        sampling_seed: int | None = 0,
        checkpoint_dir: str | os.PathLike[str] | None = None,
        checkpoint_every: int = 1,
        resume: bool = True,
        uplink: Compressor | None = None,
        uplink_residual: Residual = "update",
        local_dp: LocalDP | None = None,
        **fedavg_kwargs: Any,
    ) -> None:
        super().__init__(**fedavg_kwargs)
        self.channel = UplinkChannel(uplink, local_dp, uplink_residual)
        if isinstance(rho_schedule, str):
            rho_schedule = make_schedule(rho_schedule)
        if rho_schedule is not None and not isinstance(rho_schedule, RhoSchedule):
            raise ValueError(
                f"rho_schedule: must be a RhoSchedule or a schedule name, got {rho_schedule!r}"
            )
        if regularizer is not None and not isinstance(regularizer, Regularizer):
            raise ValueError(f"regularizer: must be L1(...), L2(...) or None, got {regularizer!r}")
        self._check_flower_fields(sampling_seed)
        self.rho = rho
        self.rho_schedule = rho_schedule if rho_schedule is not None else Constant()
        self.regularizer = regularizer
        self.client_rho: ClientRho = client_rho
        self.eps_abs, self.eps_rel = eps_abs, eps_rel
        self.relaxation = relaxation
        self.stop_on_convergence = stop_on_convergence
        self.sampling_seed = sampling_seed
        # Build once to validate rho, client_rho, eps and their combination.
        self._new_admm([np.zeros(1)])
        self.rho, self.relaxation = float(rho), float(relaxation)
        self.admm: ConsensusADMM | None = None
        self.history: list[dict[str, Scalar]] = []
        self.converged = False
        self._dtypes: list[np.dtype[Any]] = []
        self._key_of_cid: dict[str, str] = {}
        self._sent_key: dict[str, str | None] = {}
        self._round_offset = 0
        self.last_round = 0
        self.checkpoint_every = checkpoint_every_value(checkpoint_every)
        self.checkpoint_dir = None if checkpoint_dir is None else Path(checkpoint_dir)
        if self.checkpoint_dir is not None and resume and has_checkpoint(self.checkpoint_dir):
            self.load_checkpoint(self.checkpoint_dir)

    def _check_flower_fields(self, sampling_seed: int | None) -> None:
        """Validate the FedAvg keywords Flower itself leaves unchecked."""
        check_flower_fields(self, sampling_seed)

    def __repr__(self) -> str:
        schedule = type(self.rho_schedule).__name__
        return (
            f"FedADMM(rho={self.rho}, rho_schedule={schedule}, "
            f"regularizer={self.regularizer!r}, relaxation={self.relaxation})"
        )

    def initialize_parameters(self, client_manager: ClientManager) -> Parameters | None:
        """The restored z after a resume, else Flower's `initial_parameters`."""
        initial = super().initialize_parameters(client_manager)
        if self.admm is None:
            return initial
        if initial is not None:
            shapes = [np.shape(a) for a in parameters_to_ndarrays(initial)]
            self.admm.check_shapes([np.empty(shape) for shape in shapes], "initial_parameters")
        return self._to_parameters(self.admm.z)

    # ------------------------------------------------------------------- fit
    def configure_fit(
        self, server_round: int, parameters: Parameters, client_manager: ClientManager
    ) -> list[tuple[ClientProxy, FitIns]]:
        """Send each sampled client its center v_i = z - u_i and its rho_i."""
        admm = self._adopt(parameters)
        server_round += self._round_offset
        if self.stop_on_convergence and self.converged:
            log(INFO, "FedADMM: converged (r <= eps_pri, s <= eps_dual); no clients sampled")
            return []
        config: dict[str, Scalar] = {}
        if self.on_fit_config_fn is not None:
            config = dict(self.on_fit_config_fn(server_round))
        clients = self._sample(client_manager, server_round)
        self.channel.sampled(len(clients), client_manager.num_available())
        instructions = []
        for client in clients:
            key = self._key_of_cid.get(client.cid)
            center = admm.center(key)
            rho_i = admm.rho_for(key)
            payload = parameters if center is admm.z else self._to_parameters(center)
            self._sent_key[client.cid] = key if key in admm.records else None
            fit_config = {
                **config,
                **self.channel.config(),
                "rho": rho_i,
                "proximal_mu": rho_i,
                "server_round": server_round,
            }
            instructions.append((client, FitIns(payload, fit_config)))
        return instructions

    def aggregate_fit(
        self,
        server_round: int,
        results: list[tuple[ClientProxy, FitRes]],
        failures: list[tuple[ClientProxy, FitRes] | BaseException],
    ) -> tuple[Parameters | None, dict[str, Scalar]]:
        """Validate replies, then z = prox(sum_i p_i (w_i + u_i)), u_i += w_i - z."""
        server_round += self._round_offset
        admm = self.admm
        counts: dict[str, Scalar] = {
            "num_failures": len(failures),
            "num_rejected": 0,
            "num_resynced": 0,
        }
        if admm is None or (not self.accept_failures and failures):
            return None, counts
        with single_thread_blas():
            folded = self._fold_replies(results, admm, counts)
        if not folded:
            admm.cancel()
            log(WARNING, "FedADMM round %s: no usable reply; z, duals, rho unchanged", server_round)
            return None, {
                **counts,
                **self.channel.round_metrics(aggregated=False),
                "rho": admm.rho,
                "num_clients_cached": len(admm.records),
            }
        report = admm.finish(server_round)
        self.converged = report.converged
        metrics: dict[str, Scalar] = {
            "rho": report.rho,
            "next_rho": report.next_rho,
            "primal_residual": report.primal_residual,
            "dual_residual": report.dual_residual,
            "eps_primal": report.eps_primal,
            "eps_dual": report.eps_dual,
            "converged": int(report.converged),
            "num_replies": report.num_replies,
            "num_clients_cached": report.num_clients_cached,
            **counts,
            **self.channel.round_metrics(aggregated=True),
        }
        if report.objective is not None:
            metrics["objective"] = report.objective
        metrics = record_round(self, server_round, results, metrics)
        if self.checkpoint_dir is not None and server_round % self.checkpoint_every == 0:
            self.save_checkpoint(self.checkpoint_dir)
        return self._to_parameters(admm.z), metrics

    # ----------------------------------------------------------------- helpers
    def _new_admm(self, z: NDArrays) -> ConsensusADMM:
        """A fresh numpy core with this strategy's configuration (validates it too)."""
        return ConsensusADMM(
            z,
            self.rho,
            self.rho_schedule,
            self.regularizer,
            self.client_rho,
            self.eps_abs,
            self.eps_rel,
            self.relaxation,
        )

    def _adopt(self, parameters: Parameters) -> ConsensusADMM:
        z = parameters_to_ndarrays(parameters)
        if self.admm is None:
            self._dtypes = [np.asarray(t).dtype for t in z]
            self.admm = self._new_admm(z)
        else:
            self.admm.adopt_consensus(z)
        return self.admm

    def _to_parameters(self, arrays: NDArrays) -> Parameters:
        return ndarrays_to_parameters(
            [np.asarray(a, dtype=d) for a, d in zip(arrays, self._dtypes, strict=True)]
        )

    def _sample(self, client_manager: ClientManager, server_round: int) -> list[ClientProxy]:
        return sample_clients(
            self, client_manager, server_round, self.sampling_seed, self._key_of_cid
        )
