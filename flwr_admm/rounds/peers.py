"""The round the peer baselines `SCAFFOLD` and `FedDyn` share, without Flower's types.

Both keep the global model x in float64 between rounds, send it (SCAFFOLD with its
control variate appended) under a ``peer-algorithm`` config, check every reply
before it may touch the server state, file it under the client's key (``client-key``,
else ``partition-id``, else the node id) and fold the accepted replies in sorted key
order. What differs is a hook each: what is sent, the reply's layout, the update.

Both weight clients by examples: p_i = n_i / sum_{j in S} n_j over the round's
accepted replies for the model step, and n_i / sum_{j held} n_j over every client
the server holds for its running state (SCAFFOLD's c, FedDyn's h), each client
counted with the n_i of its first accepted reply. With equal n_i and once every client
has been seen these are the papers' uniform 1/|S| and 1/N; before that the state
averages the clients seen so far, where the papers count unseen clients as zero.

Acknowledgement. Client i's state s_i (SCAFFOLD's c_i, FedDyn's grad_i; zero at
first) changes by ds_i with every reply it sends, and the server state is
Sigma / N, Sigma = sum_{i held} n_i s_i, N = sum_{i held} n_i. A reply the server
never folds (lost, rejected, a NaN) must not change s_i, and a client that lost s_i
must not leave its old share in Sigma. So the server keeps, per key, n_i, the round
a_i of the last reply it folded and s_i^S, the state as folded (one model-sized array
per key), and tells each sampled node, in ``admm-ack-round``, a_i for the key the
node speaks for (0: it holds none). The client keeps its newest state P (round p,
after its last reply) and, until acknowledged, the one before it C (round a_c), and
trains from

    P  if p == a       (its last reply was folded: C := P)
    C  if a_c == a     (it was not: P is dropped)
    0  otherwise       (a == 0: the server holds none of it; else its state is gone)

reporting in ``admm-previous-round`` the round q of the state it trained from (0: the
zero state). The server folds a reply with q == a_i (a_i = 0 for a new key):
s_i^S += ds_i, Sigma += n_i ds_i, a_i := k; with q == 0 for a key it holds (a
resync) it first takes the old share out, Sigma -= n_i s_i^S, and forgets the key,
which then starts over as a new one; any other q is rejected (``num_state_mismatch``)
and the next acknowledgement brings the client back. By induction s_i^S is client
i's state after every instruction, so Sigma / N is exactly (up to rounding) the
n-weighted mean of the clients' states, as in a run without the fault, and the fixed
point is the fault-free one. A reply without ``admm-previous-round`` (a handler that
ignores the acknowledgement) is folded as in sync.

Identity: a `flwr_admm.rounds.identity.KeyBinding` (``key_binding``, as FedADMM's)
settles which node may speak for a key; a conflicting claim is rejected and counted
(``num_key_conflicts``); a key whose node left is freed: its share leaves Sigma.

Both hand every round to the divergence watchdog (``health``, `flwr_admm.core.health`):
a NaN/inf or exploding x, a rising update norm or rounds without an accepted reply
raise `RunDivergedError` from the aggregation. One `PeerRound` serves each API's
translator (legacy `flwr_admm.server.peer_base.PeerStrategy`, Message API
`flwr_admm.serverapp.peer_base.PeerFedAvg`).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any, NamedTuple

import numpy as np
from flwr.common import NDArrays, Scalar
from numpy.typing import NDArray

from flwr_admm.core.health import PEER_ADVICE, HealthCheck, RunHealth
from flwr_admm.core.types import natural_key
from flwr_admm.protocol import (
    ACK_ROUND,
    NUM_CLIENTS_CACHED,
    NUM_EVICTED,
    NUM_REPLIES,
    NUM_RESYNCED,
    NUM_STATE_MISMATCH,
    PEER,
    PREVIOUS_ROUND,
    SERVER_ROUND,
)
from flwr_admm.rounds.identity import KeyBinding, Reject
from flwr_admm.rounds.report import watch_round

__all__ = ["PeerRound", "Reply", "previous_round"]


class Reply(NamedTuple):
    """One readable reply: its key, arrays (float64), n_i, node and reported round q."""

    key: str
    arrays: NDArrays
    num_examples: int
    cid: str  # the sending node (legacy cid, Message-API node id)
    previous: int | None  # ``admm-previous-round`` (None: not reported)


def previous_round(metrics: Mapping[str, Any]) -> int | None:
    """Return a reply's ``admm-previous-round`` (None if absent); ValueError unless an int >= 0."""
    if PREVIOUS_ROUND not in metrics:
        return None
    value = metrics[PREVIOUS_ROUND]
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < 0:
        raise ValueError(f"{PREVIOUS_ROUND}: must be an integer >= 0, got {value!r}")
    return int(value)


