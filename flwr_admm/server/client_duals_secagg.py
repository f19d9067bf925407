"""FedADMMClientDualsSecAgg: client-held duals under Flower's SecAgg+ (sums only).

`FedADMMClientDuals` needs only sums of the replies: S += sum_i Delta_i. Under Flower's
``SecAggPlusWorkflow`` + ``secaggplus_mod`` the server unmasks only the sum of the
clients' (clipped, quantized) arrays, and every FitRes that reaches ``aggregate_fit``
carries the same aggregate. This strategy makes that sum exact and moves every check
that needed an individual reply to the sum or to the client:

    client   x_i = grid(Delta_i + e_i), e_i' = Delta_i + e_i - s x_i  (error feedback,
             `flwr_admm.core.secure_sum`), statistics as fixed-point limbs, and
             num_examples = max_weight so that every client weighs exactly 1;
    server   S += s sum_i x_i (exact: S = sum_i omega_i c_i - sum_i e_i), N from the
             clients' n_i (and b_i: omega_i = n_i / b_i in the linearized form; clear
             metadata), residuals from the summed statistics.

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
negative; a dropped round changes nothing, not even an eviction (the round layer asks
`SecureClientDualsRound.admits` first). The acknowledgement then works per round
instead of per reply: S holds the round's contributions of every client in the
aggregate (their ack becomes this round) or of none (their ack stays, they retrain
from their committed state). A round SecAgg+ itself halts (too few shares) never
reaches ``aggregate_fit``: same outcome. Clients that drop out before sending their
masked vector are not in the sum, and not in the results: SecAgg+ removes their masks
and the round goes on without them.

Rebuild sweep under SecAgg+: while one is on, every sampled client gets
``admm-secagg-sweep`` = 1 and appends a second block: grid(sigma_i') if asked to
rebuild, else x_i again; the server adds that block's sum to S_new and every key of the
round joins R. A rebuilt share is quantized once more (its error stays with the
client, `flwr_admm.client.secagg`).

Not supported: uplink compression (SecAgg+ quantizes already), local DP, fast ADMM.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from logging import WARNING
from typing import Any

import numpy as np
from flwr.common import FitRes, Scalar, parameters_to_ndarrays
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
)
from flwr_admm.rounds.client_duals import ClientDualsRound, compressor_of
from flwr_admm.rounds.client_duals_replies import RoundStats, protocol_problem
from flwr_admm.rounds.exchange import Incoming, Tally
from flwr_admm.server.client_duals import FedADMMClientDuals
from flwr_admm.uplink.wire import parameters_problem

__all__ = ["FedADMMClientDualsSecAgg", "SecureClientDualsRound"]

Aggregate = tuple[Arrays, Arrays | None, list[float]]  # sum Delta, the S_new block's sum, stats


class SecureClientDualsRound(ClientDualsRound):
    """`ClientDualsRound` over SecAgg+'s one aggregate: all or nothing (module docstring).

    Every reply carries the same aggregate (`FedADMMClientDualsSecAgg` reads it whole);
    its clear metrics are checked reply by reply in `admits`, which refuses the round
    (``num_secure_dropped`` = 1) before any key is evicted or any state changes.
    """

    label = "FedADMMClientDualsSecAgg"
    counters: tuple[str, ...] = (NUM_STATE_MISMATCH, NUM_RESYNCED, SECURE_DROPPED)
    reply_blocks: tuple[str, ...] = ()

    def __init__(
        self,
        *,
        secagg_scale: float | None = None,
        clipping_range: float = 8.0,
        quantization_range: int = 1 << 22,
        modulus_range: int = 1 << 32,
        max_weight: int = 1000,
        **settings: Any,
    ) -> None:
        if compressor_of(settings.get("uplink")) is not None:
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
        self._aggregate: Aggregate | None = None  # the round's, once `admits` read it
        super().__init__(restores=False, **settings)  # the server never sees a share

    def round_config(self, sampled: int, population: int) -> dict[str, Scalar]:
        """Add the grid (s, c, T), the weight and the sweep flag to every config."""
        if sampled * self.grid.quantization_range >= self.modulus_range:
            raise ValueError(
                f"quantization_range: {sampled} clients x {self.grid.quantization_range} "
                f"levels overflow modulus_range {self.modulus_range}; lower it or sample fewer"
            )
        self._sweep_sent = self.state.sweep.new_sum
        return {
            **super().round_config(sampled, population),
            SECAGG_SCALE: float(self.grid.scale),
            SECAGG_CLIP: float(self.grid.clipping_range),
            SECAGG_LEVELS: self.grid.quantization_range,
            SECAGG_WEIGHT: self.max_weight,
            SECAGG_SWEEP: int(self._sweep_sent is not None),
        }

    def read(self, reply: Incoming) -> tuple[Any, str | None]:
        """Take a reply as it is: its vector is inside the sum whatever its metadata says."""
        return reply.metrics, None

    def admits(
        self,
        replies: list[tuple[Incoming, Any]],
        freed: list[str],
        server_round: int,
        tally: Tally,
    ) -> bool:
        """Check every reply's clear metadata and the aggregate; False drops the round."""
        if not replies and not tally.counts[NUM_REJECTED]:
            return False  # nothing arrived: nothing to drop
        for reply, _ in replies:
            entry = None if reply.key in freed else self.state.clients.get(reply.key)
            report = protocol_problem(
                entry,
                reply.metrics,
                reply.num_examples,
                secure=True,
                linearized=self.state.linearized,
            )
            if report is None and int(reply.metrics[SECAGG_EXAMPLES]) < 1:
                report = f"{SECAGG_EXAMPLES} must be >= 1", 0
            if report is not None:
                tally.reject(reply.key, report[0])
                tally.add(NUM_STATE_MISMATCH, report[1])
        self._aggregate, problem = self._read_aggregate([reply for reply, _ in replies])
        if problem is None and tally.counts[NUM_REJECTED]:
            problem = "a reply broke the protocol, and its vector is inside the sum"
        if problem is not None:
            log(WARNING, "%s round %s: aggregate dropped: %s", self.label, server_round, problem)
            tally.add(SECURE_DROPPED)
            self._aggregate = None
        return problem is None

    def fold(
        self, replies: list[tuple[Incoming, Any]], server_round: int, tally: Tally
    ) -> list[bool]:
        """N += omega_i' - omega_i and the entries from the clear n_i, b_i; S += s sum_i x_i."""
        state, aggregate, self._aggregate = self.state, self._aggregate, None
        if aggregate is None:  # the round was dropped (`admits`)
            return [False] * len(replies)
        assert state.contribution_sum is not None
        for reply, _ in replies:  # a resync's old share goes stale
            n = int(reply.metrics[SECAGG_EXAMPLES])
            full, weight = reply.metrics[PREVIOUS_ROUND] == 0, state.weight(n, reply.metrics)
            resync = state.record(reply.key, n, server_round, full=full, weight=weight)
            tally.add(NUM_RESYNCED, int(resync))
        change, new_block, stats = aggregate
        sweep = state.sweep
        same_sweep = sweep.new_sum is not None and sweep.new_sum is self._sweep_sent
        keys = [reply.key for reply, _ in replies]
        sweep.fold_sum(keys, state.contribution_sum, change, new_block if same_sweep else None)
        state.stats = _round_stats([reply.metrics for reply, _ in replies], stats)
        return [True] * len(replies)

    def _read_aggregate(self, replies: list[Incoming]) -> tuple[Aggregate | None, str | None]:
        """Return (sum Delta, the S_new block's sum or None, summed statistics), or why not."""
        like = self.state.contribution_sum
        assert like is not None
        if not replies or replies[0].arrays is None:
            return None, "no results"
        first = replies[0].arrays
        if any(r.arrays is None or r.arrays.tensors != first.tensors for r in replies[1:]):
            return None, "the replies carry different arrays: not a SecAgg+ aggregate"
        count, shapes = len(like), [t.shape for t in like]
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
        total = self.grid.total(mean[: count * blocks], len(replies))
        try:
            stats = decode_stats(self.grid, self.grid.levels(mean[-1:], len(replies))[0], NUM_STATS)
        except ValueError as error:
            return None, str(error)
        new_block = total[count:] if blocks == 2 else None
        return (total[:count], new_block, stats), None

    def configuration(self) -> dict[str, Any]:
        """Return `ClientDualsRound`'s configuration plus the SecAgg+ grid."""
        return {
            **super().configuration(),
            "secagg": [self.grid.scale, self.grid.clipping_range, self.grid.quantization_range],
        }


