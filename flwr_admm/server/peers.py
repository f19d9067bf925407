"""The peer baselines SCAFFOLD, FedDyn and FedNova on Flower's legacy strategy API.

Keyword front-ends over their rounds (`flwr_admm.rounds.scaffold`, `.feddyn`,
`.fednova`), which the Message-API classes of `flwr_admm.serverapp` run too, through
the legacy translator `flwr_admm.server.strategy.RoundStrategy`: the same replies give
the same iterates. The parameters a client receives are x followed by the round's
further blocks (SCAFFOLD: c); its reply, the same blocks in the same order.
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
    """The keywords every peer baseline takes besides its own and Flower's `FedAvg`'s.

    Parameters
    ----------
    sampling_seed : int or None
        Seed of the client sample: round k draws ``default_rng([seed, k])`` from the
        clients ordered by key, as `FedADMM` (None: Flower's `ClientManager.sample`).
    clients : ClientPolicy
        Client identity and eviction, as in `FedADMM`: a claim the binding refuses is
        rejected (``num_key_conflicts``); an evicted key's share leaves c / h.
    checkpoint : Checkpointing, optional
        Write x, the per-client states and the key bindings every ``every``
        aggregations; with ``resume`` start from them (`flwr_admm.rounds.checkpoint`).
    health : HealthCheck or None
        Divergence watchdog (`flwr_admm.core.health`); None: off.

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
            sampling_seed=sampling_seed,
            clients=clients,
            checkpoint=checkpoint,
            health=health,
            advice=PEER_ADVICE,
            **fedavg_kwargs,
        )

    @property
    def current(self) -> Arrays | None:
        """Return x in float64 (None before the first round)."""
        return self.round.algorithm.model()


class SCAFFOLD(PeerStrategy):
    """SCAFFOLD with option II control variates and server step size eta_g.

    Takes Flower's `FedAvg` keywords, `PeerStrategy`'s and `server_learning_rate`
    (eta_g > 0, default 1: the paper's choice with full participation). Clients MUST
    follow the ``peer-algorithm = "scaffold"`` contract: the parameters are x followed
    by c (two blocks of the model's shapes); run K gradient steps on grad f_i - c_i + c
    from x; reply y_i followed by c_i+ - c_i, committing c_i+ once acknowledged
    (``admm-ack-round``, `flwr_admm.rounds.peers`). `flwr_admm.client.ADMMClient` does,
    keeping c_i in its ``context.state``. A reply of any other layout, with NaN/inf
    entries or num_examples <= 0, out of sync with its acknowledgement
    (``num_state_mismatch``) or refused by the key binding is rejected (counted in
    ``num_rejected``) and leaves the state untouched.

    Update: x' = x + eta_g sum_S p_i (y_i - x); c = sum_held n_i c_i / sum_held n_i.
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

    Takes Flower's `FedAvg` keywords, `PeerStrategy`'s and `alpha` (> 0, required:
    the paper tunes it over 0.1, 0.01, 0.001). Clients MUST follow the
    ``peer-algorithm = "feddyn"`` contract: from the received x, approximately
    minimize f_i(w) - <grad_i, w> + alpha/2 ||w - x||^2 with alpha from
    ``feddyn-alpha``, update grad_i <- grad_i - alpha (w_i - x), reply w_i and commit
    grad_i once acknowledged (``admm-ack-round``, `flwr_admm.rounds.peers`).
    `flwr_admm.client.ADMMClient` does, keeping grad_i in its ``context.state``. Bad
    replies (layout, NaN/inf, num_examples <= 0, out of sync, refused by the key
    binding) are rejected and counted in ``num_rejected``; they leave the state as it was.

    Update: sum_held n_i grad_i -= alpha n_i (w_i - x); x' = sum_S p_i w_i - h / alpha.
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
    """Federated normalized averaging for clients running plain local (S)GD.

    Takes Flower's `FedAvg` keywords and `PeerStrategy`'s. Clients MUST run plain
    gradient steps from the received parameters (no proximal term) and report the
    number of steps they took as the integer fit metric ``"local_steps"``
    (`flwr_admm.client.ADMMClient` does). A reply without a valid ``local_steps`` is
    rejected, like one with wrong shapes or NaN entries; a client that took 0 steps
    must return x unchanged and then contributes d_i = 0.

    Update: x' = x - tau_eff * sum_i p_i (x - w_i) / tau_i, tau_eff = sum_i p_i tau_i.
    """

    def __init__(self, **keywords: Any) -> None:
        self.algorithm = FedNovaRound()
        super().__init__(self.algorithm, **keywords)

    def __repr__(self) -> str:
        return f"FedNova(accept_failures={self.accept_failures})"
