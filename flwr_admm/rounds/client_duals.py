"""Consensus ADMM with client-held duals: the round, wire neutral.

The protocol is `flwr_admm.server.client_duals`'s module docstring, the node's
arithmetic `flwr_admm.core.client_duals`; the server keeps z, S = sum_i n_i c_i,
N = sum_i n_i and per key n_i and its last round, and takes

    S += Delta_i,  N += n_i' - n_i,  z^{k+1} = prox_{g/rho}(S / N)

`ClientDualsRound` is the `Algorithm` both `FedADMMClientDuals` translators drive; its
state, checks and sweep are `flwr_admm.rounds.client_duals_state`.
"""

from __future__ import annotations

from typing import Any

from flwr.common import Scalar
from numpy.typing import NDArray

from flwr_admm.core.dual_momentum import fast_config
from flwr_admm.core.linearized import Form, FormSpec, check_form, client_held_steps
from flwr_admm.core.regularizers import Regularizer
from flwr_admm.core.settings import given_rho
from flwr_admm.core.types import Arrays, check_reply
from flwr_admm.options import Convergence, Uplink, option
from flwr_admm.protocol import (
    ACCEL_Z_RECORD,
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
        dual_step: float = 1.0,
        acceleration: str | None = None,
        uplink: Uplink | None = None,
        form: FormSpec = "prox",
        restores: bool = True,
    ) -> None:
        self.form: Form = check_form(form)
        compressor = compressor_of(uplink)
        if self.form == "linearized":  # rho = 1: rho_i = 1 / b_i on the nodes
            given: dict[str, object] = {"rho": rho, "proximal_mu": proximal_mu}
            given.update(regularizer=regularizer, uplink=compressor, dual_step=dual_step)
            dual_step, rho = client_held_steps(form, {**given, "acceleration": acceleration})
        stopping = option("convergence", convergence, Convergence)
        self.state = ClientDualsState(
            rho=given_rho(rho, proximal_mu),
            regularizer=regularizer,
            eps_abs=stopping.eps_abs,
            eps_rel=stopping.eps_rel,
            acceleration=acceleration,
            dual_step=dual_step,
            # c_i is the whole client state only in the prox form without compression
            restores=restores and self.form == "prox" and compressor is None,
            linearized=self.form == "linearized",
        )
        self.channel = UplinkChannel(compressor)
        self.layout: Layout | None = None
        self._accel_z: Arrays = AS_RECEIVED  # fast ADMM: this round's z_k

    # ------------------------------------------------------------------ model
    def adopt(self, z: Arrays, layout: Layout) -> None:
        """Take z^k (the first call also sizes S)."""
        self.layout = layout
        self.state.adopt(z)

    def model(self) -> Arrays | None:
        """Return the z the next round sends (z^_{k+1} with fast ADMM; None before any)."""
        return self.state.z

    # ----------------------------------------------------------- instructions
    def round_config(self, sampled: int, population: int) -> dict[str, Scalar]:
        """Return rho, the mode, the form, the uplink and fast ADMM's g; fix z_k."""
        state = self.state
        self.channel.sampled(sampled, population)  # resets the round's byte count
        config: dict[str, Scalar] = {**self.channel.config(), RHO: state.rho, MODE_KEY: MODE_CLIENT}
        if self.form == "linearized":  # nodes start at z^k, y_i = u_i / b_i
            config[FORM] = FORM_LINEARIZED
        if state.momentum is not None:  # g, the restart kind; z_k after z^_{k+1}
            config.update(fast_config(state.momentum))
            last = state.momentum.last  # none yet: z_k = z^ (g = 0)
            self._accel_z = AS_RECEIVED if last is None else last.z
        return config

    def instruction(self, node: str, key: str | None) -> Instruction:
        """Return z^k, the key's ack round and rebuild flag (and z_k with fast ADMM)."""
        blocks = {} if self.state.momentum is None else {ACCEL_Z_RECORD: self._accel_z}
        return Instruction(AS_RECEIVED, self.state.instructions(key), blocks)

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

        A reply whose previous round or n_i disagrees with the server's record is a
        state mismatch (rejected; its next acknowledgement brings the node back). A
        full contribution (previous round 0) for a key S holds is a resync: its old
        share goes stale and the sweep takes it out of S.
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
    if link.residual != "update":
        raise ValueError(
            "residual: only 'update' with client-held duals (e_i enters S with the next "
            f"reply), got {link.residual!r}"
        )
    return checked_uplink(link.compressor)
