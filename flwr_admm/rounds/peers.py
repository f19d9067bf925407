"""The round skeleton the peer baselines `SCAFFOLD` and `FedDyn` share.

Both keep the global model x in float64 between rounds, send it (SCAFFOLD with its
control variate appended) under a ``peer-algorithm`` fit config, check every reply
before it may touch the server state, file it under the client's key (``client-key``,
else ``partition-id``, else the node id) and fold the accepted replies in sorted key
order. What differs is a hook each: what is sent, the reply's layout, the update.

Both weight clients by examples: p_i = n_i / sum_{j in S} n_j over the round's
accepted replies for the model step, and n_i / sum_{j seen} n_j over every client
seen so far for the server's running state (SCAFFOLD's c, FedDyn's h), each client
counted with the n_i of its first accepted reply. With equal n_i and once every client
has been seen these are the papers' uniform 1/|S| and 1/N; before that the state
averages the clients seen so far, where the papers count unseen clients as zero.

Both hand every round to the divergence watchdog (``health``, `flwr_admm.core.health`;
the Message-API `flwr_admm.serverapp.peer_base.PeerFedAvg` through the same object):
a NaN/inf or exploding x, a rising update norm or rounds without an accepted reply
raise `RunDivergedError` from the aggregation.
"""

from __future__ import annotations

from collections.abc import Iterator
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
from numpy.typing import NDArray

from flwr_admm.core.health import DEFAULT_HEALTH, PEER_ADVICE, HealthCheck, RunHealth
from flwr_admm.core.types import natural_key
from flwr_admm.core.validation import reply_problem
from flwr_admm.protocol import (
    NUM_CLIENTS_CACHED,
    NUM_FAILURES,
    NUM_REJECTED,
    NUM_REPLIES,
    PEER,
    RESERVED_CONFIG_KEYS,
    ROUND,
    SERVER_ROUND,
)
from flwr_admm.rounds.identity import client_key_of
from flwr_admm.rounds.report import watch_round, without_reply_keys
from flwr_admm.rounds.sampling import unconfigured

Reply = tuple[str, NDArrays, int]  # (client key, reply arrays in float64, n_i)


