"""The round the peer baselines `SCAFFOLD` and `FedDyn` share, without Flower's types.

Both keep the global model x in float64 between rounds, send it (SCAFFOLD with its
control variate appended) under a ``peer-algorithm`` config, check every reply
before it may touch the server state, file it under the client's key (``client-key``,
else ``partition-id``, else the node id) and fold the accepted replies in sorted key
order. What differs is a hook each: what is sent, the reply's layout, the update.

Both weight clients by examples: p_i = n_i / sum_{j in S} n_j over the round's
accepted replies for the model step, and n_i / sum_{j seen} n_j over every client
seen so far for the server's running state (SCAFFOLD's c, FedDyn's h), each client
counted with the n_i of its first accepted reply. With equal n_i and once every client
has been seen these are the papers' uniform 1/|S| and 1/N; before that the state
averages the clients seen so far, where the papers count unseen clients as zero.

Both hand every round to the divergence watchdog (``health``, `flwr_admm.core.health`):
a NaN/inf or exploding x, a rising update norm or rounds without an accepted reply
raise `RunDivergedError` from the aggregation. One `PeerRound` serves each API's
translator (legacy `flwr_admm.server.peer_base.PeerStrategy`, Message API
`flwr_admm.serverapp.peer_base.PeerFedAvg`).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
from flwr.common import NDArrays, Scalar
from numpy.typing import NDArray

from flwr_admm.core.health import PEER_ADVICE, HealthCheck, RunHealth
from flwr_admm.core.types import natural_key
from flwr_admm.protocol import NUM_CLIENTS_CACHED, NUM_REPLIES, PEER, SERVER_ROUND
from flwr_admm.rounds.report import watch_round

__all__ = ["PeerRound", "Reply"]

Reply = tuple[str, NDArrays, int]  # (client key, reply arrays in float64, n_i)


class PeerRound:
    """x in float64, the examples seen and three hooks: one peer baseline's server round.

    Subclasses set `peer` and implement `_outgoing` (the arrays sent with x),
    `_blocks` (how many model-shaped blocks a reply holds) and `_update` (x' and the
    round metrics from the accepted replies, state updated in place). The translator
    holding it sets the divergence watchdog (`watch_with`) and ``num_sent``.
    """

    peer: str = ""

    def __init__(self) -> None:
        self.current: NDArrays | None = None  # x, float64
        self.dtypes: list[np.dtype[Any]] = []
        self.examples: dict[str, int] = {}  # n_i of every client seen, by key
        self.health: HealthCheck | None = None
        self.health_state: RunHealth | None = None
        self.num_sent = 0  # instructions of this round (replies may never come)

    def watch_with(self, health: HealthCheck | None, name: str) -> None:
        """Take the divergence watchdog's thresholds (None: off); `name` labels its errors."""
        self.health = health
        self.health_state = RunHealth.of(health, name, PEER_ADVICE)

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

    # -------------------------------------------------------------- the round
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
