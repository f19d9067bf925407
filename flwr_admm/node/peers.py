"""A node's round of the peer baselines SCAFFOLD and FedDyn (``peer-algorithm``).

The algorithms are `flwr_admm.rounds.scaffold`'s and `flwr_admm.rounds.feddyn`'s, the
server's side of the acknowledgement `flwr_admm.rounds.peers`'. The node keeps its
newest state P (c_i or grad_i; round p) and the one before it C (round a_c), and
trains from the one the config's ``admm-ack-round`` a names: P if p == a, C if
a_c == a, else the zero state (no ``admm-ack-round``: P). The reply reports that
state's round (``admm-previous-round``, 0: the zero state); the new state becomes P
and the one it trained from C.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from functools import partial
from typing import Any

import numpy as np
from flwr.common import RecordDict, Scalar

from flwr_admm.core.types import Arrays
from flwr_admm.node.records import load_kept, store_kept
from flwr_admm.node.reply import Reply
from flwr_admm.protocol import (
    ACK_ROUND,
    FEDDYN_ALPHA,
    FEDDYN_COMMITTED_GRAD,
    FEDDYN_STATE_GRAD,
    PEER,
    PEER_COMMITTED_META,
    PEER_FEDDYN,
    PEER_SCAFFOLD,
    PEER_STATE_META,
    PREVIOUS_ROUND,
    SCAFFOLD_COMMITTED_C,
    SCAFFOLD_STATE_C,
)

__all__ = ["PEERS", "PeerRound"]

PEERS = (PEER_SCAFFOLD, PEER_FEDDYN)
# the newest state's record, and the committed one's
RECORDS = {
    PEER_SCAFFOLD: (SCAFFOLD_STATE_C, SCAFFOLD_COMMITTED_C),
    PEER_FEDDYN: (FEDDYN_STATE_GRAD, FEDDYN_COMMITTED_GRAD),
}
Kept = tuple[Arrays, int]  # a kept state and its round (0: the zero state)


def _acknowledged(records: RecordDict, algorithm: str, shapes: list[Any], ack: object) -> Kept:
    """Return the state to train from and its round for ack round `ack` (module docstring)."""
    if ack is not None and (isinstance(ack, bool) or not isinstance(ack, int) or ack < 0):
        raise ValueError(f"{ACK_ROUND}: must be an integer >= 0, got {ack!r}")
    newest_name, committed_name = RECORDS[algorithm]
    newest = load_kept(records, newest_name, PEER_STATE_META, shapes)
    if ack is None and newest is not None:
        return newest
    for kept in (newest, load_kept(records, committed_name, PEER_COMMITTED_META, shapes)):
        if kept is not None and kept[1] == ack:
            return kept
    return [np.zeros(shape) for shape in shapes], 0


def _keep(records: RecordDict, algorithm: str, new: Kept, base: Kept) -> None:
    """Keep `new` as P and `base` (what it trained from) as C; a zero `base` needs no record."""
    newest_name, committed_name = RECORDS[algorithm]
    store_kept(records, newest_name, PEER_STATE_META, new)
    store_kept(records, committed_name, PEER_COMMITTED_META, base if base[1] else None)


def _alpha(config: Mapping[str, Any]) -> float:
    """Return ``feddyn-alpha``: a finite number > 0 (ValueError naming the key otherwise)."""
    value = config.get(FEDDYN_ALPHA)
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"{FEDDYN_ALPHA}: must be a finite number > 0, got {value!r}")
    if not math.isfinite(float(value)) or value <= 0:
        raise ValueError(f"{FEDDYN_ALPHA}: must be a finite number > 0, got {value!r}")
    return float(value)


@dataclass(frozen=True)
class PeerRound:
    """One SCAFFOLD or FedDyn round: the local problem from x, and how to answer it.

    The local problem is min_w f_i(w) + <linear, w> + rho/2 ||w - x||^2 from w = x:
    SCAFFOLD's linear term c - c_i (rho 0), FedDyn's -grad_i with rho = alpha.
    """

    algorithm: str
    x: Arrays
    base: Kept  # the state trained from (c_i or grad_i) and its round
    control: Arrays | None = None  # SCAFFOLD's c
    alpha: float = 0.0  # FedDyn's alpha

    @classmethod
    def open(
        cls, records: RecordDict, x: Arrays, control: Arrays | None, config: Mapping[str, Any]
    ) -> PeerRound:
        """Read the round `config` names (``peer-algorithm``) from `records` (``context.state``)."""
        algorithm = config[PEER]
        if algorithm not in PEERS:
            raise ValueError(f"{PEER}: must be one of {list(PEERS)}, got {algorithm!r}")
        alpha = _alpha(config) if algorithm == PEER_FEDDYN else 0.0
        base = _acknowledged(records, algorithm, [t.shape for t in x], config.get(ACK_ROUND))
        return cls(algorithm, x, base, control if algorithm == PEER_SCAFFOLD else None, alpha)

    @property
    def rho(self) -> float:
        """Return the prox weight around x: FedDyn's alpha, SCAFFOLD's 0."""
        return self.alpha

    @property
    def linear(self) -> Arrays:
        """Return the linear term: c - c_i (SCAFFOLD's g - c_i + c), or -grad_i (FedDyn)."""
        if self.control is not None:
            return [c - ci for c, ci in zip(self.control, self.base[0], strict=True)]
        return [-g for g in self.base[0]]

    def close(self, w: Arrays, steps: int, learning_rate: float, server_round: int) -> Reply:
        """Return the reply to this round from the local result w_i after `steps` steps."""
        w = [np.asarray(t, dtype=np.float64) for t in w]
        metrics: dict[str, Scalar] = {PREVIOUS_ROUND: self.base[1]}
        if self.control is None:  # FedDyn: grad_i - alpha (w_i - x)
            grad = [
                g - self.alpha * (a - b) for g, a, b in zip(self.base[0], w, self.x, strict=True)
            ]
            commit = partial(
                _keep, algorithm=self.algorithm, new=(grad, server_round), base=self.base
            )
            return Reply(w, metrics, commit=commit)
        # c_i+ - c_i = -c + (x - y_i) / (K lr)   (option II); K = 0: no change
        scale = 1.0 / (steps * learning_rate) if steps else 0.0
        change = [
            scale * (xk - yk) - ck if steps else np.zeros_like(ck)
            for xk, yk, ck in zip(self.x, w, self.control, strict=True)
        ]
        c_plus = [a + d for a, d in zip(self.base[0], change, strict=True)]
        commit = partial(
            _keep, algorithm=self.algorithm, new=(c_plus, server_round), base=self.base
        )
        return Reply(w, metrics, second=change, commit=commit)