class PeerStrategy(FedAvg):
    """FedAvg's sampling and keywords, with x, the examples seen and three hooks.

    Subclasses set `peer` and implement `_outgoing` (the arrays sent with x),
    `_blocks` (how many model-shaped blocks a reply holds) and `_update` (x' and the
    round metrics from the accepted replies, state updated in place). ``health`` (a
    `HealthCheck`, default on; None: off) is the divergence watchdog (`watch`).
    """

    peer: str = ""

    def __init__(
        self, *, health: HealthCheck | None = DEFAULT_HEALTH, **fedavg_kwargs: Any
    ) -> None:
        super().__init__(**fedavg_kwargs)
        self.current: NDArrays | None = None  # x, float64
        self.dtypes: list[np.dtype[Any]] = []
        self.examples: dict[str, int] = {}  # n_i of every client seen, by key
        self.history: list[dict[str, Scalar]] = []
        self.health = health
        self.health_state = RunHealth.of(health, type(self).__name__, PEER_ADVICE)
        self.num_sent = 0  # fit instructions of this round (replies may never come)

    # ------------------------------------------------------------------ hooks
    def _outgoing(self, x: NDArrays) -> NDArrays:
        raise NotImplementedError

    def _blocks(self) -> int:
        raise NotImplementedError

    def _config(self) -> dict[str, Scalar]:
        """Return the algorithm's own fit-config entries besides ``peer-algorithm``."""
        return {}

    def _update(self, x: NDArrays, replies: list[Reply]) -> tuple[NDArrays, dict[str, Scalar]]:
        raise NotImplementedError

    # ------------------------------------------- the round, without Flower's types
    def begin(self, received: NDArrays) -> None:
        """Take x (kept in float64) and the model's dtypes from the first model received."""
        if self.current is None:
            self.dtypes = [np.asarray(t).dtype for t in received]
            self.current = [np.asarray(t, dtype=np.float64) for t in received]

    def sent(self) -> NDArrays:
        """Return what every sampled client receives (x, then the hook's blocks).

        In the model's own dtypes: a float32 model costs float32 bytes on the wire.
        """
        assert self.current is not None
        outgoing = self._outgoing(self.current)
        dtypes = self.dtypes * (len(outgoing) // len(self.dtypes))
        return [a.astype(d, copy=False) for a, d in zip(outgoing, dtypes, strict=True)]

    def own_config(self, server_round: int) -> dict[str, Scalar]:
        """Return the config entries this strategy sets (``peer-algorithm``, the round, ...)."""
        return {PEER: self.peer, SERVER_ROUND: server_round, **self._config()}

    def reply_shapes(self) -> list[tuple[int, ...]]:
        """Return the shapes a reply must have: the model's, `_blocks` times."""
        assert self.current is not None
        return [t.shape for t in self.current] * self._blocks()

    def fold(self, replies: list[Reply]) -> dict[str, Scalar]:
        """Fold accepted replies (one per key) in key order into x and the state.

        Each client's n_i is remembered from its first accepted reply; returns the
        round's metrics (the hook's, ``num_replies``, ``num_clients_cached``).
        """
        assert self.current is not None
        replies = sorted(replies, key=lambda reply: natural_key(reply[0]))
        for key, _, n in replies:
            self.examples.setdefault(key, n)
        self.current, own = self._update(self.current, replies)
        return {**own, NUM_REPLIES: len(replies), NUM_CLIENTS_CACHED: len(self.examples)}

    def model(self) -> NDArrays:
        """Return x in the model's own dtypes."""
        assert self.current is not None
        return [a.astype(d, copy=False) for a, d in zip(self.current, self.dtypes, strict=True)]

    def watch(
        self,
        server_round: int,
        tally: tuple[int, int, int],
        before: NDArrays | None = None,
        metrics: dict[str, Any] | None = None,
    ) -> None:
        """Hand a round to the watchdog: replies accepted/rejected/failed, x sent, x' now.

        `before` is x as sent (float64, as `current` was), None when nothing was
        aggregated; both are measured in the model's dtypes, a tensor at a time.
        """
        if self.health_state is not None:
            after = None if before is None else self._in_dtypes(self.current)
            sent = None if before is None else self._in_dtypes(before)
            watch_round(self.health_state, server_round, tally, sent, after, metrics)

    def _in_dtypes(self, x: NDArrays | None) -> Iterator[NDArray[Any]]:
        assert x is not None
        return (a.astype(d, copy=False) for a, d in zip(x, self.dtypes, strict=True))

    # ------------------------------------------------------------ Flower API
    def configure_fit(
        self, server_round: int, parameters: Parameters, client_manager: ClientManager
    ) -> list[tuple[ClientProxy, FitIns]]:
        """Sample as FedAvg and send every sampled client x (and the hook's arrays)."""
        self.begin(parameters_to_ndarrays(parameters))
        instructions = super().configure_fit(server_round, parameters, client_manager)
        sent = ndarrays_to_parameters(self.sent())
        own = self.own_config(server_round)
        out = []
        for proxy, ins in instructions:
            clash = sorted(k for k in ins.config if k in own or k in RESERVED_CONFIG_KEYS)
            if clash:
                raise ValueError(
                    f"on_fit_config_fn: {clash[0]!r} is set by {type(self).__name__} "
                    f"(reserved: {sorted({*own, *RESERVED_CONFIG_KEYS})}); rename it"
                )
            out.append((proxy, FitIns(sent, {**ins.config, **own})))
        self.num_sent = len(out)
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
        counts: dict[str, Scalar] = {NUM_FAILURES: len(failures), NUM_REJECTED: 0}
        name = type(self).__name__
        if self.current is None:
            raise unconfigured(name, "aggregate_fit", "configure_fit")
        # Flower's DefaultWorkflow drops replies that never came (Server.fit counted them)
        failed = len(failures) + max(0, self.num_sent - len(results) - len(failures))
        self.num_sent = 0
        if not results or (not self.accept_failures and failures):
            self.watch(server_round, (0, 0, failed))
            return None, counts
        replies = self._valid_replies(results, counts)
        tally = (len(replies), int(counts[NUM_REJECTED]), failed)
        if not replies:
            log(WARNING, "%s round %s: no usable reply; model unchanged", name, server_round)
            self.watch(server_round, tally)
            return None, counts
        before = self.current  # fold replaces x (and its arrays), never writes into them
        own = self.fold(replies)
        metrics: dict[str, Scalar] = {**own, **counts}
        if self.fit_metrics_aggregation_fn is not None:
            user = without_reply_keys(
                self.fit_metrics_aggregation_fn(
                    [(res.num_examples, res.metrics) for res in self._accepted]
                )
            )
            metrics = {**user, **metrics}
        self.history.append({ROUND: server_round, **metrics})
        self.watch(server_round, tally, before, own)
        return ndarrays_to_parameters(self.model()), metrics

    def _valid_replies(
        self, results: list[tuple[ClientProxy, FitRes]], counts: dict[str, Scalar]
    ) -> list[Reply]:
        """(key, arrays, n_i) of every reply that passes the checks; the rest counted."""
        shapes = self.reply_shapes()
        replies: list[Reply] = []
        self._accepted: list[FitRes] = []
        seen: set[str] = set()
        for proxy, res in results:
            key = ""
            try:
                arrays = parameters_to_ndarrays(res.parameters)
                problem = reply_problem(arrays, res.num_examples, shapes)
                if problem is None:
                    key = client_key_of(proxy.cid, res.metrics)
                    problem = f"a second reply for {key} this round" if key in seen else None
            except Exception as error:  # a malformed reply must not stop the server
                problem = f"unreadable reply ({error!r})"
            if problem is not None:
                log(WARNING, "%s: rejected reply of cid %s: %s", self.peer, proxy.cid, problem)
                counts[NUM_REJECTED] = int(counts[NUM_REJECTED]) + 1
                continue
            seen.add(key)
            self._accepted.append(res)
            floats = [np.asarray(a, dtype=np.float64) for a in arrays]
            replies.append((key, floats, int(res.num_examples)))
        return replies

    def weights(self, replies: list[Reply]) -> list[float]:
        """Return p_i = n_i / sum_{j in S} n_j for the model step."""
        total = float(sum(n for _, _, n in replies))
        return [n / total for _, _, n in replies]

    def state_weight(self, key: str) -> float:
        """Return n_i (first accepted) of client `key`: its weight in the running state."""
        return float(self.examples[key])

    def seen_examples(self) -> float:
        """Return sum_{j seen} n_j, the normalizer of the running state."""
        return float(sum(self.examples.values()))