class PeerRound:
    """x in float64, the per-key states and three hooks: one peer baseline's server round.

    Subclasses set `peer` and implement `_outgoing` (the arrays sent with x),
    `_blocks` (how many model-shaped blocks a reply holds) and `_update` (x' and the
    round metrics from the accepted replies; it adds each client's state change to
    `state_sum` and to `held`). The translator holding it sets the divergence
    watchdog (`watch_with`) and ``num_sent``. `key_binding` is the `KeyBinding` policy.
    """

    peer: str = ""

    def __init__(self, key_binding: str = "node") -> None:
        self.current: NDArrays | None = None  # x, float64
        self.dtypes: list[np.dtype[Any]] = []
        self.examples: dict[str, int] = {}  # n_i of every client held, by key
        self.acked: dict[str, int] = {}  # a_i: round of the last reply folded, by key
        self.states: dict[str, NDArrays] = {}  # s_i^S: each client's state as folded
        self.state_sum: NDArrays | None = None  # Sigma = sum_{i held} n_i s_i^S
        self.binding = KeyBinding(key_binding)
        self.health: HealthCheck | None = None
        self.health_state: RunHealth | None = None
        self.num_sent = 0  # instructions of this round (replies may never come)
        self.departed = 0  # keys evicted at this round's configure step (their nodes left)

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

    def connected(self, cids: Iterable[str]) -> None:
        """Remember the nodes connected at this round's configure step (`KeyBinding`).

        Keys whose nodes have left (`KeyBinding.stale`: absent for more than
        ``ABSENT_GRACE`` samplings) are evicted, so node-id churn leaves bounded state.
        """
        self.binding.connected(cids)
        gone = sorted(self.binding.departed(), key=natural_key)
        self.departed = self.evict(gone)
        self.binding.forget(gone)

    def instruction(self, cid: str) -> dict[str, Scalar]:
        """Return node `cid`'s own config: ``admm-ack-round`` a_i of its key (0: none held)."""
        key = self.binding.key_of.get(cid)
        return {ACK_ROUND: 0 if key is None else self.acked.get(key, 0)}

    def reply_shapes(self) -> list[tuple[int, ...]]:
        """Return the shapes a reply must have: the model's, `_blocks` times."""
        assert self.current is not None
        return [t.shape for t in self.current] * self._blocks()

    def admit(self, replies: Sequence[Reply], reject: Reject) -> tuple[list[int], dict[str, int]]:
        """Return the indices of the replies that may be folded, and the round's counts.

        The binding judges every claim (`KeyBinding.admit`: conflicts and shared keys
        go to `reject`; the keys of nodes that left are evicted); then a reply whose
        reported round q is neither a_i nor 0 is rejected (``num_state_mismatch``), and
        one with q == 0 for a key the server holds resyncs it (its share is evicted).
        """
        keyed = [(reply.key, reply, i) for i, reply in enumerate(replies)]
        admitted, freed = self.binding.admit(keyed, reject)
        evicted, self.departed = self.departed + self.evict(freed), 0
        counts = {NUM_EVICTED: evicted, NUM_STATE_MISMATCH: 0, NUM_RESYNCED: 0}
        self.binding.forget(freed)
        kept = []
        for key, reply, i in admitted:
            held = self.acked.get(key, 0)
            if reply.previous is not None and reply.previous not in (held, 0):
                reject(key, self._mismatch(reply.previous, held), False)
                counts[NUM_STATE_MISMATCH] += 1
                continue
            if reply.previous == 0 and key in self.acked:
                counts[NUM_RESYNCED] += self.evict([key])  # a fresh state replaces s_i^S
            kept.append(i)
        return kept, counts

    def _mismatch(self, previous: int, held: int) -> str:
        return (
            f"client state out of sync (it trained from its state of round {previous}; the "
            f"server folded its reply of round {held}); the next acknowledgement brings it back"
        )

    def fold(self, replies: list[Reply], server_round: int) -> dict[str, Scalar]:
        """Fold admitted replies (one per key) in key order into x and the state.

        Each client's n_i is remembered from its first accepted reply, a_i := the
        round, and its key bound to its node; returns the round's metrics (the hook's,
        ``num_replies``, ``num_clients_cached``).
        """
        assert self.current is not None
        replies = sorted(replies, key=lambda reply: natural_key(reply.key))
        for reply in replies:
            self.examples.setdefault(reply.key, reply.num_examples)
        self.current, own = self._update(self.current, replies)
        for reply in replies:
            self.acked[reply.key] = server_round
            self.binding.bind(reply.key, reply.cid, server_round)
        return {**own, NUM_REPLIES: len(replies), NUM_CLIENTS_CACHED: len(self.examples)}

    def evict(self, keys: Iterable[str]) -> int:
        """Forget `keys`: Sigma -= n_i s_i^S, drop n_i, a_i, s_i^S; return how many were held."""
        evicted = 0
        for key in keys:
            held, n = self.states.pop(key, None), self.examples.pop(key, None)
            self.acked.pop(key, None)
            if held is None or n is None or self.state_sum is None:
                continue
            evicted += 1
            self.state_sum = [total - n * s for total, s in zip(self.state_sum, held, strict=True)]
        return evicted

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
        total = float(sum(reply.num_examples for reply in replies))
        return [reply.num_examples / total for reply in replies]

    def state_weight(self, key: str) -> float:
        """Return n_i (first accepted) of client `key`: its weight in the running state."""
        return float(self.examples[key])

    def held(self, key: str) -> NDArrays:
        """Return s_i^S of client `key` (zeros, now held, for a new key), to update in place."""
        assert self.current is not None
        if key not in self.states:
            self.states[key] = [np.zeros_like(t) for t in self.current]
        return self.states[key]

    def sums(self) -> NDArrays:
        """Return Sigma (zeros, now kept, before the first fold), to update in place."""
        assert self.current is not None
        if self.state_sum is None:
            self.state_sum = [np.zeros_like(t) for t in self.current]
        return self.state_sum

    def state_mean(self) -> NDArrays:
        """Return Sigma / N, the server's running state (0 before the first fold)."""
        assert self.current is not None
        total = float(sum(self.examples.values()))
        if self.state_sum is None or total == 0:
            return [np.zeros_like(t) for t in self.current]
        return [s / total for s in self.state_sum]
