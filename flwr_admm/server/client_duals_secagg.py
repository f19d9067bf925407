"""FedADMMClientDualsSecAgg: client-held duals under Flower's SecAgg+ (sums only).

`FedADMMClientDuals` needs only sums of the replies: S += sum_i Delta_i. Under Flower's
``SecAggPlusWorkflow`` + ``secaggplus_mod`` the server unmasks only the sum of the
clients' (clipped, quantized) arrays, and every FitRes that reaches ``aggregate_fit``
carries the same aggregate. This strategy makes that sum exact and moves every check
that needed an individual reply to the sum or to the client:

    client   x_i = grid(Delta_i + e_i), e_i' = Delta_i + e_i - s x_i  (error feedback,
             `flwr_admm.core.secure_sum`), statistics as fixed-point limbs, and
             num_examples = max_weight so that every client weighs exactly 1;
    server   S += s sum_i x_i (exact: S = sum_i n_i c_i - sum_i e_i), N from the clients'
             n_i (clear metadata), residuals from the summed statistics.

What the server still sees per client: its key, the round it last took part in, the
change of n_i and n_i, the resync flag and, under ``form="linearized"``, its step
budget b_i = K_i lr_i (protocol metadata, in the clear metrics).
What it sees only as a sum: Delta_i, sigma_i' during a sweep, n_i ||w_i'||^2,
n_i ||u_i||^2, n_i d2_i and n_i f_i(w_i').

All or nothing. A reply's vector is inside the sum whatever the server thinks of its
metadata, so the round's aggregate is used whole or dropped whole (``num_secure_dropped``
= 1): dropped if any reply breaks the protocol (state mismatch, unusable key, key
conflict, duplicate), if the aggregate is not finite or outside [-c, c], if the
replies do not carry one common aggregate (no SecAgg+), or if a statistic's sum is
negative. The acknowledgement then works per round instead of per reply: S holds the
round's contributions of every client in the aggregate (their ack becomes this round)
or of none (their ack stays, they retrain from their committed state). A round SecAgg+
itself halts (too few shares) never reaches ``aggregate_fit``: same outcome. Clients
that drop out before sending their masked vector are not in the sum, and not in the
results: SecAgg+ removes their masks and the round goes on without them.

Rebuild sweep under SecAgg+: while one is on, every sampled client gets
``admm-secagg-sweep`` = 1 and appends a second block: grid(sigma_i') if asked to
rebuild, else x_i again; the server adds that block's sum to S_new and every key of the
round joins R. A rebuilt share is quantized once more (its error stays with the
client, `flwr_admm.client.secagg`).

Not supported: uplink compression (SecAgg+ quantizes already), local DP, fast ADMM.
"""

from __future__ import annotations

import math
from logging import WARNING
from typing import Any, ClassVar

import numpy as np
from flwr.common import FitIns, FitRes, Parameters, Scalar, parameters_to_ndarrays
from flwr.common.logger import log
from flwr.server.client_proxy import ClientProxy
from flwr.server.workflow import SecAggPlusWorkflow

from flwr_admm.client.secagg import NUM_STATS
from flwr_admm.core.secure_sum import SecureGrid, decode_stats
from flwr_admm.core.types import Arrays
from flwr_admm.protocol import (
    NUM_REJECTED,
    NUM_RESYNCED,
    NUM_STATE_MISMATCH,
    PREVIOUS_ROUND,
    SECAGG_CLIP,
    SECAGG_EXAMPLES,
    SECAGG_LEVELS,
    SECAGG_SCALE,
    SECAGG_SWEEP,
    SECAGG_WEIGHT,
    SECURE_DROPPED,
    STEP_BUDGET,
)
from flwr_admm.rounds.client_duals_replies import RoundStats, protocol_problem
from flwr_admm.rounds.identity import client_key_of
from flwr_admm.server.base import Results
from flwr_admm.server.client_duals import FedADMMClientDuals
from flwr_admm.server.sampling import keyed_replies
from flwr_admm.uplink.wire import parameters_problem

__all__ = ["FedADMMClientDualsSecAgg"]


