"""FedNova's server update: normalized averaging of local SGD (Wang et al., NeurIPS 2020).

Flower ships no FedNova; this is the plain local-SGD case of the paper (no momentum,
no proximal term), where client i's normalizing vector a_i is all ones and
||a_i||_1 = tau_i, its number of local steps. With x the global model sent this
round, w_i client i's returned model and p_i = n_i / sum_j n_j over the replies,

    d_i     = (x - w_i) / tau_i                 (client i's average step, lr included)
    tau_eff = sum_i p_i tau_i
    x'      = x - tau_eff * sum_i p_i d_i

When every tau_i is equal this is FedAvg's x' = sum_i p_i w_i; when they differ it
removes the objective inconsistency of FedAvg, which over-weights clients that take
more steps.

`FedNovaRound` is the `flwr_admm.rounds.exchange.Algorithm` both APIs' `FedNova` run:
FedAvg's wire plus the integer reply metric ``local_steps``, replies summed in key
order, no per-client state.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from flwr.common import NDArrays, Scalar
from numpy.typing import NDArray

from flwr_admm.core.types import Arrays, reply_problem
from flwr_admm.protocol import LOCAL_STEPS, NUM_REPLIES, TAU_EFF
from flwr_admm.rounds.exchange import AS_RECEIVED, Incoming, Instruction, Layout, Tally, read_blocks

__all__ = [
    "MAX_LOCAL_STEPS",
    "FedNovaRound",
    "local_steps_problem",
    "normalized_average",
]

# tau_eff scales the whole update: one reply claiming 1e300 steps would ruin x for
# good. No local loop of a federated round takes more steps than this.
MAX_LOCAL_STEPS = 1_000_000


def local_steps_problem(tau: object) -> str | None:
    """Why a reported ``local_steps`` value is unusable, or None (an integer in [0, 1e6])."""
    if tau is None:
        return f"missing the {LOCAL_STEPS!r} fit metric (FedNova needs tau_i)"
    if isinstance(tau, bool) or not isinstance(tau, int | float | np.integer | np.floating):
        return f"{LOCAL_STEPS} must be an integer >= 0, got {tau!r}"
    if not math.isfinite(float(tau)) or float(tau) != int(tau) or tau < 0:
        return f"{LOCAL_STEPS} must be an integer >= 0, got {tau!r}"
    if tau > MAX_LOCAL_STEPS:
        return f"{LOCAL_STEPS} must be at most {MAX_LOCAL_STEPS:,}, got {tau!r}"
    return None


def normalized_average(
    x: NDArrays, replies: list[tuple[NDArrays, int, int]]
) -> tuple[NDArrays, float]:
    """FedNova's update from x and replies (w_i, n_i, tau_i); returns (x', tau_eff).

    x' = x - tau_eff * sum_i p_i (x - w_i) / tau_i, p_i = n_i / sum_j n_j,
    tau_eff = sum_i p_i tau_i; a reply with tau_i = 0 contributes d_i = 0.
    """
    total = float(sum(n for _, n, _ in replies))
    weights = [n / total for _, n, _ in replies]
    tau_eff = float(sum(p * tau for p, (_, _, tau) in zip(weights, replies, strict=True)))
    direction = [np.zeros_like(t, dtype=np.float64) for t in x]
    for p, (w, _, tau) in zip(weights, replies, strict=True):
        if tau == 0:
            continue
        for d, xk, wk in zip(direction, x, w, strict=True):
            d += (p / tau) * (xk - np.asarray(wk, dtype=np.float64))
    return [xk - tau_eff * d for xk, d in zip(x, direction, strict=True)], tau_eff


class FedNovaRound:
    """FedNova's server round: x' from the round's replies (w_i, n_i, tau_i)."""

    label = "FedNova"
    counters: tuple[str, ...] = ()
    reply_blocks: tuple[str, ...] = ()

    def __init__(self) -> None:
        self.x: Arrays | None = None  # the model sent this round (float64), then x'
        self.shapes: tuple[tuple[int, ...], ...] = ()
        self._folded: list[tuple[NDArrays, int, int]] = []  # (w_i, n_i, tau_i), key order

    def adopt(self, z: Arrays, layout: Layout) -> None:
        """Take x, the model this round sends."""
        self.x, self.shapes = list(z), layout.shapes

    def model(self) -> Arrays | None:
        """Return x' after an aggregation, else x (None before the first round)."""
        return self.x

    def round_config(self, sampled: int, population: int) -> dict[str, Scalar]:
        """FedNova adds nothing to the config."""
        return {}

    def instruction(self, node: str, key: str | None) -> Instruction:
        """Send x as received."""
        return Instruction(AS_RECEIVED, {})

    def read(self, reply: Incoming) -> tuple[tuple[NDArrays, int, int] | None, str | None]:
        """Return (w_i, n_i, tau_i), or why the reply is unusable.

        Refused: other shapes, NaN/inf, n_i <= 0, a missing or bad ``local_steps``, and
        0 steps with a model other than x.
        """
        assert self.x is not None
        arrays, problem = read_blocks(reply, self.shapes)
        problem = problem or reply_problem(arrays, reply.num_examples, list(self.shapes))
        tau = reply.metrics.get(LOCAL_STEPS)
        problem = problem or local_steps_problem(tau)
        if problem is not None:
            return None, problem
        steps = int(tau)  # type: ignore[arg-type]
        if steps == 0 and not all(
            np.array_equal(w, x) for w, x in zip(arrays, self.x, strict=True)
        ):
            return None, "local_steps is 0 but the parameters changed"
        return (arrays, int(reply.num_examples), steps), None

    def fold(
        self,
        replies: list[tuple[Incoming, tuple[NDArrays, int, int]]],
        server_round: int,
        tally: Tally,
    ) -> list[bool]:
        """Keep every admitted reply for the update (in key order)."""
        self._folded = [read for _, read in replies]
        return [True] * len(replies)

    def finish(self, server_round: int) -> tuple[dict[str, Scalar], bool]:
        """X' = x - tau_eff * sum_i p_i (x - w_i) / tau_i; report tau_eff."""
        assert self.x is not None
        replies, self._folded = self._folded, []
        self.x, tau_eff = normalized_average(self.x, replies)
        return {TAU_EFF: tau_eff, NUM_REPLIES: len(replies)}, False

    def discard(self) -> dict[str, Scalar]:
        """Close a round without a usable reply: x unchanged."""
        self._folded = []
        return {}

    def evict(self, keys: list[str]) -> int:
        """FedNova holds nothing per client."""
        return 0

    def configuration(self) -> dict[str, Any]:
        """Return the strategy's name (JSON; fingerprinted)."""
        return {"strategy": self.label}

    def state_dict(self) -> tuple[dict[str, NDArray[Any]], dict[str, Any]]:
        """Return x (float64)."""
        assert self.x is not None
        return {f"x.{j}": t for j, t in enumerate(self.x)}, {}

    def load_state_dict(
        self, arrays: dict[str, NDArray[Any]], manifest: dict[str, Any], layout: Layout
    ) -> None:
        """Restore x, checked against the layout's shapes."""
        x = [np.asarray(arrays[f"x.{j}"], dtype=np.float64) for j in range(len(layout.shapes))]
        if tuple(t.shape for t in x) != layout.shapes:
            raise ValueError("x: shapes differ from the layout's")
        self.x, self.shapes = x, layout.shapes
