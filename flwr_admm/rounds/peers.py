"""The round the peer baselines `SCAFFOLD` and `FedDyn` share, wire neutral.

`PeerRound` is the `flwr_admm.rounds.exchange.Algorithm` both APIs' `SCAFFOLD` and
`FedDyn` run: it keeps x in float64, checks every reply and folds the admitted ones in
natural key order; the blocks sent, the config and the update are hooks
(`flwr_admm.rounds.scaffold`, `flwr_admm.rounds.feddyn`).

Both weight clients by examples: p_i = n_i / sum_{j in S} n_j over the round's
accepted replies for the model step, and n_i / sum_{j held} n_j over every client
the server holds for its running state (SCAFFOLD's c, FedDyn's h), each client
counted with the n_i of its first accepted reply. With equal n_i and once every client
has been seen these are the papers' uniform 1/|S| and 1/N; before that the state
averages the clients seen so far, where the papers count unseen clients as zero.

Acknowledgement. Client i's state s_i (SCAFFOLD's c_i, FedDyn's grad_i; zero at
first) changes by ds_i with every reply, and the server state is Sigma / N with
Sigma = sum_{i held} n_i s_i, N = sum_{i held} n_i. A reply the server never folds
must not change s_i, and a client that lost s_i must not leave its old share in Sigma.
So the server keeps per key n_i, the round a_i of the last reply it folded and s_i^S,
the state as folded, and sends a_i in ``admm-ack-round``; the client trains from the
state it names (`flwr_admm.node.peers`) and reports that state's round q. The server
folds a reply with q == a_i (0 for a new key): s_i^S += ds_i, Sigma += n_i ds_i,
a_i := k; with q == 0 for a key it holds (a resync) it first takes the old share out,
Sigma -= n_i s_i^S, and starts the key over; any other q is rejected
(``num_state_mismatch``). By induction s_i^S is client i's state after every
instruction, so Sigma / N is the n-weighted mean of the clients' states and the fixed
point is the fault-free one. A reply without ``admm-previous-round`` is folded as in sync.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, NamedTuple

import numpy as np
from flwr.common import Scalar
from numpy.typing import NDArray

from flwr_admm.core.types import Arrays, natural_key, reply_problem
from flwr_admm.protocol import (
    ACK_ROUND,
    NUM_CLIENTS_CACHED,
    NUM_REPLIES,
    NUM_RESYNCED,
    NUM_STATE_MISMATCH,
    PEER,
    PREVIOUS_ROUND,
)
from flwr_admm.rounds.exchange import Incoming, Instruction, Layout, Tally, read_blocks

__all__ = ["PeerRound", "Reply", "previous_round"]


class Reply(NamedTuple):
    """One readable reply: its key, blocks (float64, model then further), n_i, round q."""

    key: str
    arrays: Arrays
    num_examples: int
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
    """x in float64, the per-key states and three hooks: one peer baseline's round.

    Subclasses set `label`, `peer` and `reply_blocks` and implement `_blocks_down`
    (the further blocks sent with x), `_config` (config entries besides
    ``peer-algorithm``) and `_update` (x' and the round metrics from the folded
    replies; it adds each client's state change to `sums` and to `held`).
    """

    label = ""
    peer = ""
    counters: tuple[str, ...] = (NUM_STATE_MISMATCH, NUM_RESYNCED)
    reply_blocks: tuple[str, ...] = ()

    def __init__(self) -> None:
        self.x: Arrays | None = None  # float64, from the first model received
        self.shapes: tuple[tuple[int, ...], ...] = ()
        self.examples: dict[str, int] = {}  # n_i of every client held, by key
        self.acked: dict[str, int] = {}  # a_i: round of the last reply folded, by key
        self.states: dict[str, Arrays] = {}  # s_i^S: each client's state as folded
        self.state_sum: Arrays | None = None  # Sigma = sum_{i held} n_i s_i^S
        self._down: dict[str, Arrays] = {}  # this round's further blocks
        self._folded: list[Reply] = []  # this round's replies, in key order

    # ------------------------------------------------------------------ hooks
    def _blocks_down(self) -> dict[str, Arrays]:
        return {}

    def _config(self) -> dict[str, Scalar]:
        return {}

    def _update(self, x: Arrays, replies: list[Reply]) -> tuple[Arrays, dict[str, Scalar]]:
        raise NotImplementedError

    def _settings(self) -> dict[str, Any]:
        return {}

    # ------------------------------------------------------------------ model
    def adopt(self, z: Arrays, layout: Layout) -> None:
        """Take x from the first model received; later ones are x as sent (x stays float64)."""
        if self.x is None:
            self.x, self.shapes = list(z), layout.shapes

    def model(self) -> Arrays | None:
        """Return x (float64; None before the first round)."""
        return self.x

    # ----------------------------------------------------------- instructions
    def round_config(self, sampled: int, population: int) -> dict[str, Scalar]:
        """Return ``peer-algorithm`` and the hook's entries; fix this round's blocks."""
        self._down = self._blocks_down()
        return {PEER: self.peer, **self._config()}

    def instruction(self, node: str, key: str | None) -> Instruction:
        """Send x, the round's blocks and ``admm-ack-round`` a_i of the node's key (0: none)."""
        assert self.x is not None
        ack = 0 if key is None else self.acked.get(key, 0)
        return Instruction(self.x, {ACK_ROUND: ack}, self._down)

    # ---------------------------------------------------------------- replies
    def read(self, reply: Incoming) -> tuple[Reply | None, str | None]:
        """Read x-shaped blocks (model, then `reply_blocks`): finite, n_i > 0, q an int >= 0."""
        arrays, problem = read_blocks(reply, self.shapes, self.reply_blocks)
        blocks = 1 + len(self.reply_blocks)
        problem = problem or reply_problem(arrays, reply.num_examples, list(self.shapes) * blocks)
        if problem is not None:
            return None, problem
        try:
            previous = previous_round(reply.metrics)
        except ValueError as error:
            return None, str(error)
        floats = [np.asarray(a, dtype=np.float64) for a in arrays]
        return Reply(reply.key, floats, int(reply.num_examples), previous), None

    def fold(
        self, replies: list[tuple[Incoming, Reply]], server_round: int, tally: Tally
    ) -> list[bool]:
        """Settle each reply's acknowledgement, then keep it for the update (key order).

        q neither a_i nor 0: rejected (``num_state_mismatch``); q == 0 for a key held:
        its share leaves Sigma first (``num_resynced``). A kept key gets n_i (first
        reply only) and a_i := the round.
        """
        self._folded = []
        for _, reply in replies:
            held = self.acked.get(reply.key, 0)
            if reply.previous is not None and reply.previous not in (held, 0):
                tally.reject(reply.key, self._mismatch(reply.previous, held))
                tally.add(NUM_STATE_MISMATCH)
                continue
            if reply.previous == 0 and reply.key in self.acked:
                tally.add(NUM_RESYNCED, self.evict([reply.key]))  # a fresh s_i replaces s_i^S
            self._folded.append(reply)
        for reply in self._folded:
            self.examples.setdefault(reply.key, reply.num_examples)
            self.acked[reply.key] = server_round
        kept = {reply.key for reply in self._folded}
        return [reply.key in kept for _, reply in replies]

    def _mismatch(self, previous: int, held: int) -> str:
        return (
            f"client state out of sync (it trained from its state of round {previous}; the "
            f"server folded its reply of round {held}); the next acknowledgement brings it back"
        )

    def finish(self, server_round: int) -> tuple[dict[str, Scalar], bool]:
        """Take the hook's update of x and the state; return the round metrics."""
        assert self.x is not None
        replies, self._folded = self._folded, []
        self.x, own = self._update(self.x, replies)
        return {**own, NUM_REPLIES: len(replies), NUM_CLIENTS_CACHED: len(self.examples)}, False

    def discard(self) -> dict[str, Scalar]:
        """Close a round without a folded reply: nothing changed."""
        self._folded = []
        return {}

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

    # ----------------------------------------------------- the update's state
    def weights(self, replies: list[Reply]) -> list[float]:
        """Return p_i = n_i / sum_{j in S} n_j for the model step."""
        total = float(sum(reply.num_examples for reply in replies))
        return [reply.num_examples / total for reply in replies]

    def state_weight(self, key: str) -> float:
        """Return n_i (first accepted) of client `key`: its weight in the running state."""
        return float(self.examples[key])

    def held(self, key: str) -> Arrays:
        """Return s_i^S of client `key` (zeros, now held, for a new key), to update in place."""
        assert self.x is not None
        if key not in self.states:
            self.states[key] = [np.zeros_like(t) for t in self.x]
        return self.states[key]

    def sums(self) -> Arrays:
        """Return Sigma (zeros, now kept, before the first fold), to update in place."""
        assert self.x is not None
        if self.state_sum is None:
            self.state_sum = [np.zeros_like(t) for t in self.x]
        return self.state_sum

    def state_mean(self) -> Arrays:
        """Return Sigma / N, the server's running state (0 before the first fold)."""
        assert self.x is not None
        total = float(sum(self.examples.values()))
        if self.state_sum is None or total == 0:
            return [np.zeros_like(t) for t in self.x]
        return [s / total for s in self.state_sum]

    # ------------------------------------------------------------------ state
    def configuration(self) -> dict[str, Any]:
        """Return the strategy and its settings (JSON; fingerprinted)."""
        return {"strategy": self.label, **self._settings()}

    def state_dict(self) -> tuple[dict[str, NDArray[Any]], dict[str, Any]]:
        """Return x, Sigma and every s_i^S (clients in key order) with their n_i and a_i."""
        assert self.x is not None
        arrays = {f"x.{j}": t for j, t in enumerate(self.x)}
        for j, t in enumerate(self.state_sum or []):
            arrays[f"sum.{j}"] = t
        keys = sorted(self.examples, key=natural_key)
        for i, key in enumerate(keys):
            arrays.update({f"state.{i}.{j}": t for j, t in enumerate(self.states[key])})
        clients = [[key, self.examples[key], self.acked[key]] for key in keys]
        return arrays, {"peers": {"clients": clients, "sum": self.state_sum is not None}}

    def load_state_dict(
        self, arrays: dict[str, NDArray[Any]], manifest: dict[str, Any], layout: Layout
    ) -> None:
        """Restore `state_dict`, checked against the layout's shapes."""
        saved, count = manifest["peers"], len(layout.shapes)

        def block(prefix: str) -> Arrays:
            out = [np.asarray(arrays[f"{prefix}.{j}"], dtype=np.float64) for j in range(count)]
            if tuple(t.shape for t in out) != layout.shapes:
                raise ValueError(f"{prefix}: shapes differ from the layout's")
            return out

        self.x, self.shapes = block("x"), layout.shapes
        self.state_sum = block("sum") if saved["sum"] else None
        self.examples, self.acked, self.states = {}, {}, {}
        for i, (key, n, acked) in enumerate(saved["clients"]):
            self.examples[str(key)], self.acked[str(key)] = int(n), int(acked)
            self.states[str(key)] = block(f"state.{i}")
