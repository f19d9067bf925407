"""Server-side checks, folding and statistics of replies under client-held duals.

The server keeps, per client key, only n_i and the round it last took part in
(`ClientEntry`). A reply is consistent with that record iff it reports the same
previous round and n_i' = n_i + (its change of n), and it sends d2_i = ||w_i - z^k||^2
exactly when it took part before (`protocol_problem`). Each valid reply is folded in,
in client-key order (deterministic sums): S += Delta_i, N += n_i' - n_i. A compressed
reply is decoded by the strategy's `UplinkChannel` (no center: Delta_i = decode(payload))
and checked like a plain one (shapes, finite) before it touches S. `RoundStats`
sums the accepted replies' n-weighted ||w_i'||^2, ||u_i||^2, d2_i and losses for the
residuals: previous primal residual sqrt(sum n_i d2_i / sum n_i), sqrt(sum p_i
||w_i'||^2) and sqrt(sum p_i ||u_i||^2) with p_i = n_i / sum of the replies' n.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from flwr.common import FitRes, Scalar
from flwr.server.client_proxy import ClientProxy
from numpy.typing import NDArray

from flwr_admm.core.kernels import axpy
from flwr_admm.core.types import Arrays, natural_key
from flwr_admm.core.validation import check_reply
from flwr_admm.protocol import (
    DELAYED_SQ_RESIDUAL,
    EXAMPLES_CHANGE,
    PREVIOUS_ROUND,
    U_SQ_NORM,
    W_SQ_NORM,
)
from flwr_admm.server.sampling import client_key, keyed_replies, reject_reply
from flwr_admm.uplink.channel import UplinkChannel
from flwr_admm.uplink.wire import parameters_to_views


@dataclass
class ClientEntry:
    """All the server keeps per client key: n_i in S, and the round it was added."""

    num_examples: int
    last_round: int


def protocol_problem(entry: ClientEntry | None, res: FitRes) -> tuple[str, int] | None:
    """Why the reply's metrics break the protocol (and 1 if it is a state mismatch)."""
    metrics = res.metrics
    for name in (PREVIOUS_ROUND, EXAMPLES_CHANGE, W_SQ_NORM, U_SQ_NORM):
        if name not in metrics:
            return f"missing metric {name!r} (not a client-held-dual client?)", 0
    numbers = [metrics[n] for n in (W_SQ_NORM, U_SQ_NORM, DELAYED_SQ_RESIDUAL) if n in metrics]
    if not all(_finite_nonnegative(v) for v in numbers):
        return "squared norms must be finite numbers >= 0", 0
    previous, change = metrics[PREVIOUS_ROUND], metrics[EXAMPLES_CHANGE]
    if not (
        isinstance(previous, int)
        and isinstance(change, int)
        and _integer(previous)
        and _integer(change)
        and _integer(res.num_examples)
    ):
        return f"{PREVIOUS_ROUND}, {EXAMPLES_CHANGE}, num_examples must be integers", 0
    known_round = entry.last_round if entry is not None else 0
    known_n = entry.num_examples if entry is not None else 0
    if previous != known_round or known_n + change != res.num_examples:
        return (
            f"client state out of sync (client reports its previous round {previous} "
            f"and n change {change} to n={res.num_examples}; the server recorded round "
            f"{known_round}, n={known_n}). Its old contribution stays in S",
            1,
        )
    if (DELAYED_SQ_RESIDUAL in metrics) != (known_round > 0):
        return f"{DELAYED_SQ_RESIDUAL} must be sent exactly when it took part before", 0
    return None


