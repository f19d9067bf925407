"""The legacy-API translator of the peer baselines `SCAFFOLD` and `FedDyn`.

`PeerStrategy` is Flower's legacy `FedAvg` (its keywords and sampling) around one
`flwr_admm.rounds.peers.PeerRound`, which holds x, the server state and the update:
``configure_fit`` sends every sampled client the round's arrays under its
``peer-algorithm`` config, with its own acknowledgement (``admm-ack-round``);
``aggregate_fit`` reads each FitRes into a `Reply` (client key, blocks, n_i, cid,
reported round), rejects and counts the unusable ones and those the round refuses
(`PeerRound.admit`: key conflicts, out-of-sync states), and folds the rest.
"""

from __future__ import annotations

from functools import partial
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

from flwr_admm.core.health import DEFAULT_HEALTH, HealthCheck
from flwr_admm.core.validation import reply_problem
from flwr_admm.protocol import (
    ACK_ROUND,
    NUM_FAILURES,
    NUM_KEY_CONFLICTS,
    NUM_REJECTED,
    RESERVED_CONFIG_KEYS,
    RESERVED_CONFIG_PREFIXES,
    ROUND,
)
from flwr_admm.rounds.identity import client_key_of
from flwr_admm.rounds.peers import PeerRound, Reply, previous_round
from flwr_admm.rounds.report import without_reply_keys
from flwr_admm.rounds.sampling import unconfigured
from flwr_admm.uplink.wire import parameters_problem

__all__ = ["PeerStrategy"]


