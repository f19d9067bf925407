"""A user's ``@app.train()`` handler in client-held-dual mode, written with `ADMMTrainStep`.

`steps_app` runs the same local solve as `ADMMClient` (20 full-batch gradient steps of
lr 1.0 on f_i(w) + rho/2 ||w - center||^2 from the acknowledged w_i, else the center;
`flwr_admm.core.local_solver.penalized_local_solve`), so its replies equal the ready
ClientApp's bit for bit.
"""

from __future__ import annotations

import numpy as np
from flower_run import seed_data, seed_model
from flwr.app import Context, Message
from flwr.clientapp import ClientApp

from flwr_admm import ADMMClient
from flwr_admm.clientapp import ADMMTrainStep
from flwr_admm.core.local_solver import penalized_local_solve

steps_app = ClientApp()


@steps_app.train()
def train(msg: Message, context: Context) -> Message:
    i = int(context.node_config["partition-id"])
    data = seed_data()
    X, y = data.X[i], data.y[i]
    step = ADMMTrainStep.from_message(msg, context)
    start = list(step.start().values())
    center = list(step.center.values())
    plan = ADMMClient(seed_model(), X, y, local_steps=20, learning_rate=1.0).plan  # its defaults
    rng = np.random.default_rng([0, i, int(step.server_round or 0)])
    result = penalized_local_solve(
        seed_model(), start, X, y, plan, center=center, rho=step.rho, rng=rng
    )
    return step.reply(result.params, len(y), {"loss": float(result.loss)}, context)
