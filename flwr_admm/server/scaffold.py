"""SCAFFOLD on Flower's legacy API: `flwr_admm.rounds.scaffold` behind `PeerStrategy`.

The math (Karimireddy et al., ICML 2020, option II control variates), the server
state and the update are `flwr_admm.rounds.scaffold.ScaffoldRound`'s, which the
Message-API `flwr_admm.serverapp.scaffold.SCAFFOLD` runs too.
"""

from __future__ import annotations

from typing import Any

from flwr.common import NDArrays

from flwr_admm.rounds.scaffold import ScaffoldRound
from flwr_admm.server.peer_base import PeerStrategy

__all__ = ["SCAFFOLD"]


class SCAFFOLD(PeerStrategy):
    """SCAFFOLD with option II control variates and server step size eta_g.

    Takes every keyword of Flower's `FedAvg` plus `server_learning_rate` (eta_g > 0,
    default 1: the paper's choice with full participation) and ``health`` (the
    divergence watchdog, `PeerStrategy`; None: off). Clients MUST follow the
    ``peer-algorithm = "scaffold"`` contract: the parameters are x followed by c (two
    blocks of the model's shapes); run K gradient steps on grad f_i - c_i + c from x;
    reply y_i followed by c_i+ - c_i, committing c_i+ once acknowledged
    (``admm-ack-round``, `flwr_admm.rounds.peers`). `flwr_admm.client.ADMMClient` does,
    keeping c_i in its ``context.state``. A reply of any other layout, with NaN/inf
    entries or num_examples <= 0, out of sync with its acknowledgement
    (``num_state_mismatch``), or that the key binding refuses (``key_binding``: "node",
    "authenticated" or "reported", as `FedADMM`'s; ``num_key_conflicts``) is rejected
    (counted in ``num_rejected``) and leaves the state untouched.

    Update: x' = x + eta_g sum_S p_i (y_i - x); c = sum_held n_i c_i / sum_held n_i.
    """

    def __init__(
        self, *, server_learning_rate: float = 1.0, key_binding: str = "node", **fedavg_kwargs: Any
    ) -> None:
        algorithm = ScaffoldRound(server_learning_rate, key_binding)
        super().__init__(algorithm, **fedavg_kwargs)
        self.server_learning_rate = algorithm.server_learning_rate
        self.key_binding = algorithm.binding.policy

    def __repr__(self) -> str:
        return f"SCAFFOLD(server_learning_rate={self.server_learning_rate!r})"

    def control(self) -> NDArrays:
        """Return the server control variate c = sum_held n_i c_i / sum_held n_i (0 at first)."""
        assert isinstance(self.algorithm, ScaffoldRound)
        return self.algorithm.control()
