"""Client-side arithmetic of consensus ADMM with client-held duals (numpy only).

The protocol is `flwr_admm.rounds.client_duals`'s module docstring. Client i keeps
w_i, its scaled dual u_i (before the pending update), n_i and its last round
(`DualState`). Round k, given z^k and the dual step gamma in (0, 1] (1 is the textbook
step; as in `ConsensusADMM` the fixed point is unchanged and sum_i n_i u_i stays 0):

    if it took part before:  d2_i = ||w_i - z^k||^2,  u_i += gamma (w_i - z^k)   (`start_round`)
    w_i' ~ argmin f_i(w) + rho/2 ||w - (z^k - u_i)||^2      (the caller's local solve)
    Delta_i = n_i' (w_i' + u_i) - n_i c_i,  c_i = w_i + u_i   (`contribution_change`)

In the linearized form the weight of c_i is omega_i = n_i / b_i (rho_i = 1 / b_i) in
place of n_i and the node keeps u_i = b_i y_i in the scale of its latest b_i
(`share_weight`, `DualStart.dual_for`), so S / N is that form's z-step.

The server keeps S = sum_i n_i c_i and acknowledges in every fit config the round a
whose contribution S holds for this client. The client keeps a committed state C
(round a_c) and a pending one P (round p) and trains from the one S holds
(`acknowledged`):

    p == a     the reply was used: commit, C = P
    a_c == a   the reply was not used (lost, rejected, its round dropped): train from C
    a == 0     S holds nothing of it: start fresh
    otherwise  its state is gone (a SuperNode restart): train from the share the
               server offers back (``admm-restore``, `restored_state`), else
               resynchronize, i.e. start fresh and say so; the server replaces its
               stale share

Restore: the server keeps a resync's full share sigma_i = n_i c_i (not under SecAgg+)
and offers c_i back. With gamma = 1, u_i + (w_i - z^k) = c_i - z^k, so the stand-in
state (w = c_i, u = 0) gives the same dual, center and Delta_i as the lost one; only
d2_i is unknown, and the reply says so.
"""

from __future__ import annotations

import io
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from flwr_admm.core.types import Arrays, check_dual_step
from flwr_admm.protocol import (
    ACK_ROUND,
    DUAL_STEP,
    FORM,
    RESTORE,
    RESTORE_EXAMPLES,
    SECAGG_SCALE,
)


@dataclass
class DualState:
    """What a client keeps: w_i, u_i (before its pending update), n_i, its last round.

    `residual` is the uplink compression residual e_i (None: zero).
    """

    w: Arrays
    u: Arrays
    num_examples: int
    server_round: int
    residual: Arrays | None = None
    budget: float | None = None  # the linearized form: b_i of the round that gave w_i

    @property
    def contribution(self) -> Arrays:
        """Return c_i = w_i + u_i, the share S holds (times `weight`)."""
        return [w + u for w, u in zip(self.w, self.u, strict=True)]

    @property
    def weight(self) -> float:
        """Return omega_i, the weight of c_i in S (`share_weight`)."""
        return share_weight(self.num_examples, self.budget)

    @property
    def share(self) -> Arrays:
        """Return sigma_i = omega_i c_i - e_i, this client's exact part of S."""
        n = self.weight
        share = [np.asarray(n * (w + u)) for w, u in zip(self.w, self.u, strict=True)]
        if self.residual is not None:
            for total, residual in zip(share, self.residual, strict=True):
                total -= residual
        return share


def share_weight(num_examples: int, budget: float | None) -> float:
    """Return omega_i = n_i, or n_i / b_i in the linearized form (`budget` b_i).

    The linearized z-step is z' = sum_i n_i rho_i (w_i + y_i / rho_i) / sum_i n_i rho_i
    with rho_i = 1 / b_i: c_i = w_i + u_i with u_i = b_i y_i, weighed by n_i / b_i.
    """
    return float(num_examples) if budget is None else num_examples / budget


@dataclass(frozen=True)
class Acknowledged:
    """The state to train from, and whether the client resynchronizes or was restored."""

    state: DualState | None  # None: start as a new client
    resync: bool  # S holds a share of this client that it no longer has
    restored: bool = False  # `state` is the server's offer (w = c_i, u = 0): no w_i, d2_i

    @property
    def own(self) -> DualState | None:
        """Return the client's own state: its w_i and the C to keep (None if restored)."""
        return None if self.restored else self.state


