"""A user's ``@app.train()`` handler in client-held-dual mode, written with `ADMMTrainStep`.

`steps_app` runs the same local solve as `ADMMClient` (20 full-batch gradient steps of
lr 1.0 on f_i(w) + rho/2 ||w - center||^2 from the acknowledged w_i, else the center;
`flwr_admm.core.local_solver.penalized_local_solve`), so its replies equal the ready
ClientApp's bit for bit. `FaultyGrid` loses, replays or corrupts scripted replies and
wipes a node's state.
"""

from __future__ import annotations

import numpy as np
from flower_run import seed_data, seed_model
from flwr.app import Array, Context, Message, RecordDict
from flwr.clientapp import ClientApp

from flwr_admm.client import ADMMClient
from flwr_admm.clientapp import ADMMTrainStep
from flwr_admm.core.local_solver import penalized_local_solve
from flwr_admm.protocol import (
    DELAYED_SQ_RESIDUAL,
    EXAMPLES_CHANGE,
    NUM_EXAMPLES,
    PREVIOUS_ROUND,
    RESTORE,
    RESTORE_EXAMPLES,
    RESYNC,
)
from flwr_admm.serverapp.testing import InProcessGrid

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


class FaultyGrid(InProcessGrid):
    """An `InProcessGrid` whose scripted (node index, round) deliveries misbehave.

    "lost": the node trains and keeps its new state, but the reply never arrives (a
    late reply is absent in Flower); "wipe": the node's ``context.state`` is lost
    before this round (a SuperNode restart without its state); "nan": the reply
    arrives with a NaN; "replay": the node's previous reply arrives instead of this one;
    "forge": the node keeps its state but claims a resync (its Delta_i sent as a full
    contribution, ``admm-previous-round`` 0, ``admm-resync`` 1); "amnesia": "wipe",
    and the server's offer of its kept share (``admm-restore``) does not reach the node
    (a client that does not take it), so it resyncs every time: a memoryless client.
    """

    def __init__(self, app: ClientApp, num_nodes: int, faults: dict[int, dict[int, str]]) -> None:
        super().__init__(app, num_nodes)
        self.faults = faults
        self.last: dict[int, Message] = {}

    def _deliver(self, message: Message) -> Message | None:
        node_id = message.metadata.dst_node_id
        server_round = int(message.content["config"]["server-round"])
        fault = self.faults.get(node_id - 1, {}).get(server_round)
        if fault in ("wipe", "amnesia"):
            self.contexts[node_id].state = RecordDict()
        if fault == "amnesia":
            config = message.content["config"]
            config.pop(RESTORE, None)
            config.pop(RESTORE_EXAMPLES, None)
        reply = super()._deliver(message)
        previous = self.last.get(node_id)
        if reply is not None:
            self.last[node_id] = reply
        if fault == "lost":
            return None
        if fault == "nan" and reply is not None:
            record = reply.content["arrays"]
            name = next(iter(record.keys()))
            broken = record[name].numpy().copy()
            broken.reshape(-1)[0] = np.nan
            record[name] = Array(broken)
        if fault == "replay" and previous is not None:
            return Message(previous.content, reply_to=self.sent[-1])
        if fault == "forge" and reply is not None:
            metrics = reply.content["metrics"]
            metrics.pop(DELAYED_SQ_RESIDUAL, None)
            metrics[PREVIOUS_ROUND], metrics[RESYNC] = 0, 1
            metrics[EXAMPLES_CHANGE] = metrics[NUM_EXAMPLES]
        return reply
