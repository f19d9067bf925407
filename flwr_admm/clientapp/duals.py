"""Client-held duals on the Message API: a node's side of `serverapp.FedADMMClientDuals`.

The math and the ``context.state`` records are the legacy client's
(`flwr_admm.core.client_duals`, `flwr_admm.client.client_duals`): the node keeps its
committed and pending states (w_i, u_i, n_i, round) and trains from the one the
config's ``admm-ack-round`` names. Round k, given z^k under ``arrays``:

    if it took part before:  d2_i = ||w_i - z^k||^2,  u_i += gamma (w_i - z^k)   (`DualsRound.open`)
    w_i' ~ argmin f_i(w) + rho/2 ||w - (z^k - u_i)||^2         (the handler's local solve)
    Delta_i = n_i' (w_i' + u_i) - n_i c_i                          (`DualsRound.reply`)

The reply carries Delta_i under ``arrays`` (the received names, float64: it is a
change of a sum, not a model), with ``admm-rebuild = 1`` also the full share
sigma_i' = n_i' c_i' under ``admm-share``, and the protocol metrics. The states are
stored last, after anything that can fail.

With fast ADMM (``admm-accel-gamma`` in the config) the message also carries z_k under
``admm-accel-z`` (the model's names) and the node extrapolates its own dual
(`flwr_admm.core.client_duals`): u_i = u^_i + w_i - z_k, u^_i' = u_i + g (u_i -
u_i,prev), center z^_{k+1} - u^_i'; it keeps u_i,prev with its states.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict
from flwr.common import Parameters
from numpy.typing import NDArray

from flwr_admm.client.client_duals import (
    KeptDuals,
    extrapolation,
    load_states,
    reply_metrics,
    save_states,
)
from flwr_admm.core import client_duals as dual_math
from flwr_admm.core.types import Arrays
from flwr_admm.protocol import (
    ACCEL_Z_RECORD,
    MODE_CLIENT,
    MODE_KEY,
    NUM_EXAMPLES,
    PAYLOAD_RECORD,
    REBUILD,
    SHARE_RECORD,
)

__all__ = ["DualsRound", "accel_z", "client_held", "duals_reply"]


def client_held(config: Mapping[str, Any]) -> bool:
    """Return whether the config asks for client-held duals (``admm-duals = "client"``)."""
    return config.get(MODE_KEY) == MODE_CLIENT


def accel_z(message: Message, names: Sequence[str]) -> list[NDArray[np.float64]]:
    """Return z_k from ``admm-accel-z`` in the order of `names` ([] if absent)."""
    record = message.content.array_records.get(ACCEL_Z_RECORD)
    if record is None:
        return []
    if sorted(record) != sorted(names):
        raise ValueError(f"{ACCEL_Z_RECORD}: expected tensors {list(names)}, got {list(record)}")
    return [np.asarray(record[n].numpy(), dtype=np.float64) for n in names]


def duals_reply(
    message: Message,
    names: Sequence[str],
    change: Arrays,
    share: Arrays | None,
    metrics: Mapping[str, Any],
    *,
    arrayrecord_key: str = "arrays",
    payload: Parameters | None = None,
) -> Message:
    """Return the reply: Delta_i (float64) under `names`, sigma_i' under ``admm-share``.

    With a compressed `payload` (`ADMMClient` under ``uplink``), its first tensors go
    under ``admm-payload`` instead of Delta_i: one uint8 tensor of bytes per name.
    """
    records: dict[str, ArrayRecord | MetricRecord | ConfigRecord] = {
        "metrics": MetricRecord(dict(metrics))
    }
    if payload is None:
        records[arrayrecord_key] = _named(names, change)
    else:
        records[PAYLOAD_RECORD] = ArrayRecord(
            {
                n: Array(np.frombuffer(bytes(t), dtype=np.uint8))
                for n, t in zip(names, payload.tensors[: len(names)], strict=True)
            }
        )
    if share is not None:
        records[SHARE_RECORD] = _named(names, share)
    return Message(RecordDict(records), reply_to=message)


def _named(names: Sequence[str], arrays: Arrays) -> ArrayRecord:
    return ArrayRecord(
        {n: Array(np.asarray(a, dtype=np.float64)) for n, a in zip(names, arrays, strict=True)}
    )


@dataclass(frozen=True)
class DualsRound:
    """One round of a node with client-held duals, between reading z^k and replying.

    Attributes
    ----------
    state : DualState or None
        The state the server's S holds for this node (None: start as a new client).
    resync : bool
        S holds a share of this node that it no longer has (it says so in its reply).
    start : DualStart
        The updated dual u_i, the center z^k - u_i and d2_i.
    server_round : int
        The round of this message (``server-round``).
    rebuild : bool
        ``admm-rebuild = 1``: also send the full share sigma_i'.
    restored : bool
        `state` is the server's offer (``admm-restore``): w = c_i, u = 0; no w_i of its own.

    """

    state: dual_math.DualState | None
    resync: bool
    start: dual_math.DualStart
    server_round: int
    rebuild: bool
    restored: bool = False

    @classmethod
    def open(
        cls,
        records: RecordDict,
        z: Arrays,
        config: Mapping[str, Any],
        server_round: int,
        z_k: Arrays | None = None,
    ) -> DualsRound:
        """Pick the acknowledged state from `records` (``context.state``); update the dual.

        With fast ADMM `z` is z^_{k+1} and `z_k` the z-step's output (``admm-accel-z``).
        """
        kept = load_states(records, [t.shape for t in z])
        base = dual_math.opened(config, z, kept.committed, kept.pending)
        flag = config.get(REBUILD, 0)
        if isinstance(flag, bool) or flag not in (0, 1):
            raise ValueError(f"{REBUILD}: must be 0 or 1, got {flag!r}")
        fast = extrapolation(config, z, z_k)
        start = dual_math.start_round(base.state, z, fast, dual_math.dual_step_of(config))
        return cls(base.state, base.resync, start, server_round, flag == 1, base.restored)

    @property
    def own(self) -> dual_math.DualState | None:
        """Return the node's own state: its w_i and the C to keep (None if restored)."""
        return None if self.restored else self.state

    @property
    def center(self) -> Arrays:
        """Return v_i = z^k - u_i, the center of the local solve."""
        return self.start.center

    @property
    def correction(self) -> Arrays:
        """Return the linearized form's y_i = u_i / b_i (`dual_math.linear_term`)."""
        return dual_math.linear_term(self.state, self.start)

    def reply(
        self, w: Arrays, num_examples: int, budget: float | None = None
    ) -> tuple[Arrays, Arrays | None, dict[str, Any], KeptDuals]:
        """Return Delta_i, sigma_i' (if asked), the protocol metrics and the states to keep.

        `budget` is the linearized form's b_i, kept with the pending state.
        """
        w = [np.asarray(t, dtype=np.float64) for t in w]
        change = dual_math.contribution_change(self.state, w, self.start.dual, num_examples)
        if self.state is not None and self.state.residual is not None:  # flush a kept e_i
            change = [d + e for d, e in zip(change, self.state.residual, strict=True)]
        pending = self.start.kept(w, num_examples, self.server_round, None, budget)
        share = pending.share if self.rebuild else None
        metrics = reply_metrics(self.state, self.start, w, num_examples, self.resync, self.restored)
        return change, share, dict(metrics), KeptDuals(self.own, pending)  # an offer is not kept

    def answer(
        self,
        message: Message,
        names: Sequence[str],
        w: Mapping[str, NDArray[Any]] | Sequence[NDArray[Any]],
        num_examples: int,
        metrics: Mapping[str, Any],
        records: RecordDict,
        *,
        arrayrecord_key: str = "arrays",
        weighted_by_key: str = NUM_EXAMPLES,
        budget: float | None = None,
    ) -> Message:
        """Return the reply to `message` and keep both states in `records`, last."""
        values = [w[n] for n in names] if isinstance(w, Mapping) else list(w)
        if len(values) != len(names):
            raise ValueError(f"arrays: expected {len(names)} tensors {list(names)}")
        change, share, protocol, kept = self.reply(values, int(num_examples), budget)
        reported = {**metrics, **protocol, weighted_by_key: int(num_examples)}
        key = arrayrecord_key
        reply = duals_reply(message, names, change, share, reported, arrayrecord_key=key)
        save_states(records, kept)
        return reply