def ack_round(config: Mapping[str, object]) -> int | None:
    """Return ``admm-ack-round`` (None if absent); ValueError unless an integer >= 0."""
    if ACK_ROUND not in config:
        return None
    value = config[ACK_ROUND]
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{ACK_ROUND}: must be an integer >= 0, got {value!r}")
    return value


def opened(
    config: Mapping[str, object], z: Arrays, committed: DualState | None, pending: DualState | None
) -> Acknowledged:
    """Return the state to train from for a fit config: its acknowledgement and offer."""
    ack = ack_round(config)
    return acknowledged(committed, pending, ack, restored_state(config, z, ack))


def acknowledged(
    committed: DualState | None,
    pending: DualState | None,
    ack: int | None,
    restore: DualState | None = None,
) -> Acknowledged:
    """Return the state S holds for ack round a: P if p == a, C if a_c == a, else none.

    ``ack=None`` (a server that sends no acknowledgement): the newest state, as if the
    last reply had been used. a > 0 matching neither state: the server's offer
    `restore` (`restored_state`) if there is one, else resynchronize.
    """
    newest = pending if pending is not None else committed
    if ack is None:
        return Acknowledged(newest, resync=False)
    for state in (pending, committed):
        if state is not None and state.server_round == ack:
            return Acknowledged(state, resync=False)
    if ack != 0 and restore is not None:
        return Acknowledged(restore, resync=False, restored=True)
    return Acknowledged(None, resync=ack != 0)


def restore_payload(share: Sequence[np.ndarray], num_examples: int) -> bytes:
    """Return c_i = sigma_i / n_i, flat float64 ``.npy`` bytes (the ``admm-restore`` value)."""
    flat = np.concatenate([np.asarray(t, dtype=np.float64).reshape(-1) for t in share])
    buffer = io.BytesIO()
    np.save(buffer, flat / float(num_examples), allow_pickle=False)
    return buffer.getvalue()


def restored_state(config: Mapping[str, object], z: Arrays, ack: int | None) -> DualState | None:
    """Return the stand-in state (w = c_i, u = 0, n_i, round a) the server offers, or None.

    ValueError naming the field if the offer is malformed, or comes with a dual step
    other than 1, the linearized form (where c_i alone is not the state) or
    SecAgg+ (where the server never sees a share).
    """
    if RESTORE not in config:
        return None
    for field, bad in (
        (DUAL_STEP, DUAL_STEP in config and config[DUAL_STEP] != 1),
        (FORM, config.get(FORM, "prox") != "prox"),
        (SECAGG_SCALE, SECAGG_SCALE in config),
    ):
        if bad:
            raise ValueError(f"{RESTORE}: not offered with {field} = {config[field]!r}")
    n, payload = config.get(RESTORE_EXAMPLES), config[RESTORE]
    if isinstance(n, bool) or not isinstance(n, int) or n <= 0:
        raise ValueError(f"{RESTORE_EXAMPLES}: must be an integer > 0, got {n!r}")
    size = sum(t.size for t in z)
    try:
        flat = np.load(io.BytesIO(payload), allow_pickle=False)  # type: ignore[arg-type]
    except (TypeError, ValueError, OSError, EOFError):
        raise ValueError(f"{RESTORE}: must be .npy bytes of {size} float64 numbers") from None
    if flat.dtype != np.float64 or flat.shape != (size,) or not np.all(np.isfinite(flat)):
        raise ValueError(f"{RESTORE}: must be .npy bytes of {size} finite float64 numbers")
    if ack is None or ack <= 0:
        raise ValueError(f"{RESTORE}: needs an acknowledged round > 0, got {ack!r}")
    parts = np.split(flat, np.cumsum([t.size for t in z])[:-1])
    c = [p.reshape(t.shape).copy() for p, t in zip(parts, z, strict=True)]
    return DualState(c, [np.zeros_like(t) for t in c], n, ack)


