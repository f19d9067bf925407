"""The peer baselines SCAFFOLD, FedDyn and FedNova on Flower's Message API.

Keyword front-ends over their rounds (`flwr_admm.rounds.scaffold`, `.feddyn`,
`.fednova`), which the legacy classes of `flwr_admm.server` run too, through the
Message-API translator `flwr_admm.serverapp.strategy.RoundStrategy`: the same replies
give the same iterates. Wire (docs/peers.md): x under ``arrays`` with the model's
tensor names and dtypes, SCAFFOLD's c under ``scaffold-control`` (same names), the
config with ``peer-algorithm`` (FedDyn: ``feddyn-alpha``), ``server-round`` and the
node's ``admm-ack-round``; a reply carries the same records and one MetricRecord
with ``num-examples`` (and ``admm-previous-round``). FedNova's messages are FedAvg's;
its replies add the integer metric ``local_steps``. A reply Flower's FedAvg would
abort the run on, or that the round refuses, is logged and counted in
``num_rejected``: never an exception.
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
from flwr_admm.serverapp.strategy import RoundStrategy

__all__ = ["SCAFFOLD", "FedDyn", "FedNova"]


class PeerStrategy(RoundStrategy):
    """The keywords every peer baseline takes besides its own and Flower's `FedAvg`'s.

    Flower's Message-API `FedAvg` keywords are keyword-only here.

    Parameters
    ----------
    sampling_seed, clients, health
        As in `flwr_admm.serverapp.FedADMM`; an evicted key's share leaves c / h.
    checkpoint : Checkpointing, optional
        As in `FedADMM`: x, the per-client states and the key bindings
        (`flwr_admm.rounds.checkpoint`).

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
    """SCAFFOLD with option II control variates and server step size eta_g.

    x' = x + eta_g sum_S p_i (y_i - x),  c = sum_held n_i c_i / sum_held n_i

    Takes `PeerStrategy`'s keywords and `server_learning_rate` (eta_g > 0, default 1:
    the paper's choice with full participation). Nodes MUST follow the
    ``peer-algorithm = "scaffold"`` contract (the client steps: `flwr_admm.rounds.scaffold`;
    the wire: the module docstring) and commit c_i+ only once acknowledged
    (``admm-ack-round``, `flwr_admm.rounds.peers`); `flwr_admm.clientapp.make_client_app`
    around an `ADMMClient` does, keeping c_i in ``context.state`` (a user's handler:
    `flwr_admm.clientapp.received_control` and `build_scaffold_reply`).
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
    """FedDyn with penalty alpha and server state h.

    h = sum_held n_i grad_i / sum_held n_i,  x' = sum_S p_i w_i - h / alpha

    Takes `PeerStrategy`'s keywords and `alpha` (> 0, required; the paper tunes it over
    0.1, 0.01, 0.001). Nodes MUST follow the ``peer-algorithm = "feddyn"`` contract
    (`flwr_admm.rounds.feddyn`) and commit grad_i only once acknowledged
    (``admm-ack-round``, `flwr_admm.rounds.peers`); `flwr_admm.clientapp.make_client_app`
    around an `ADMMClient` does, keeping grad_i in ``context.state``.
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
    """Federated normalized averaging for nodes running plain local (S)GD.

    x' = x - tau_eff sum_i p_i (x - w_i) / tau_i,  tau_eff = sum_i p_i tau_i

    Takes `PeerStrategy`'s keywords. Nodes MUST run plain gradient steps from the
    received arrays (no proximal term) and report the number of steps as the integer
    metric ``"local_steps"`` (`flwr_admm.clientapp`'s app around an `ADMMClient` does);
    a reply without a valid one is rejected, and a node that took 0 steps must return
    x unchanged (`flwr_admm.rounds.fednova`).
    """

    def __init__(self, **keywords: Any) -> None:
        self.algorithm = FedNovaRound()
        super().__init__(self.algorithm, **keywords)
