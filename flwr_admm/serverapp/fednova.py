"""FedNova on Flower's Message API: the `flwr_admm.rounds.fednova` update.

A subclass of `flwr.serverapp.strategy.FedAvg` (same keywords, same sampling and
messages: every sampled node receives the global model x under ``arrays``). With
w_i a node's returned model, n_i its ``num-examples`` (`weighted_by_key`), tau_i its
``local_steps`` metric and p_i = n_i / sum_j n_j over the usable replies,

    x' = x - tau_eff * sum_i p_i (x - w_i) / tau_i,    tau_eff = sum_i p_i tau_i

(`flwr_admm.rounds.fednova.normalized_average`, so identical replies give the
legacy strategy's x' exactly). A reply Flower's FedAvg would abort the run on
(`InconsistentMessageReplies`) or that the legacy FedNova rejects (wrong names or
shapes, NaN, non-positive num-examples, a missing or non-integer ``local_steps``,
0 steps with a changed model) is logged and counted in ``num_rejected`` instead. The
divergence watchdog (``health``, `flwr_admm.core.health`) sees every round.
"""

from __future__ import annotations

from collections.abc import Iterable
from logging import WARNING
from typing import Any

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord
from flwr.common.logger import log
from flwr.serverapp import Grid
from flwr.serverapp.strategy import FedAvg

from flwr_admm.core.health import DEFAULT_HEALTH, PEER_ADVICE, HealthCheck, RunHealth
from flwr_admm.core.types import Arrays
from flwr_admm.core.validation import reply_problem
from flwr_admm.protocol import LOCAL_STEPS, NUM_FAILURES, NUM_REJECTED, NUM_REPLIES, TAU_EFF
from flwr_admm.rounds.fednova import local_steps_problem, normalized_average
from flwr_admm.rounds.report import watch_round
from flwr_admm.rounds.sampling import unconfigured
from flwr_admm.serverapp.records_old import Layout, merge_metrics, read_reply

__all__ = ["FedNova"]


class FedNova(FedAvg):
    """Federated normalized averaging for nodes running plain local (S)GD.

    Takes every keyword of Flower's Message-API `FedAvg`. Nodes MUST run plain
    gradient steps from the received arrays (no proximal term) and report the number
    of steps as the integer metric ``"local_steps"`` (`flwr_admm.clientapp`'s app
    around an `ADMMClient` does). ``health``: the divergence watchdog, as in the legacy
    FedNova (a `HealthCheck`, default on; None: off).

    Update: x' = x - tau_eff * sum_i p_i (x - w_i) / tau_i, tau_eff = sum_i p_i tau_i.
    """

    def __init__(
        self, *, health: HealthCheck | None = DEFAULT_HEALTH, **fedavg_kwargs: Any
    ) -> None:
        super().__init__(**fedavg_kwargs)
        self.current: ArrayRecord | None = None
        self.health = health
        self.health_state = RunHealth.of(health, "FedNova", PEER_ADVICE)
        self._num_sent = 0  # train messages of this round

    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """Remember the global model x the nodes start from; sample and send as FedAvg."""
        self.current = arrays
        messages = list(super().configure_train(server_round, arrays, config, grid))
        self._num_sent = len(messages)  # replies missing from aggregate_train were lost
        return messages

    def aggregate_train(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """Return x' = x - tau_eff * sum_i p_i (x - w_i) / tau_i over the usable replies.

        Raises ValueError before any ``configure_train`` (no x was sent: `unconfigured`).
        """
        if self.current is None:
            raise unconfigured("FedNova", "aggregate_train", "configure_train")
        replies, sent, self._num_sent = list(replies), self._num_sent, 0
        counts = {NUM_FAILURES: sum(m.has_error() for m in replies), NUM_REJECTED: 0}
        layout = Layout.of(self.current)
        x = layout.read(self.current)
        usable: list[tuple[Arrays, int, int]] = []
        contents = []
        for message in replies:
            if message.has_error():
                continue
            problem, entry = _read(message, layout, x, self.weighted_by_key)
            if problem is not None or entry is None:
                log(WARNING, "FedNova: rejected reply of node %s: %s", _src(message), problem)
                counts[NUM_REJECTED] += 1
                continue
            usable.append(entry)
            contents.append(message.content)
        lost = max(0, sent - len(replies))  # late replies are simply absent
        tally = (len(usable), counts[NUM_REJECTED], counts[NUM_FAILURES] + lost)
        if not usable:
            log(WARNING, "FedNova round %s: no usable reply; model unchanged", server_round)
            watch_round(self.health_state, server_round, tally)
            return None, MetricRecord(counts)  # type: ignore[arg-type]
        new_x, tau_eff = normalized_average(x, usable)
        ours = {TAU_EFF: tau_eff, NUM_REPLIES: len(usable), **counts}
        metrics = merge_metrics(self.train_metrics_aggr_fn, contents, self.weighted_by_key, ours)
        new = layout.record(new_x)
        if self.health_state is not None:  # x sent, x' returned: read a tensor at a time
            before = (a.numpy() for a in self.current.values())
            watch_round(
                self.health_state, server_round, tally, before, (a.numpy() for a in new.values())
            )
        return new, metrics


def _src(message: Message) -> int:
    return int(message.metadata.src_node_id)


def _read(
    message: Message, layout: Layout, x: Arrays, weighted_by_key: str
) -> tuple[str | None, tuple[Arrays, int, int] | None]:
    """Return (problem, None) or (None, (w_i, n_i, tau_i)) for one content reply."""
    reply = read_reply(message, layout, weighted_by_key)
    if reply.problem is not None:
        return reply.problem, None
    try:
        tau = next(iter(message.content.metric_records.values())).get(LOCAL_STEPS)
        problem = reply_problem(reply.arrays, reply.num_examples, list(layout.shapes))
        if problem is None:
            problem = local_steps_problem(tau)
    except Exception as error:  # a malformed reply must not stop the server
        return f"unreadable reply ({error!r})", None
    if problem is not None:
        return problem, None
    steps = int(tau)  # type: ignore[arg-type]
    if steps == 0 and not all(np.array_equal(w, xk) for w, xk in zip(reply.arrays, x, strict=True)):
        return "local_steps is 0 but the parameters changed", None
    return None, (reply.arrays, reply.num_examples, steps)
