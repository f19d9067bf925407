"""A node's round under client-held duals; the math is `flwr_admm.core.client_duals`.

`DualsRound.open` picks the acknowledged state and updates the dual; `DualsRound.close`
returns Delta_i (with a compressor: x = Delta_i + e_i with error feedback; without one a
kept e_i is flushed), the rebuild share, the protocol metrics and the states to keep.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from functools import partial
from typing import Any

import numpy as np
from flwr.common import RecordDict, Scalar

from flwr_admm.core import client_duals as dual_math
from flwr_admm.core.client_duals import DualStart, DualState
from flwr_admm.core.types import Arrays
from flwr_admm.node.config import flag
from flwr_admm.node.records import KeptDuals, load_states, save_states
from flwr_admm.node.reply import Reply
from flwr_admm.protocol import (
    ALIGN,
    ALIGN_ALONG,
    ALIGN_DUAL,
    ALIGN_RESIDUAL,
    DELAYED_SQ_RESIDUAL,
    EXAMPLES_CHANGE,
    PREVIOUS_ROUND,
    REBUILD,
    RESTORED,
    RESYNC,
    U_SQ_NORM,
    W_SQ_NORM,
)
from flwr_admm.uplink.channel import ClientUplink
from flwr_admm.uplink.compression import Compressor

__all__ = ["DualsRound", "check_uplink", "reply_metrics"]


def check_uplink(uplink: ClientUplink, *, secure: bool) -> None:
    """Refuse local DP, compression without error feedback, and compression under SecAgg+."""
    if uplink.local_dp is not None:
        raise ValueError(
            "dp: local DP is not supported with client-held duals (admm-duals = 'client'); "
            "use FedADMM"
        )
    if uplink.compressor is not None and secure:
        raise ValueError("uplink: compression is not supported under SecAgg+ (admm-secagg-*)")
    if uplink.compressor is not None and not uplink.compressor.error_feedback:
        raise ValueError(
            "uplink-error-feedback: client-held duals need error feedback "
            "(S would keep every compression error)"
        )


def reply_metrics(
    state: DualState | None,
    start: DualStart,
    w: Arrays,
    num_examples: int,
    resync: bool,
    restored: bool = False,
    align: bool = False,
) -> dict[str, Scalar]:
    """Return the protocol metrics of a reply (`FedADMMClientDuals` reads them).

    `restored`: `state` is the server's offer (``admm-restored`` = 1, no d2_i);
    `align`: the config asked for the dual step's alignment terms (``admm-align``).
    """
    metrics: dict[str, Scalar] = {
        PREVIOUS_ROUND: 0 if state is None else int(state.server_round),
        EXAMPLES_CHANGE: int(num_examples) - (0 if state is None else int(state.num_examples)),
        W_SQ_NORM: float(sum(np.vdot(t, t) for t in w)),
        U_SQ_NORM: float(sum(np.vdot(u, u) for u in start.dual)),
        RESYNC: int(resync),
    }
    if restored:
        metrics[RESTORED] = 1
    elif start.delayed_sq_residual is not None:
        metrics[DELAYED_SQ_RESIDUAL] = start.delayed_sq_residual
        if align and start.alignment is not None:
            along, residual, dual = start.alignment
            metrics.update({ALIGN_ALONG: along, ALIGN_RESIDUAL: residual, ALIGN_DUAL: dual})
    return metrics


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
        The round of this message.
    rebuild : bool
        ``admm-rebuild = 1``: also send the full share sigma_i'.
    restored : bool
        `state` is the server's offer (``admm-restore``): w = c_i, u = 0; no w_i of its own.
    align : bool
        ``admm-align = 1``: report the dual step's alignment terms.

    """

    state: DualState | None
    resync: bool
    start: DualStart
    server_round: int
    rebuild: bool
    restored: bool = False
    align: bool = False

    @classmethod
    def open(
        cls,
        records: RecordDict,
        z: Arrays,
        config: Mapping[str, Any],
        server_round: int,
    ) -> DualsRound:
        """Pick the acknowledged state from `records` (``context.state``); update the dual."""
        kept = load_states(records, [t.shape for t in z])
        base = dual_math.opened(config, z, kept.committed, kept.pending)
        rebuild = flag(config, REBUILD)
        start = dual_math.start_round(base.state, z, dual_math.dual_step_of(config))
        align = flag(config, ALIGN)
        return cls(base.state, base.resync, start, server_round, rebuild, base.restored, align)

    @property
    def own(self) -> DualState | None:
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

    def change(self, pending: DualState) -> Arrays:
        """Return Delta_i = omega_i' (w_i' + u_i) - omega_i c_i for the state to keep."""
        return dual_math.contribution_change(
            self.state, pending.w, pending.u, pending.num_examples, pending.budget
        )

    def kept(self, pending: DualState) -> KeptDuals:
        """Return the states to keep: the own committed one (an offer is not kept) and `pending`."""
        return KeptDuals(self.own, pending)

    def close(
        self,
        w: Arrays,
        num_examples: int,
        *,
        budget: float | None = None,
        compressor: Compressor | None = None,
        rng: np.random.Generator | None = None,
    ) -> Reply:
        """Return Delta_i (compressed with `compressor`), sigma_i' if asked, the metrics.

        `budget` is the linearized form's b_i, kept with the pending state; `rng` the
        compressor's stochastic rounding.
        """
        w = [np.asarray(t, dtype=np.float64) for t in w]
        pending = self.start.kept(w, num_examples, self.server_round, None, budget)
        x = self.change(pending)
        if self.state is not None and self.state.residual is not None:  # x = Delta_i + e_i
            x = [d + e for d, e in zip(x, self.state.residual, strict=True)]
        payload, residual = None, None
        if compressor is not None:  # payload = encode(x), e_i' = x - decode(payload)
            assert rng is not None, "a compressor needs its rounding generator"
            payload = compressor.encode(x, rng)
            sent = compressor.decode(payload, [t.shape for t in x])
            x, residual = sent, [a - b for a, b in zip(x, sent, strict=True)]
        pending.residual = residual
        metrics = reply_metrics(
            self.state, self.start, w, num_examples, self.resync, self.restored, self.align
        )
        return Reply(
            x,
            metrics,
            second=pending.share if self.rebuild else None,
            payload=payload,
            commit=partial(save_states, kept=self.kept(pending)),
        )
