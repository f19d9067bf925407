"""Client identity: the key a reply is filed under, which node may speak for it, the draw.

A reply's key is its ``client-key`` metric, else its ``partition-id``, else the node id
(`client_key_of`); a bad value is an error for that reply only, never for the round.

`KeyBinding` ties keys to nodes (cids). Under ``"node"`` a key is accepted only from
the node it was first bound to, and a node speaks for one key; any other claim is a
conflict (rejected, the owner untouched). A node absent for up to `ABSENT_GRACE`
samplings finds its key and state as it left them; after that it has left, its key is
freed (state evicted) and the next claimant starts fresh. ``"authenticated"`` (node ids
fixed by SuperNode authentication) never hands a key to another node; ``"reported"``
trusts the reported key (trusted deployments only).

State stays bounded: under ``"node"`` and ``"reported"`` a departed node's key is stale
(`KeyBinding.stale`), so a node reconnecting under a new id every round leaves at most
`ABSENT_GRACE` + 1 records behind; `ClientPolicy`'s ``max_age`` and ``max_count`` bound
them further. Bindings restored from a checkpoint are provisional
under ``"node"`` (node ids mean nothing in a new run): a key's first claim moves it to
the claiming node, which keeps the key's state.
"""

from __future__ import annotations

import functools
import numbers
import random
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from typing import Any, Literal, Protocol, TypeVar

import numpy as np
from flwr.common import Scalar

from flwr_admm.core.types import natural_key
from flwr_admm.options import KEY_BINDINGS
from flwr_admm.protocol import CLIENT_KEY, PARTITION_ID

__all__ = [
    "ABSENT_GRACE",
    "KeyBinding",
    "client_key_of",
    "sample_ids",
]

KeyBindingPolicy = Literal["node", "authenticated", "reported"]
Claim = Literal["ok", "conflict", "rebind"]
Reject = Callable[[str, str, bool], None]  # (key, problem, is a key conflict)
ABSENT_GRACE = 1  # samplings in a row an absent node keeps its key and state
MAX_CLIENT_KEY_LENGTH = 256
MAX_PARTITION_ID = 2**63 - 1  # Flower's node config holds 64-bit integers


class Sender(Protocol):
    """What `KeyBinding.admit` reads of a reply's sender: its node id (a ClientProxy has it)."""

    @property
    def cid(self) -> str:
        """Return the id of the node the reply came from."""
        ...


IdT = TypeVar("IdT", int, str)  # a legacy cid or a Message-API node id
KeyedT = TypeVar("KeyedT", bound=tuple[str, Sender, object])  # (key, sender, reply)


def client_key_of(cid: str, metrics: Mapping[str, Scalar]) -> str:
    """Return a reply's canonical key: ``client-key:<v>``, ``partition-id:<n>``, ``cid:<cid>``.

    Raises
    ------
    ValueError
        Naming the field and its allowed values when ``client-key`` is not a str or
        int of 1 to 256 printable characters, or ``partition-id`` is not an integer in
        [0, 2**63) (bool, float and str are refused: 1.9, True and "1" are not 1).

    """
    if CLIENT_KEY in metrics:
        return f"{CLIENT_KEY}:{_client_key_value(metrics[CLIENT_KEY])}"
    if PARTITION_ID in metrics:
        value = metrics[PARTITION_ID]
        if (
            isinstance(value, bool)
            or not isinstance(value, numbers.Integral)
            or not 0 <= int(value) <= MAX_PARTITION_ID
        ):
            raise ValueError(
                f"{PARTITION_ID}: must be an integer in [0, 2**63) (not a bool, float or "
                f"str), got {_short(value)}"
            )
        return f"{PARTITION_ID}:{int(value)}"
    return f"cid:{cid}"


def _client_key_value(value: Any) -> str:
    if isinstance(value, numbers.Integral) and not isinstance(value, bool):
        if int(value).bit_length() <= 4 * MAX_CLIENT_KEY_LENGTH:  # no huge str(int)
            value = str(int(value))
    if (
        not isinstance(value, str)
        or not 1 <= len(value) <= MAX_CLIENT_KEY_LENGTH
        or not value.isprintable()
    ):
        raise ValueError(
            f"{CLIENT_KEY}: must be a str (or int) of 1 to {MAX_CLIENT_KEY_LENGTH} printable "
            f"characters, got {_short(value)}"
        )
    return value


def _short(value: Any) -> str:
    """Describe a rejected value without printing (or converting) all of it."""
    if isinstance(value, str) and len(value) > 40:
        return f"a str of {len(value)} characters starting {value[:20]!r}"
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 128:
        return f"an int of {value.bit_length()} bits"
    return f"{value!r} ({type(value).__name__})"


