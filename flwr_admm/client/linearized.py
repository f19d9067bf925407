"""Client side of FedADMM's linearized form, run by `ADMMClient` (`flwr_admm.core.linearized`).

The parameters are z followed by y_i (two blocks of the model's shapes; the Message
API's ``admm-dual`` record is appended by `flwr_admm.clientapp.make_client_app`). The
client runs its local plan from w = z on f_i(w) + <y_i, w>, every step

    w <- w - lr (grad f_i(w) + y_i)          (no prox term)

and replies w_i with ``admm-step-budget`` b_i = K_i lr (K_i the steps taken), so the
server's rho_i = 1 / b_i. The server holds y_i: the client keeps no state.
"""

from __future__ import annotations

import numpy as np
from flwr.common import Scalar

from flwr_admm.client.peers import PeerClient
from flwr_admm.core.linearized import step_budget
from flwr_admm.core.local_solver import LocalPlan, penalized_local_solve
from flwr_admm.models.base import Params
from flwr_admm.protocol import FORM, LOCAL_STEPS, LOSS, STEP_BUDGET
from flwr_admm.uplink.channel import ClientUplink

__all__ = ["budget_of", "client_fit"]


def budget_of(steps: int, plan: LocalPlan) -> float:
    """Return b_i = K lr of a local loop that took `steps` steps; ValueError if none."""
    if steps == 0:
        raise ValueError(
            "grad_tol: the local loop took no step from z, so there is no step budget "
            "K lr for rho_i = 1 / (K lr); lower grad_tol or drop it under the linearized form"
        )
    return step_budget(steps, plan.learning_rate)


def client_fit(
    client: PeerClient,
    received: Params,
    plan: LocalPlan,
    server_round: int,
    uplink: ClientUplink,
) -> tuple[Params, int, dict[str, Scalar]]:
    """Run the linearized local round on [z, y_i]; return (w_i, n_i, metrics).

    Raises
    ------
    ValueError
        When the parameters are not two blocks of the model's shapes, the config asks
        for uplink compression or local DP, or the loop took no step (``grad_tol``
        reached at z: b_i would be 0).

    """
    if uplink.compressor is not None or uplink.local_dp is not None:
        raise ValueError(
            f"{FORM}: uplink compression and local DP are not supported with the "
            "linearized form; drop the uplink*/dp-* entries"
        )
    half = len(received) // 2
    z, y = received[:half], received[half:]
    if len(received) % 2 or [t.shape for t in y] != [t.shape for t in z]:
        raise ValueError("parameters: the linearized form sends z and y_i, two blocks alike")
    client.model.check_params(z, field="parameters")
    stream = [client.seed, int(client.partition_id or 0), server_round]
    rng = np.random.default_rng(stream)
    # w <- w - lr (grad f_i(w) + y_i), K steps from z
    result = penalized_local_solve(client.model, z, client.X, client.y, plan, rng=rng, linear=y)
    metrics: dict[str, Scalar] = {
        LOSS: float(result.loss),
        LOCAL_STEPS: int(result.steps),
        STEP_BUDGET: budget_of(result.steps, plan),
        **client._key_metrics(),
    }
    w = [np.asarray(t, dtype=np.float64) for t in result.params]
    return w, int(client.X.shape[0]), metrics
