"""Consensus ADMM with client-held duals: the protocol, and its round (wire neutral).

This docstring states the protocol; its keys are in `flwr_admm.protocol` and
docs/client_duals.md, the node's arithmetic in `flwr_admm.core.client_duals` and the
node's round in `flwr_admm.node.duals` (which `ADMMClient`, `ADMMTrainStep` and
`TorchADMM` run on ``admm-duals = "client"``). rho > 0 is one constant for every node.
Node i keeps w_i, its scaled dual u_i, n_i and its last round in its ``context.state``;
the server keeps z, S = sum_i n_i c_i with c_i = w_i + u_i, N = sum_i n_i and per
client key n_i and the round it last took part in. Round k:

    server   sends z^k, rho and each sampled node's acknowledgement (below)
    node     if it took part before:  d2_i = ||w_i - z^k||^2,  u_i += gamma (w_i - z^k)
             w_i' ~ argmin f_i(w) + rho/2 ||w - (z^k - u_i)||^2    (inexact local solve)
             sends Delta_i = n_i' (w_i' + u_i) - n_i c_i, keeps w_i', u_i, n_i'
    server   S += Delta_i,  N += n_i' - n_i                        (one pass per reply)
             z^{k+1} = prox_{g/rho}(S / N)

With every node in every round and gamma = 1 this is `flwr_admm.serverapp.FedADMM`'s
round at constant rho: the z-step of round k+1 averages w_i^{k+1} + u_i^k with u_i^k
updated by z^k. Under partial participation it is a delayed-dual variant: a node's
dual update uses the z it sees at its next participation, and absent nodes count with
their pre-update dual. A changing or per-client rho, or over-relaxation, would need
every dual on the server.

Residuals (`flwr_admm.rounds.client_duals_replies`). s = rho ||z^{k+1} - z^k||. The
primal residual arrives a round late: node i reports d2_i for its previous w_i, so
``previous_primal_residual`` = sqrt(sum n_i d2_i / sum n_i) over the replying nodes that
took part before is server-held FedADMM's r of round k - 1 (full participation).

Acknowledgement. A reply the server does not use (lost after the node saved its state,
a duplicate, a replay, a NaN, a truncated payload, a round dropped with
``accept_failures=False``) must not leave the node a step ahead of S. Each sampled
node's config carries ``admm-ack-round`` = a, the round whose contribution S holds for
its key (0: none); the node keeps its committed state C (round a_c, what S holds) next
to its pending state P (round p, after its last reply) and trains from P if p == a (the
reply was used: C := P), from C if a_c == a (it was not: P and its compression residual
are dropped), fresh if a == 0. Otherwise its state is gone (a SuperNode restart): it
trains from the share the server offers back (``admm-restore``, below), or
resynchronizes with a full contribution F_i = n_i' c_i' as a new node (previous round
0, ``admm-resync`` = 1). A reply whose previous round or n_i disagrees with the server's
record (a replay, a duplicate) is rejected (``num_state_mismatch``) without touching S;
the next acknowledgement brings the node back.

Rebuild sweep (`flwr_admm.rounds.client_duals_sweep`). A resync for a key S holds is
accepted (N += n_i' - n_i, S += F_i, ``num_resynced``), but S still holds the key's old
share, which the server never had and cannot subtract. So every sampled key not yet
rebuilt gets ``admm-rebuild`` = 1 and sends, next to Delta_j, its full share
sigma_j' = n_j' c_j' - e_j' in full precision (``admm-share``); once every key the
server holds has rebuilt, S := S_new exactly. Until then the stale shares keep their
weight N_stale in z = prox_{g/rho}(S / (N + N_stale)) and the round metric
``rebuilding`` is 1 (``converged`` 0). An evicted key's share leaves S the same way.
Cost: one extra model-sized upload per node per sweep, one extra model copy (S_new) on
the server while it runs; under full participation it ends one round after it started,
and a key that never returns keeps it open until it is evicted. The server keeps a
resync's F_i as the key's known share: its next resync or eviction takes that share out
of S exactly, and in the prox form with gamma = 1, without compression or SecAgg+, it
is offered back (``admm-restore``), so a node that loses its state again
trains from it (`flwr_admm.core.client_duals.restored_state`).

The linearized form (``form="linearized"``; `flwr_admm.core.linearized.client_held_steps`
names what it refuses): the config carries ``admm-form = "linearized"``; node i keeps
u_i = b_i y_i, runs K_i steps on grad f_i + u_i / b_i from z^k and replies its step
budget b_i' (``admm-step-budget``; a reply without it is rejected). Every n_i above is
then omega_i = n_i / b_i (rho_i = 1 / b_i), with u_i rescaled to b_i' before it enters
the share (`flwr_admm.core.client_duals.share_weight`): S / N is the form's z-step with
any budgets, server-held FedADMM's with every node replying. The server's rho is 1.

Uplink compression (``Uplink(compressor=...)``; error feedback is required, as S would
keep every compression error without it). Node i keeps a residual e_i, compresses
x = Delta_i + e_i and keeps e_i' = x - decode(payload); the server adds decode(payload)
to S (no center: the payload is the change itself), so S = sum_i n_i c_i - sum_i e_i
(up to float rounding): the unsent part enters S with the node's next reply.
``uplink_bytes`` counts the payload bytes of each round. Local DP is not supported
(`compressor_of`).

Checkpoints hold z, S, N, the per-key entries, the sweep, fast ADMM's state, the round,
the convergence flag and a fingerprint of the configuration. The duals stay on the
nodes: a resumed run continues exactly if they kept their ``context.state``; a node
that lost it, or went on past the checkpoint's round, resynchronizes.

`ClientDualsRound` is the `Algorithm` both `FedADMMClientDuals` translators drive; its
server state is `flwr_admm.rounds.client_duals_state`.
"""