class KeyBinding:
    """Which node (cid) speaks for each client key, and when each key was last heard.

    Parameters
    ----------
    policy : {"node", "authenticated", "reported"}
        ``"node"``: a key belongs to the node it was first accepted from until that
        node leaves the federation; ``"authenticated"``: for good (until evicted as
        stale), for SuperNode authentication; ``"reported"``: reported keys are trusted.

    Attributes
    ----------
    node_of : dict
        key -> the cid it is bound to.
    key_of : dict
        cid -> the key it speaks for (what the next round's instructions use).
    last_seen : dict
        key -> the round of its last accepted reply.
    present : set or None
        The cids connected at the last sampling (None before the first).
    samplings : int
        How many samplings `connected` has seen.
    connected_at : dict
        cid -> the last sampling it was connected at (bound or connected cids only).
    provisional : set
        Keys restored from a checkpoint and not claimed since (policy ``"node"``).

    """

    def __init__(self, policy: str = "node") -> None:
        if policy not in KEY_BINDINGS:
            raise ValueError(f"key_binding: must be one of {list(KEY_BINDINGS)}, got {policy!r}")
        self.policy: KeyBindingPolicy = (
            "node"
            if policy == "node"
            else "authenticated"
            if policy == "authenticated"
            else "reported"
        )
        self.node_of: dict[str, str] = {}
        self.key_of: dict[str, str] = {}
        self.last_seen: dict[str, int] = {}
        self.present: set[str] | None = None
        self.samplings = 0
        self.connected_at: dict[str, int] = {}
        self.provisional: set[str] = set()

    def connected(self, cids: Iterable[str]) -> None:
        """Remember the nodes connected at this round's sampling."""
        self.present = {str(cid) for cid in cids}
        self.samplings += 1
        kept = {cid: at for cid, at in self.connected_at.items() if cid in self.key_of}
        self.connected_at = {**kept, **dict.fromkeys(self.present, self.samplings)}

    def absent(self, cid: str) -> int:
        """Return how many samplings in a row node `cid` has been absent from (0: present)."""
        if self.present is None:
            return 0
        return self.samplings - self.connected_at.get(cid, 0)

    def claim(self, key: str, cid: str) -> Claim:
        """Judge a reply of node `cid` under `key`: "ok", "conflict", or "rebind".

        "rebind": the key's node has left; its state must be evicted before the reply
        is folded in as a new client's.
        """
        if self.policy == "reported":
            return "ok"
        own = self.key_of.get(cid)
        if own is not None and own != key:
            return "conflict"  # a node speaks for one key
        owner = self.node_of.get(key)
        if owner is None or owner == cid:
            return "ok"
        if key in self.provisional and self.absent(owner) > 0:
            return "ok"  # restored from a checkpoint, its node gone: the claimant takes it
        if self.policy == "node" and self.absent(owner) > ABSENT_GRACE:
            return "rebind"  # under "authenticated" the owner keeps its key while away
        return "conflict"

    def admit(self, keyed: Sequence[KeyedT], reject: Reject) -> tuple[list[KeyedT], list[str]]:
        """Return the replies that may touch their key's state, and the keys to free.

        In natural key order. To free (evict, then rebind) first: the keys whose bound
        node has left. Rejected through `reject`: the replies of a key shared within
        the round (but a single reply from the key's bound node is kept, the others
        are conflicts) and every conflicting claim.
        """
        by_key: dict[str, list[KeyedT]] = {}
        for item in keyed:
            by_key.setdefault(item[0], []).append(item)
        admitted: list[KeyedT] = []
        freed: list[str] = []
        for key in sorted(by_key, key=natural_key):
            group = by_key[key]
            if len(group) > 1:
                own = [item for item in group if item[1].cid == self.owner(key)]
                if len(own) != 1:
                    for _ in group:
                        reject(key, "several replies share this client key", False)
                    continue
                for _, proxy, _ in group:
                    if proxy.cid != own[0][1].cid:
                        reject(key, self._conflict(key, proxy.cid), True)
                group = own
            claim = self.claim(key, group[0][1].cid)
            if claim == "conflict":
                reject(key, self._conflict(key, group[0][1].cid), True)
                continue
            freed += [key] if claim == "rebind" else []
            admitted.append(group[0])
        return admitted, freed

    def _conflict(self, key: str, cid: str) -> str:
        return (
            f"node {cid} may not speak for it (key_binding={self.policy!r}: the key is bound to "
            f"node {self.node_of.get(key)}, node {cid} to {self.key_of.get(cid)})"
        )

    def owner(self, key: str) -> str | None:
        """Return the cid `key` is bound to (policies "node", "authenticated"), else None."""
        return self.node_of.get(key) if self.policy != "reported" else None

    def bind(self, key: str, cid: str, server_round: int) -> None:
        """Bind `key` to node `cid` after an accepted reply, heard in `server_round`."""
        if self.node_of.get(key) not in (None, cid) and self.policy != "reported":
            self.key_of.pop(self.node_of[key], None)
        self.node_of[key] = cid
        self.key_of[cid] = key
        self.last_seen[key] = server_round
        self.provisional.discard(key)
        self.connected_at.setdefault(cid, self.samplings)

    def forget(self, keys: Iterable[str]) -> None:
        """Drop `keys`: their nodes speak for no key until they reply again."""
        gone = set(keys)
        for cid in [cid for cid, key in self.key_of.items() if key in gone]:
            del self.key_of[cid]
        for key in gone:
            self.node_of.pop(key, None)
            self.last_seen.pop(key, None)
        self.provisional -= gone
        present = self.present or set()
        self.connected_at = {
            cid: at for cid, at in self.connected_at.items() if cid in present or cid in self.key_of
        }

    def departed(self) -> set[str]:
        """Return the keys whose node has left: absent from > `ABSENT_GRACE` samplings.

        Policies "node" and "reported" only; under "authenticated" no key is departed.
        """
        if self.policy == "authenticated":
            return set()
        return {k for k, cid in self.node_of.items() if self.absent(cid) > ABSENT_GRACE}

    def stale(
        self,
        server_round: int,
        max_age: int | None,
        max_clients: int | None,
        incoming: Collection[str] = (),
    ) -> list[str]:
        """Return the keys to evict in `server_round`, in key order.

        A key is stale when its node has left (policies "node" and "reported": absent
        from more than `ABSENT_GRACE` samplings in a row), or when its last accepted
        reply is more than `max_age` rounds old; beyond `max_clients` keys the least
        recently heard go (ties in key order). The `incoming` keys (this round's
        replies) count as heard now and are never stale.
        """
        heard = set(incoming)
        seen = {**self.last_seen, **dict.fromkeys(heard, server_round)}
        keys = sorted(seen, key=natural_key)
        old = {k for k in keys if max_age is not None and server_round - seen[k] > max_age}
        old |= self.departed() - heard
        kept = [k for k in keys if k not in old]
        if max_clients is not None and len(kept) > max_clients:
            candidates = [k for k in kept if k not in heard]
            by_age = sorted(candidates, key=lambda k: seen[k])  # stable: ties in key order
            old.update(by_age[: len(kept) - max_clients])
        return sorted(old, key=natural_key)

    def state_dict(self) -> dict[str, Any]:
        """Return the bindings and last-seen rounds (JSON)."""
        return {
            "node_of": dict(self.node_of),
            "key_of": dict(self.key_of),
            "last_seen": dict(self.last_seen),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore `state_dict`; raise KeyError/TypeError/ValueError on a malformed one."""
        node_of = {str(k): str(c) for k, c in state["node_of"].items()}
        key_of = {str(c): str(k) for c, k in state["key_of"].items()}
        last_seen = {str(k): int(r) for k, r in state["last_seen"].items()}
        self.node_of, self.key_of, self.last_seen = node_of, key_of, last_seen
        self.present, self.samplings = None, 0
        self.connected_at = dict.fromkeys(key_of, 0)
        self.provisional = set(node_of) if self.policy == "node" else set()


# Sort keys parsed once per string instead of twice per client every round: at 10,000
# clients the parsing cost more than the round itself. Bounded, so a churning
# federation cannot grow it without limit.
SORT_KEY_CACHE_SIZE = 1 << 17


@functools.lru_cache(maxsize=SORT_KEY_CACHE_SIZE)
def sort_key(text: str) -> tuple[object, ...]:
    """Return `natural_key(text)`, memoized (the sampling order's key)."""
    return natural_key(text)


def sample_ids(
    ids: Iterable[IdT],
    size: int,
    server_round: int,
    sampling_seed: int | None,
    key_of: Mapping[str, str],
) -> list[IdT]:
    """Return `size` of `ids` (all if fewer), ordered by (client key, id).

    `key_of` maps an id (as str) to the client key it speaks for; unknown ids sort
    last. With a `sampling_seed`, round k picks ``default_rng([sampling_seed, k])
    .choice(len(ids), size, replace=False)`` of that order, so a run is reproducible
    and both APIs pick the same clients; None draws with `random`, as Flower does.
    """
    order = sorted(ids, key=lambda i: (sort_key(key_of.get(str(i), "~")), sort_key(str(i))))
    if size >= len(order):
        return order
    if sampling_seed is None:
        picked = sorted(random.sample(range(len(order)), size))
    else:
        rng = np.random.default_rng([sampling_seed, server_round])
        picked = [int(i) for i in np.sort(rng.choice(len(order), size=size, replace=False))]
    return [order[i] for i in picked]