class PeerStrategy(FedAvg):
    """FedAvg's sampling and keywords around a peer baseline's round (`PeerRound`).

    ``health`` (a `HealthCheck`, default on; None: off) is the divergence watchdog
    (`PeerRound.watch`). Which node may speak for a key is the round's `KeyBinding`
    (``key_binding`` of `SCAFFOLD` / `FedDyn`, FedADMM's policy): a refused claim is
    rejected and counted in ``num_key_conflicts``.
    """

    def __init__(
        self,
        algorithm: PeerRound,
        *,
        health: HealthCheck | None = DEFAULT_HEALTH,
        **fedavg_kwargs: Any,
    ) -> None:
        super().__init__(**fedavg_kwargs)
        self.algorithm = algorithm
        self.history: list[dict[str, Scalar]] = []
        self.health = health
        algorithm.watch_with(health, type(self).__name__)

    @property
    def current(self) -> NDArrays | None:
        """Return x in float64 (None before the first round)."""
        return self.algorithm.current

    # ------------------------------------------------------------ Flower API
    def configure_fit(
        self, server_round: int, parameters: Parameters, client_manager: ClientManager
    ) -> list[tuple[ClientProxy, FitIns]]:
        """Sample as FedAvg; send every sampled client x (and the hook's arrays), its ack."""
        self.algorithm.begin(parameters_to_ndarrays(parameters))
        instructions = super().configure_fit(server_round, parameters, client_manager)
        self.algorithm.connected(client_manager.all())
        sent = ndarrays_to_parameters(self.algorithm.sent())
        own = self.algorithm.own_config(server_round)
        reserved = {*own, ACK_ROUND, *RESERVED_CONFIG_KEYS}
        out = []
        for proxy, ins in instructions:
            clash = sorted(
                k for k in ins.config if k in reserved or k.startswith(RESERVED_CONFIG_PREFIXES)
            )
            if clash:
                raise ValueError(
                    f"on_fit_config_fn: {clash[0]!r} is set by {type(self).__name__} "
                    f"(reserved: {sorted(reserved)} and keys starting with "
                    f"{list(RESERVED_CONFIG_PREFIXES)}); rename it"
                )
            config = {**ins.config, **own, **self.algorithm.instruction(proxy.cid)}
            out.append((proxy, FitIns(sent, config)))
        self.algorithm.num_sent = len(out)
        return out

    def aggregate_fit(
        self,
        server_round: int,
        results: list[tuple[ClientProxy, FitRes]],
        failures: list[tuple[ClientProxy, FitRes] | BaseException],
    ) -> tuple[Parameters | None, dict[str, Scalar]]:
        """Fold the valid replies in key order into x (and the server state).

        Raises ValueError before any ``configure_fit`` (no x was sent: `unconfigured`).
        """
        counts: dict[str, Scalar] = {
            NUM_FAILURES: len(failures),
            NUM_REJECTED: 0,
            NUM_KEY_CONFLICTS: 0,
        }
        name = type(self).__name__
        if self.algorithm.current is None:
            raise unconfigured(name, "aggregate_fit", "configure_fit")
        # Flower's DefaultWorkflow drops replies that never came (Server.fit counted them)
        failed = len(failures) + max(0, self.algorithm.num_sent - len(results) - len(failures))
        self.algorithm.num_sent = 0
        if not results or (not self.accept_failures and failures):
            self.algorithm.watch(server_round, (0, 0, failed))
            return None, counts
        valid, accepted = self._valid_replies(results, counts)
        kept, settled = self.algorithm.admit(valid, partial(self._reject, counts))
        counts.update(settled)
        replies = [valid[i] for i in kept]
        tally = (len(replies), int(counts[NUM_REJECTED]), failed)
        if not replies:
            log(WARNING, "%s round %s: no usable reply; model unchanged", name, server_round)
            self.algorithm.watch(server_round, tally)
            return None, counts
        before = self.algorithm.current  # fold replaces x (and its arrays), never edits them
        own = self.algorithm.fold(replies, server_round)
        metrics: dict[str, Scalar] = {**own, **counts}
        if self.fit_metrics_aggregation_fn is not None:
            user = without_reply_keys(
                self.fit_metrics_aggregation_fn(
                    [(accepted[i].num_examples, accepted[i].metrics) for i in kept]
                )
            )
            metrics = {**user, **metrics}
        self.history.append({ROUND: server_round, **metrics})
        self.algorithm.watch(server_round, tally, before, own)
        return ndarrays_to_parameters(self.algorithm.model()), metrics

    def _valid_replies(
        self, results: list[tuple[ClientProxy, FitRes]], counts: dict[str, Scalar]
    ) -> tuple[list[Reply], list[FitRes]]:
        """Every reply that passes the checks, as a `Reply` and as received; the rest counted."""
        shapes = self.algorithm.reply_shapes()
        replies: list[Reply] = []
        accepted: list[FitRes] = []
        for proxy, res in results:
            key, previous = "", None
            try:
                problem = parameters_problem(res.parameters, shapes)  # before any copy
                arrays = [] if problem else parameters_to_ndarrays(res.parameters)
                problem = problem or reply_problem(arrays, res.num_examples, shapes)
                if problem is None:
                    key = client_key_of(proxy.cid, res.metrics)
                    previous = previous_round(res.metrics)
            except Exception as error:  # a malformed reply must not stop the server
                problem = f"unreadable reply ({error!r})"
            if problem is not None:
                self._reject(counts, f"cid {proxy.cid}", problem, False)
                continue
            floats = [np.asarray(a, dtype=np.float64) for a in arrays]
            replies.append(Reply(key, floats, int(res.num_examples), proxy.cid, previous))
            accepted.append(res)
        return replies, accepted

    def _reject(self, counts: dict[str, Scalar], who: str, problem: str, conflict: bool) -> None:
        """Log and count a rejected reply (and a key conflict if `conflict`)."""
        log(WARNING, "%s: rejected reply of %s: %s", self.algorithm.peer, who, problem)
        counts[NUM_REJECTED] = int(counts[NUM_REJECTED]) + 1
        counts[NUM_KEY_CONFLICTS] = int(counts[NUM_KEY_CONFLICTS]) + int(conflict)