class FedADMMClientDualsSecAgg(FedADMMClientDuals):
    """`FedADMMClientDuals` for Flower's SecAgg+ (see the module docstring).

    Takes every keyword of `FedADMMClientDuals` (but ``uplink``) plus:

    Parameters
    ----------
    secagg_scale : float, optional
        Common scale s > 0: clients send Delta_i / s on SecAgg+'s grid. The sum is
        exact up to the clients' residuals |e_i| <= s h / 2 per entry (h = 2c / T);
        a larger |Delta_i| / s than c is clipped and sent in later rounds. Default
        max_weight / c: a client with n_i = max_weight may move its contribution
        c_i by 1 per entry a round unclipped.
    clipping_range, quantization_range, modulus_range, max_weight :
        SecAgg+'s own settings (defaults as in Flower: 8.0, 2**22, 2**32, 1000); c and
        T must be powers of two, max_weight an integer (the num_examples every client
        reports). `workflow` builds the matching ``SecAggPlusWorkflow``.

    """

    label: ClassVar[str] = "FedADMMClientDualsSecAgg"
    counters: ClassVar[tuple[str, ...]] = (NUM_STATE_MISMATCH, NUM_RESYNCED, SECURE_DROPPED)

    def __init__(
        self,
        *,
        secagg_scale: float | None = None,
        clipping_range: float = 8.0,
        quantization_range: int = 1 << 22,
        modulus_range: int = 1 << 32,
        max_weight: int = 1000,
        **client_duals_kwargs: Any,
    ) -> None:
        if client_duals_kwargs.get("acceleration") is not None:
            raise ValueError(
                "acceleration: not supported under SecAgg+ (only None; z_k would have to "
                "follow z^ to every client), got "
                f"{client_duals_kwargs['acceleration']!r}; use FedADMMClientDuals"
            )
        if client_duals_kwargs.get("uplink") is not None:
            raise ValueError("uplink: not supported under SecAgg+ (it quantizes already)")
        if isinstance(max_weight, bool) or not isinstance(max_weight, int) or max_weight < 1:
            raise ValueError(f"max_weight: must be an integer >= 1, got {max_weight!r}")
        if secagg_scale is None and isinstance(clipping_range, int | float) and clipping_range > 0:
            secagg_scale = max_weight / clipping_range
        self.grid = SecureGrid(clipping_range, quantization_range, secagg_scale)  # type: ignore[arg-type]
        if (
            isinstance(modulus_range, bool)
            or not isinstance(modulus_range, int)
            or modulus_range <= quantization_range
            or modulus_range > 1 << 32
            or bin(modulus_range).count("1") != 1
        ):
            raise ValueError(
                "modulus_range: must be a power of two > quantization_range and <= 2**32, "
                f"got {modulus_range!r}"
            )
        self.max_weight, self.modulus_range = max_weight, modulus_range
        self._sweep_sent: Arrays | None = None  # the S_new the clients were told about
        super().__init__(**client_duals_kwargs)
        self.state.restores = False  # the server never sees a share to offer back

    def __repr__(self) -> str:
        return f"FedADMMClientDualsSecAgg(rho={self.state.rho}, grid={self.grid!r})"

    def workflow(
        self,
        num_shares: int | float,
        reconstruction_threshold: int | float,
        timeout: float | None = None,
    ) -> SecAggPlusWorkflow:
        """Return the ``SecAggPlusWorkflow`` with this strategy's c, T, M and max_weight."""
        return SecAggPlusWorkflow(
            num_shares,
            reconstruction_threshold,
            max_weight=float(self.max_weight),
            clipping_range=float(self.grid.clipping_range),
            quantization_range=self.grid.quantization_range,
            modulus_range=self.modulus_range,
            timeout=timeout,
        )

    # ------------------------------------------------------------------- fit
    def _fit_instructions(
        self, clients: list[ClientProxy], parameters: Parameters, config: dict[str, Scalar]
    ) -> list[tuple[ClientProxy, FitIns]]:
        """Add the grid (s, c, T), the weight and the sweep flag to every FitIns."""
        if len(clients) * self.grid.quantization_range >= self.modulus_range:
            raise ValueError(
                f"quantization_range: {len(clients)} clients x {self.grid.quantization_range} "
                f"levels overflow modulus_range {self.modulus_range}; lower it or sample fewer"
            )
        self._sweep_sent = self.state.sweep.new_sum
        secure: dict[str, Scalar] = {
            SECAGG_SCALE: float(self.grid.scale),
            SECAGG_CLIP: float(self.grid.clipping_range),
            SECAGG_LEVELS: self.grid.quantization_range,
            SECAGG_WEIGHT: self.max_weight,
            SECAGG_SWEEP: int(self._sweep_sent is not None),
        }
        instructions = super()._fit_instructions(clients, parameters, config)
        for _, ins in instructions:
            ins.config.update(secure)
        return instructions

    def _fold_replies(
        self, results: Results, server_round: int, counts: dict[str, Scalar]
    ) -> Results:
        """Check every reply's metadata and the aggregate; fold all of them or none."""
        if not results:
            return []
        rejected = int(counts[NUM_REJECTED])
        keyed = keyed_replies(
            results, client_key_of, lambda key, why: self._reject(key, why, counts)
        )
        admitted, freed = self.binding.admit(
            keyed, lambda key, why, conflict: self._reject(key, why, counts, conflict)
        )
        for key, _, res in admitted:
            entry = None if key in freed else self.state.clients.get(key)
            report = protocol_problem(
                entry, res.metrics, res.num_examples, secure=True, linearized=self.state.linearized
            )
            if report is None and int(res.metrics[SECAGG_EXAMPLES]) < 1:  # type: ignore[arg-type]
                report = f"{SECAGG_EXAMPLES} must be >= 1", 0
            if report is not None:
                self._reject(key, report[0], counts)
                counts[NUM_STATE_MISMATCH] = int(counts[NUM_STATE_MISMATCH]) + report[1]
        aggregate, problem = self._aggregate(results)
        if problem is None and int(counts[NUM_REJECTED]) > rejected:
            problem = "a reply broke the protocol, and its vector is inside the sum"
        if problem is not None or aggregate is None:
            log(WARNING, "%s round %s: aggregate dropped: %s", self.label, server_round, problem)
            counts[SECURE_DROPPED] = 1
            return []
        if freed:
            self._evict_keys(freed, "their nodes left the federation; new nodes start fresh")
        incoming = [reply.key for reply in admitted]
        crowded = self.binding.stale(self._clock, None, self.max_clients, incoming)
        if crowded:
            self._evict_keys(crowded, "least recently heard beyond max_clients")
        self._open_round(incoming)
        for key, proxy, res in admitted:
            self._fold_metadata(key, proxy, res, server_round, counts)
        change, new_block, stats = aggregate
        same_sweep = (
            self.state.sweep.new_sum is not None and self.state.sweep.new_sum is self._sweep_sent
        )
        assert self.state.contribution_sum is not None
        self.state.sweep.fold_sum(
            incoming, self.state.contribution_sum, change, new_block if same_sweep else None
        )
        self.state.stats = _round_stats([res for _, _, res in admitted], stats)
        return [(proxy, res) for _, proxy, res in admitted]

    def _fold_metadata(
        self,
        key: str,
        proxy: ClientProxy,
        res: FitRes,
        server_round: int,
        counts: dict[str, Scalar],
    ) -> None:
        """N += n_i' - n_i, record (n_i', round); a resync's old share goes stale."""
        n = int(res.metrics[SECAGG_EXAMPLES])  # type: ignore[arg-type]
        full = res.metrics[PREVIOUS_ROUND] == 0
        if self.state.record(key, n, server_round, full=full):
            counts[NUM_RESYNCED] = int(counts[NUM_RESYNCED]) + 1
        self.binding.bind(key, proxy.cid, self._clock)

    def _aggregate(
        self, results: Results
    ) -> tuple[tuple[Arrays, Arrays | None, list[float]] | None, str | None]:
        """Return (sum Delta, the S_new block's sum or None, summed statistics), or why not."""
        assert self.state.contribution_sum is not None
        if not results:
            return None, "no results"
        first = results[0][1].parameters
        if any(res.parameters.tensors != first.tensors for _, res in results[1:]):
            return None, "the replies carry different arrays: not a SecAgg+ aggregate"
        count, shapes = (
            len(self.state.contribution_sum),
            [t.shape for t in self.state.contribution_sum],
        )
        stats_shape = (NUM_STATS * self.grid.num_limbs,)
        blocks = 2 if self._sweep_sent is not None else 1
        problem = parameters_problem(first, shapes * blocks + [stats_shape])  # before a copy
        if problem is not None:
            return None, f"unusable aggregate ({problem})"
        try:
            mean = [np.asarray(t, dtype=np.float64) for t in parameters_to_ndarrays(first)]
        except Exception as error:  # a malformed aggregate must not stop the server
            return None, f"unreadable aggregate ({error!r})"
        if [t.shape for t in mean] != shapes * blocks + [stats_shape]:
            return None, f"expected {blocks} block(s) of shapes {shapes} and {stats_shape}"
        bound = float(self.grid.clipping_range) * (1 + 1e-9)
        if not all(np.isfinite(t).all() and np.abs(t).max(initial=0.0) <= bound for t in mean):
            return None, "the aggregate is not finite or lies outside [-c, c]"
        total = self.grid.total(mean[: count * blocks], len(results))
        try:
            stats = decode_stats(self.grid, self.grid.levels(mean[-1:], len(results))[0], NUM_STATS)
        except ValueError as error:
            return None, str(error)
        new_block = total[count:] if blocks == 2 else None
        return (total[:count], new_block, stats), None

    def configuration(self) -> dict[str, Any]:
        """Return `FedADMMClientDuals`'s configuration plus the SecAgg+ grid."""
        return {
            **super().configuration(),
            "secagg": [self.grid.scale, self.grid.clipping_range, self.grid.quantization_range],
        }


def _round_stats(replies: list[FitRes], stats: list[float]) -> RoundStats:
    """Return the round's RoundStats from the summed statistics and the clear n_i."""
    round_stats = RoundStats()
    for res in replies:
        n = float(res.metrics[SECAGG_EXAMPLES])  # type: ignore[arg-type]
        round_stats.num_replies += 1
        round_stats.n += n
        if STEP_BUDGET in res.metrics:  # the linearized form's b_i, in the clear
            round_stats.budgets.append(float(res.metrics[STEP_BUDGET]))  # type: ignore[arg-type]
        if res.metrics[PREVIOUS_ROUND] != 0:
            round_stats.num_delayed += 1
            round_stats.n_delayed += n
    round_stats.w_sq, round_stats.u_sq, round_stats.d2, round_stats.loss = stats[:4]
    round_stats.losses_finite = stats[4] == 0 and math.isfinite(stats[3])
    return round_stats