class ClientDualsReplyFolding:
    """Reply checks and folding of `FedADMMClientDuals` (mixed into it)."""

    contribution_sum: Arrays | None
    total_examples: int
    clients: dict[str, ClientEntry]
    _key_of_cid: dict[str, str]
    channel: UplinkChannel

    def _fold_replies(
        self,
        server_round: int,
        results: list[tuple[ClientProxy, FitRes]],
        counts: dict[str, Scalar],
    ) -> RoundStats:
        """Check each reply and add it to S, in client-key order (deterministic sums)."""
        assert self.contribution_sum is not None
        shapes = [t.shape for t in self.contribution_sum]
        shapes_only = self.contribution_sum  # what `decode` takes the shapes from
        keyed = keyed_replies(results, client_key, lambda key, why: self._reject(key, why, counts))
        shared = {k for k, c in Counter(k for k, _, _ in keyed).items() if c > 1}
        stats = RoundStats()
        for key, proxy, res in sorted(keyed, key=lambda item: natural_key(item[0])):
            if key in shared:
                self._reject(key, "several replies share this client key", counts)
                continue
            report = protocol_problem(self.clients.get(key), res)
            if report is not None:
                problem, mismatch = report
                self._reject(key, problem, counts)
                counts["num_state_mismatch"] = int(counts["num_state_mismatch"]) + mismatch
                continue
            problem_or_none: str | None
            delta: Sequence[NDArray[np.generic]]
            try:
                if self.channel.compressor is None:
                    delta = parameters_to_views(res.parameters)
                else:  # Delta_i = decode(payload); plain numpy replies as they are
                    delta = self.channel.decode(
                        res.parameters, lambda: shapes_only, add_center=False
                    )
                problem_or_none, _ = check_reply(delta, res.num_examples, shapes)
            except Exception as error:  # a malformed reply must not stop the server
                problem_or_none = f"unreadable reply ({error!r})"
            if problem_or_none is not None:
                self._reject(key, problem_or_none, counts)
                continue
            for acc, change in zip(self.contribution_sum, delta, strict=True):
                axpy(1.0, np.asarray(change, dtype=np.float64), acc)
            self.total_examples += int(res.metrics[EXAMPLES_CHANGE])
            self.clients[key] = ClientEntry(int(res.num_examples), server_round)
            self._key_of_cid[proxy.cid] = key
            stats.add(res)
        return stats

    @staticmethod
    def _reject(key: str, problem: str, counts: dict[str, Scalar]) -> None:
        reject_reply("FedADMMClientDuals", key, problem, counts)


class RoundStats:
    """n-weighted sums over one round's accepted replies."""

    def __init__(self) -> None:
        self.num_replies = self.num_delayed = 0
        self.n = self.n_delayed = 0.0
        self.d2 = self.w_sq = self.u_sq = self.loss = 0.0
        self.losses_finite = True

    def add(self, res: FitRes) -> None:
        """Count one accepted reply (its n_i and protocol metrics)."""
        n, metrics = float(res.num_examples), res.metrics
        self.num_replies += 1
        self.n += n
        self.w_sq += n * float(metrics[W_SQ_NORM])  # type: ignore[arg-type]
        self.u_sq += n * float(metrics[U_SQ_NORM])  # type: ignore[arg-type]
        if DELAYED_SQ_RESIDUAL in metrics:
            self.num_delayed += 1
            self.n_delayed += n
            self.d2 += n * float(metrics[DELAYED_SQ_RESIDUAL])  # type: ignore[arg-type]
        loss = metrics.get("loss")
        if isinstance(loss, int | float) and math.isfinite(loss):
            self.loss += n * float(loss)
        else:
            self.losses_finite = False

    @property
    def w_norm(self) -> float:
        """Sqrt(sum p_i ||w_i'||^2)."""
        return math.sqrt(self.w_sq / self.n)

    @property
    def u_norm(self) -> float:
        """Sqrt(sum p_i ||u_i||^2)."""
        return math.sqrt(self.u_sq / self.n)

    @property
    def previous_primal(self) -> float | None:
        """Sqrt(sum n_i d2_i / sum n_i) over the replies with d2_i; None if none."""
        return math.sqrt(self.d2 / self.n_delayed) if self.num_delayed else None

    @property
    def objective(self) -> float | None:
        """Sum p_i f_i(w_i'), or None if a loss is missing or not finite."""
        return self.loss / self.n if self.losses_finite else None


def _integer(value: object) -> bool:
    return isinstance(value, int | np.integer) and not isinstance(value, bool)


def _finite_nonnegative(value: object) -> bool:
    return (
        isinstance(value, int | float)
        and not isinstance(value, bool)
        and math.isfinite(value)
        and value >= 0
    )
