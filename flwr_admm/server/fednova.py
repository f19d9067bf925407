"""FedNova on Flower's legacy API: normalized averaging of local SGD.

Flower ships no FedNova. The update, x' = x - tau_eff * sum_i p_i (x - w_i) / tau_i
with tau_eff = sum_i p_i tau_i, is `flwr_admm.rounds.fednova.normalized_average`
(the math is stated there), which the Message-API `flwr_admm.serverapp.fednova.FedNova`
runs too.
"""

from __future__ import annotations

from logging import WARNING
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

from flwr_admm.core.health import DEFAULT_HEALTH, PEER_ADVICE, HealthCheck, RunHealth
from flwr_admm.core.validation import reply_problem
from flwr_admm.protocol import LOCAL_STEPS, NUM_FAILURES, NUM_REJECTED, NUM_REPLIES, ROUND, TAU_EFF
from flwr_admm.rounds.fednova import local_steps_problem, normalized_average
from flwr_admm.rounds.report import watch_round, without_reply_keys
from flwr_admm.rounds.sampling import unconfigured
from flwr_admm.uplink.wire import parameters_problem


class FedNova(FedAvg):
    """Federated normalized averaging for clients running plain local (S)GD.

    Takes every keyword of Flower's `FedAvg`. Clients MUST run plain gradient steps
    from the received parameters (no proximal term) and report the number of steps
    they took as the integer fit metric ``"local_steps"`` (`flwr_admm.client.ADMMClient`
    does). A reply without a valid ``local_steps`` is rejected, like a reply with
    wrong shapes or NaN entries; a client that took 0 steps must return x unchanged
    and then contributes d_i = 0. ``health`` (a `HealthCheck`, default on; None: off)
    is the divergence watchdog (`flwr_admm.core.health`): a NaN/inf or exploding x, a
    rising update norm or rounds without an accepted reply raise `RunDivergedError`.

    Update: x' = x - tau_eff * sum_i p_i (x - w_i) / tau_i, tau_eff = sum_i p_i tau_i.
    """

    def __init__(
        self, *, health: HealthCheck | None = DEFAULT_HEALTH, **fedavg_kwargs: Any
    ) -> None:
        super().__init__(**fedavg_kwargs)
        self.current: NDArrays | None = None
        self.history: list[dict[str, Scalar]] = []
        self.health = health
        self.health_state = RunHealth.of(health, "FedNova", PEER_ADVICE)
        self._num_sent = 0  # fit instructions of this round (replies may never come)

    def __repr__(self) -> str:
        return f"FedNova(accept_failures={self.accept_failures})"

    def configure_fit(
        self, server_round: int, parameters: Parameters, client_manager: ClientManager
    ) -> list[tuple[ClientProxy, FitIns]]:
        """Remember the global model x the clients start from, then sample as FedAvg."""
        self.current = parameters_to_ndarrays(parameters)
        instructions = super().configure_fit(server_round, parameters, client_manager)
        self._num_sent = len(instructions)
        return instructions

    def aggregate_fit(
        self,
        server_round: int,
        results: list[tuple[ClientProxy, FitRes]],
        failures: list[tuple[ClientProxy, FitRes] | BaseException],
    ) -> tuple[Parameters | None, dict[str, Scalar]]:
        """X' = x - tau_eff * sum_i p_i (x - w_i) / tau_i over the valid replies.

        Raises ValueError before any ``configure_fit`` (no x was sent: `unconfigured`).
        """
        counts: dict[str, Scalar] = {NUM_FAILURES: len(failures), NUM_REJECTED: 0}
        if self.current is None:
            raise unconfigured("FedNova", "aggregate_fit", "configure_fit")
        # Flower's DefaultWorkflow drops replies that never came (Server.fit counted them)
        failed = len(failures) + max(0, self._num_sent - len(results) - len(failures))
        self._num_sent = 0
        if not results or (not self.accept_failures and failures):
            watch_round(self.health_state, server_round, (0, 0, failed))
            return None, counts
        replies = self._valid_replies(results, counts)
        tally = (len(replies), int(counts[NUM_REJECTED]), failed)
        if not replies:
            log(WARNING, "FedNova round %s: no usable reply; model unchanged", server_round)
            watch_round(self.health_state, server_round, tally)
            return None, counts
        x = [np.asarray(t, dtype=np.float64) for t in self.current]
        new_x, tau_eff = normalized_average(x, replies)
        metrics: dict[str, Scalar] = {
            TAU_EFF: tau_eff,
            NUM_REPLIES: len(replies),
            **counts,
        }
        if self.fit_metrics_aggregation_fn is not None:
            user = without_reply_keys(
                self.fit_metrics_aggregation_fn(
                    [(res.num_examples, res.metrics) for _, res in results]
                )
            )
            metrics = {**user, **metrics}
        self.history.append({ROUND: server_round, **metrics})
        dtypes = [np.asarray(t).dtype for t in self.current]
        new = [a.astype(d, copy=False) for a, d in zip(new_x, dtypes, strict=True)]
        watch_round(self.health_state, server_round, tally, self.current, new)
        return ndarrays_to_parameters(new), metrics

    def _valid_replies(
        self, results: list[tuple[ClientProxy, FitRes]], counts: dict[str, Scalar]
    ) -> list[tuple[NDArrays, int, int]]:
        """(w_i, n_i, tau_i) of every reply that passes the checks."""
        assert self.current is not None
        shapes = [np.shape(t) for t in self.current]
        replies = []
        for proxy, res in results:
            try:
                problem = parameters_problem(res.parameters, shapes)  # before any copy
                arrays = [] if problem else parameters_to_ndarrays(res.parameters)
                problem = problem or reply_problem(arrays, res.num_examples, shapes)
                tau = res.metrics.get(LOCAL_STEPS)
                if problem is None:
                    problem = local_steps_problem(tau)
            except Exception as error:  # a malformed reply must not stop the server
                problem = f"unreadable reply ({error!r})"
            if problem is None and int(tau) == 0:  # type: ignore[arg-type]
                if not all(np.array_equal(w, x) for w, x in zip(arrays, self.current, strict=True)):
                    problem = "local_steps is 0 but the parameters changed"
            if problem is not None:
                log(WARNING, "FedNova: rejected reply of cid %s: %s", proxy.cid, problem)
                counts[NUM_REJECTED] = int(counts[NUM_REJECTED]) + 1
                continue
            replies.append((arrays, int(res.num_examples), int(tau)))  # type: ignore[arg-type]
        return replies