from __future__ import annotations

from typing import Any

from flwr.common import Scalar
from numpy.typing import NDArray

from flwr_admm.core.linearized import Form, FormSpec, check_form, chosen_form, client_held_steps
from flwr_admm.core.regularizers import Regularizer
from flwr_admm.core.schedules import DualStep
from flwr_admm.core.settings import given_rho
from flwr_admm.core.types import Arrays, check_reply
from flwr_admm.options import Convergence, Uplink, option
from flwr_admm.protocol import (
    FORM,
    FORM_LINEARIZED,
    MODE_CLIENT,
    MODE_KEY,
    NUM_RESYNCED,
    NUM_STATE_MISMATCH,
    PREVIOUS_ROUND,
    RHO,
    SHARE_RECORD,
)
from flwr_admm.rounds.client_duals_replies import RoundStats
from flwr_admm.rounds.client_duals_state import STRATEGY, ClientDualsState
from flwr_admm.rounds.exchange import AS_RECEIVED, Incoming, Instruction, Layout, Tally, read_block
from flwr_admm.uplink.channel import UplinkChannel
from flwr_admm.uplink.compression import Compressor, checked_uplink
from flwr_admm.uplink.wire import parameters_problem

__all__ = ["ClientDualsRound", "compressor_of"]


class ClientDualsRound:
    """Client-held duals (`ClientDualsState`) as a strategy's `Algorithm`.

    Takes the keywords of `FedADMMClientDuals` that set the math (checked here,
    ValueError naming the field); `restores` False never offers a kept share back
    (``admm-restore``: SecAgg+, where the server sees no share).
    """

    label = STRATEGY
    counters: tuple[str, ...] = (NUM_STATE_MISMATCH, NUM_RESYNCED)
    reply_blocks: tuple[str, ...] = (SHARE_RECORD,)
    keeps_model = True  # z' stays float64 here: the broadcast (rounded) is not re-read

    def __init__(
        self,
        *,
        rho: float | None = None,
        proximal_mu: float | None = None,
        regularizer: Regularizer | None = None,
        convergence: Convergence = Convergence(),
        dual_step: DualStep | None = None,
        uplink: Uplink | None = None,
        form: FormSpec | None = "prox",
        restores: bool = True,
    ) -> None:
        compressor = compressor_of(uplink)
        prox_only = {"rho": rho, "proximal_mu": proximal_mu, "regularizer": regularizer}
        form = chosen_form(form, {**prox_only, "dual_step": dual_step, "uplink": compressor})
        dual_step = 1.0 if dual_step is None else dual_step  # the prox form's: textbook
        self.form: Form = check_form(form)
        if self.form == "linearized":  # rho = 1: rho_i = 1 / b_i on the nodes
            given: dict[str, object] = {"rho": rho, "proximal_mu": proximal_mu}
            given.update(regularizer=regularizer, uplink=compressor, dual_step=dual_step)
            dual_step, rho = client_held_steps(form, given)
        stopping = option("convergence", convergence, Convergence)
        self.state = ClientDualsState(
            rho=given_rho(rho, proximal_mu),
            regularizer=regularizer,
            eps_abs=stopping.eps_abs,
            eps_rel=stopping.eps_rel,
            dual_step=dual_step,
            # c_i is the whole client state only in the prox form without compression
            restores=restores and self.form == "prox" and compressor is None,
            linearized=self.form == "linearized",
        )
        self.channel = UplinkChannel(compressor)
        self.layout: Layout | None = None

    # ------------------------------------------------------------------ model
    def adopt(self, z: Arrays, layout: Layout) -> None:
        """Take z^k (the first call also sizes S)."""
        self.layout = layout
        self.state.adopt(z)

    def model(self) -> Arrays | None:
        """Return the z the next round sends (None before any)."""
        return self.state.z

    # ----------------------------------------------------------- instructions
    def round_config(self, sampled: int, population: int) -> dict[str, Scalar]:
        """Return rho, the mode, the form and the uplink."""
        state = self.state
        self.channel.sampled(sampled, population)  # resets the round's byte count
        config: dict[str, Scalar] = {**self.channel.config(), RHO: state.rho, MODE_KEY: MODE_CLIENT}
        if self.form == "linearized":  # nodes start at z^k, y_i = u_i / b_i
            config[FORM] = FORM_LINEARIZED
        return config

    def instruction(self, node: str, key: str | None) -> Instruction:
        """Return z^k, the key's ack round and rebuild flag."""
        return Instruction(AS_RECEIVED, self.state.instructions(key))

    # ---------------------------------------------------------------- replies
    def read(self, reply: Incoming) -> tuple[Any, str | None]:
        """Decode Delta_i (decode(payload) when compressed) and sigma_i'; check both.

        Shapes, dtypes and NaN/inf are checked before anything touches S.
        """
        state = self.state
        assert self.layout is not None and state.contribution_sum is not None
        if reply.arrays is None:
            return None, "no model in the reply"
        shapes = list(self.layout.shapes)
        problem = parameters_problem(reply.arrays, shapes)  # sizes, before any copy
        if problem is not None:
            return None, problem
        like = state.contribution_sum  # the shapes only: the payload is a change of S
        change = self.channel.decode(reply.arrays, lambda: like, add_center=False)
        problem, _ = check_reply(change, reply.num_examples, shapes)
        share = None
        block = reply.blocks.get(SHARE_RECORD)
        if problem is None and block is not None:
            share, problem = read_block(block, shapes)
            problem = problem or check_reply(share, reply.num_examples, shapes)[0]
            problem = None if problem is None else f"{SHARE_RECORD}: {problem}"
        return (None if problem else (change, share)), problem

    def fold(
        self, replies: list[tuple[Incoming, Any]], server_round: int, tally: Tally
    ) -> list[bool]:
        """S += Delta_i, N += n_i' - n_i for each reply that keeps the protocol.

        A state mismatch is rejected; a full contribution for a key S holds is a resync
        (module docstring).
        """
        state = self.state
        state.stats = RoundStats()
        folded = []
        for reply, (change, share) in replies:
            key, metrics, n = reply.key, reply.metrics, int(reply.num_examples)
            report = state.problem(key, metrics, n)
            if report is not None:
                tally.reject(key, report[0])
                tally.add(NUM_STATE_MISMATCH, report[1])
                folded.append(False)
                continue
            full = metrics[PREVIOUS_ROUND] == 0
            resync = state.fold(key, change, share, n, server_round, metrics, full=full)
            tally.add(NUM_RESYNCED, int(resync))
            folded.append(True)
        return folded

    def finish(self, server_round: int) -> tuple[dict[str, Scalar], bool]:
        """Take the z-step z = prox_{g/rho}(S / (N + N_stale)); return the residuals."""
        metrics, converged = self.state.finish_round()
        return {**metrics, **self.channel.round_metrics(aggregated=True)}, converged

    def discard(self) -> dict[str, Scalar]:
        """Return rho, the cached count and the sweep flag, unchanged."""
        return {**self.state.discard_metrics(), **self.channel.round_metrics(aggregated=False)}

    def evict(self, keys: list[str]) -> int:
        """Forget `keys`: drop their entries, N -= n_i; the sweep removes their shares."""
        return self.state.evict(keys)

    # ------------------------------------------------------------------ state
    def configuration(self) -> dict[str, Any]:
        """Return the settings a checkpoint must agree with (JSON)."""
        compressor = self.channel.compressor
        return {
            **self.state.configuration(STRATEGY),
            **({} if self.form == "prox" else {"form": self.form}),
            "uplink": None if compressor is None else compressor.config(),
        }

    def state_dict(self) -> tuple[dict[str, NDArray[Any]], dict[str, Any]]:
        """Return z, S, N, the per-key entries (n_i, last round), the sweep, fast ADMM's."""
        return self.state.state_dict()

    def load_state_dict(
        self, arrays: dict[str, NDArray[Any]], manifest: dict[str, Any], layout: Layout
    ) -> None:
        """Restore `state_dict` (ValueError, nothing changed, if it disagrees with `layout`)."""
        self.state.load_state_dict(arrays, manifest, layout.shapes)
        self.layout = layout


def compressor_of(uplink: Uplink | None) -> Compressor | None:
    """Return the compressor of an `Uplink` for client-held duals; ValueError naming a field.

    Delta_i is a change of the sum S: local DP would noise S for good, and the
    residual e_i already reaches S with the node's next reply (error feedback, required).
    """
    link = Uplink() if uplink is None else option("uplink", uplink, Uplink)
    if link.local_dp is not None:
        raise ValueError(
            f"local_dp: not supported with client-held duals (use FedADMM), got {link.local_dp!r}"
        )
    return checked_uplink(link.compressor)