@dataclass(frozen=True)
class DualStart:
    """The client's view of round k: its updated dual, center and delayed residual.

    `alignment` holds the terms of the dual step's alignment c_k
    (`flwr_admm.core.schedules`): s^2 <w_i - z^k, u_i>, s^2 ||w_i - z^k||^2 and
    s^2 ||u_i||^2 with u_i before the step and s = 1 / b_i under the linearized form
    (rho_i; y_i = u_i / b_i), else 1 (one rho for every client cancels in c_k).
    """

    dual: Arrays
    center: Arrays
    delayed_sq_residual: float | None
    alignment: tuple[float, float, float] | None = None
    scale: float | None = None  # the linearized form: the b_i that `dual` is u_i = b_i y_i of

    def dual_for(self, budget: float | None) -> Arrays:
        """Return u_i = b_i' y_i for the reply's step budget b_i' (the dual itself if unchanged)."""
        if budget is None or self.scale is None or budget == self.scale:
            return self.dual
        return [u * (budget / self.scale) for u in self.dual]

    def kept(
        self,
        w: Arrays,
        num_examples: int,
        server_round: int,
        residual: Arrays | None = None,
        budget: float | None = None,
    ) -> DualState:
        """Return the state to keep after training w_i' from this start (u_i in b_i' scale)."""
        return DualState(w, self.dual_for(budget), num_examples, server_round, residual, budget)


def start_round(state: DualState | None, z: Arrays, dual_step: float = 1.0) -> DualStart:
    """Update u_i += gamma (w_i - z^k) if it took part before (d2 = ||w_i - z^k||^2).

    The center is z^k - u_i; `dual_step` is gamma (`dual_step_of`).
    """
    if state is None:
        dual = [np.zeros_like(t) for t in z]
        return DualStart(dual, [t.copy() for t in z], None)
    diff = [w - t for w, t in zip(state.w, z, strict=True)]
    d2 = float(sum(np.vdot(d, d) for d in diff))
    along = float(sum(np.vdot(d, u) for d, u in zip(diff, state.u, strict=True)))
    s_sq = 1.0 if state.budget is None else 1.0 / (state.budget * state.budget)
    dual_sq = float(sum(np.vdot(u, u) for u in state.u))
    dual = _dual_update(state.u, diff, dual_step)
    center = [t - u for t, u in zip(z, dual, strict=True)]
    alignment = (s_sq * along, s_sq * d2, s_sq * dual_sq)
    return DualStart(dual, center, d2, alignment, state.budget)


def linear_term(state: DualState | None, start: DualStart) -> Arrays:
    """Return the linearized form's y_i = u_i / b_i (b_i: the kept state's step budget).

    The node keeps u_i = b_i y_i, so u_i += gamma (w_i - z^k) is the linearized form's
    y_i += gamma rho_i (w_i - z') with rho_i = 1 / b_i (`flwr_admm.core.linearized`).
    A first round (u_i = 0) needs no budget.
    """
    if state is None or state.budget is None:
        if any(np.any(u != 0) for u in start.dual):
            raise ValueError(
                "budget: the kept state has a dual but no step budget (written under "
                "form='prox'?): resync the node or keep the form for the whole run"
            )
        return [np.zeros_like(u) for u in start.dual]
    return [u / state.budget for u in start.dual]


def dual_step_of(config: Mapping[str, object]) -> float:
    """Return gamma from a fit config (``admm-dual-step``; absent: 1, the textbook step)."""
    if DUAL_STEP not in config:
        return 1.0
    try:
        return check_dual_step(config[DUAL_STEP])
    except ValueError:
        raise ValueError(
            f"{DUAL_STEP}: must be a number in (0, 1], got {config[DUAL_STEP]!r}"
        ) from None


def _dual_update(u: Arrays, diff: Arrays, gamma: float) -> Arrays:
    """Return u_i + gamma (w_i - z) (gamma = 1: 1.0 * d is d exactly, the textbook step)."""
    return [a + gamma * d for a, d in zip(u, diff, strict=True)]


def contribution_change(
    state: DualState | None,
    w: Arrays,
    dual: Arrays,
    num_examples: int,
    budget: float | None = None,
) -> Arrays:
    """Return Delta_i = omega_i' (w_i' + u_i) - omega_i c_i (0 before the first round).

    omega_i = n_i, or n_i / b_i in the linearized form (`share_weight`; `budget` b_i').
    """
    weight = share_weight(num_examples, budget)
    # np.asarray: for a 0-d tensor the product is a numpy scalar, which `-=` below would
    # rebind instead of updating in place.
    change = [np.asarray(weight * (a + u)) for a, u in zip(w, dual, strict=True)]
    if state is not None:
        for delta, old in zip(change, state.contribution, strict=True):
            delta -= state.weight * old
    return change
