"""FedADMMClientDuals on Flower's legacy API; the protocol is `flwr_admm.rounds.client_duals`."""

from __future__ import annotations

from typing import Any

from flwr_admm.core.health import DEFAULT_HEALTH, HealthCheck
from flwr_admm.core.linearized import FormSpec
from flwr_admm.core.regularizers import Regularizer
from flwr_admm.core.schedules import DualStep
from flwr_admm.core.types import Arrays
from flwr_admm.options import Checkpointing, ClientPolicy, Convergence, Uplink
from flwr_admm.rounds.client_duals import ClientDualsRound
from flwr_admm.rounds.client_duals_state import ClientDualsState
from flwr_admm.server.strategy import RoundStrategy

__all__ = ["FedADMMClientDuals"]


class FedADMMClientDuals(RoundStrategy):
    """Consensus ADMM with client-held duals on Flower's legacy API.

    As `flwr_admm.serverapp.FedADMMClientDuals`, whose keywords it takes after Flower's
    legacy `FedAvg` keywords, all keyword-only (``form`` "prox" by default, as the legacy
    `FedADMM`; None: the Message API's choice); the same replies give the same iterates.
    Legacy wire: the parameters are z^k, followed by z_k under fast ADMM; a reply's
    parameters are Delta_i (with ``uplink``, its compressed payload), followed by the
    full share sigma_i' when asked to rebuild.
    """

    def __init__(
        self,
        *,
        rho: float | None = None,
        proximal_mu: float | None = None,
        regularizer: Regularizer | None = None,
        dual_step: DualStep | None = None,
        form: FormSpec | None = "prox",
        convergence: Convergence = Convergence(),
        sampling_seed: int | None = 0,
        clients: ClientPolicy = ClientPolicy(),
        checkpoint: Checkpointing | None = None,
        uplink: Uplink | None = None,
        health: HealthCheck | None = DEFAULT_HEALTH,
        **fedavg_kwargs: Any,
    ) -> None:
        self.algorithm = self._round(
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
            fedavg_kwargs,
            sampling_seed=sampling_seed,
            clients=clients,
            checkpoint=checkpoint,
            health=health,
            stop_on_convergence=convergence.stop,
        )

    def _round(self, **settings: Any) -> ClientDualsRound:
        """Return the round this strategy runs (SecAgg+: `SecureClientDualsRound`)."""
        return ClientDualsRound(**settings)

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