def _round_stats(metrics: list[Mapping[str, Any]], stats: list[float]) -> RoundStats:
    """Return the round's RoundStats from the summed statistics and the clear n_i."""
    round_stats = RoundStats()
    for reported in metrics:
        n = float(reported[SECAGG_EXAMPLES])
        round_stats.num_replies += 1
        round_stats.n += n
        if reported[PREVIOUS_ROUND] != 0:
            round_stats.num_delayed += 1
            round_stats.n_delayed += n
    round_stats.w_sq, round_stats.u_sq, round_stats.d2, round_stats.loss = stats[:4]
    round_stats.losses_finite = stats[4] == 0 and math.isfinite(stats[3])
    return round_stats


class FedADMMClientDualsSecAgg(FedADMMClientDuals):
    """`FedADMMClientDuals` for Flower's SecAgg+ (see the module docstring).

    Takes the keywords of `FedADMMClientDuals` (``uplink`` unset) plus:

    Parameters
    ----------
    secagg_scale : float, optional
        Common scale s > 0: clients send Delta_i / s on SecAgg+'s grid. The sum is
        exact up to the clients' residuals |e_i| <= s h / 2 per entry (h = 2c / T);
        a larger |Delta_i| / s than c is clipped and sent in later rounds. Default
        max_weight / c: a client with n_i = max_weight may move its contribution
        c_i by 1 per entry a round unclipped. Under ``form="linearized"`` c_i weighs
        n_i / b_i: a scale b_i times smaller keeps that resolution.
    clipping_range, quantization_range, modulus_range, max_weight :
        SecAgg+'s own settings (defaults as in Flower: 8.0, 2**22, 2**32, 1000); c and
        T must be powers of two, max_weight an integer (the num_examples every client
        reports). `workflow` builds the matching ``SecAggPlusWorkflow``.

    """

    algorithm: SecureClientDualsRound

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
        self._secure: dict[str, Any] = {
            "secagg_scale": secagg_scale,
            "clipping_range": clipping_range,
            "quantization_range": quantization_range,
            "modulus_range": modulus_range,
            "max_weight": max_weight,
        }
        super().__init__(**client_duals_kwargs)

    def _round(self, **settings: Any) -> SecureClientDualsRound:
        return SecureClientDualsRound(**self._secure, **settings)

    def _incoming(self, proxy: ClientProxy, res: FitRes, count: int) -> Incoming:
        """Every FitRes carries the round's aggregate: read whole by the round."""
        raw = (res.num_examples, res.metrics)
        return Incoming(proxy.cid, res.metrics, res.num_examples, res.parameters, raw=raw)

    @property
    def grid(self) -> SecureGrid:
        """SecAgg+'s clipping and quantization ranges, with the common scale s."""
        return self.algorithm.grid

    @property
    def max_weight(self) -> int:
        """The num_examples every client reports (SecAgg+'s weight)."""
        return self.algorithm.max_weight

    @property
    def modulus_range(self) -> int:
        """SecAgg+'s modulus M."""
        return self.algorithm.modulus_range

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
