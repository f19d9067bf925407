"""The peer baselines SCAFFOLD, FedDyn and FedNova on Flower's legacy strategy API.

Each is as its `flwr_admm.serverapp` namesake (the same round: the same replies give
the same iterates) and takes Flower's legacy `FedAvg` keywords besides. Legacy wire:
the parameters a client receives are x followed by the round's further blocks
(SCAFFOLD: c); its reply, the same blocks in the same order (SCAFFOLD: y_i, then
c_i+ - c_i); FedNova's ``local_steps`` is a fit metric.
"""

from __future__ import annotations

from typing import Any

from flwr_admm.core.health import DEFAULT_HEALTH, PEER_ADVICE, HealthCheck
from flwr_admm.core.types import Arrays
from flwr_admm.options import Checkpointing, ClientPolicy
from flwr_admm.rounds.exchange import Algorithm
from flwr_admm.rounds.feddyn import FedDynRound
from flwr_admm.rounds.fednova import FedNovaRound
from flwr_admm.rounds.scaffold import ScaffoldRound
from flwr_admm.server.strategy import RoundStrategy

__all__ = ["SCAFFOLD", "FedDyn", "FedNova"]


class PeerStrategy(RoundStrategy):
    """The keywords every peer baseline takes, as `flwr_admm.serverapp.peers.PeerStrategy`.

    Without a ``sampling_seed`` the sample is Flower's `ClientManager.sample`.
    """

    def __init__(
        self,
        algorithm: Algorithm,
        *,
        sampling_seed: int | None = 0,
        clients: ClientPolicy = ClientPolicy(),
        checkpoint: Checkpointing | None = None,
        health: HealthCheck | None = DEFAULT_HEALTH,
        **fedavg_kwargs: Any,
    ) -> None:
        super().__init__(
            algorithm,
            fedavg_kwargs,
            sampling_seed=sampling_seed,
            clients=clients,
            checkpoint=checkpoint,
            health=health,
            advice=PEER_ADVICE,
        )

    @property
    def current(self) -> Arrays | None:
        """Return x in float64 (None before the first round)."""
        return self.round.algorithm.model()


class SCAFFOLD(PeerStrategy):
    """SCAFFOLD on Flower's legacy API, as `flwr_admm.serverapp.SCAFFOLD`.

    `flwr_admm.client.ADMMClient` follows its contract, keeping c_i in its
    ``context.state``.
    """

    def __init__(self, *, server_learning_rate: float = 1.0, **keywords: Any) -> None:
        self.algorithm = ScaffoldRound(server_learning_rate)
        super().__init__(self.algorithm, **keywords)

    def __repr__(self) -> str:
        return f"SCAFFOLD(server_learning_rate={self.algorithm.server_learning_rate!r})"

    def control(self) -> Arrays:
        """Return the server control variate c (float64, model order; 0 at first)."""
        return self.algorithm.control()


class FedDyn(PeerStrategy):
    """FedDyn on Flower's legacy API, as `flwr_admm.serverapp.FedDyn`.

    `flwr_admm.client.ADMMClient` follows its contract, keeping grad_i in its
    ``context.state``.
    """

    def __init__(self, *, alpha: float, **keywords: Any) -> None:
        self.algorithm = FedDynRound(alpha)
        super().__init__(self.algorithm, **keywords)

    def __repr__(self) -> str:
        return f"FedDyn(alpha={self.algorithm.alpha!r})"

    def h(self) -> Arrays:
        """Return the server state h (float64, model order; 0 at first)."""
        return self.algorithm.h()


class FedNova(PeerStrategy):
    """FedNova on Flower's legacy API, as `flwr_admm.serverapp.FedNova`.

    `flwr_admm.client.ADMMClient` reports ``local_steps``.
    """

    def __init__(self, **keywords: Any) -> None:
        self.algorithm = FedNovaRound()
        super().__init__(self.algorithm, **keywords)

    def __repr__(self) -> str:
        return f"FedNova(accept_failures={self.accept_failures})"
