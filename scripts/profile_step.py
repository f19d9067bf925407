"""Profile `ConsensusADMM.step` at 1e6 parameters, 10 of 100 clients (cProfile).

    python scripts/profile_step.py            # [--relaxed] for alpha 1.6 and RB

Runs 10 rounds to cache every client, then profiles 4 rounds of 10 fresh replies and
prints the functions by their own time. A lab tool, not a benchmark: the ratios of
`benchmarks.server_cost` are the measured figures.
"""

from __future__ import annotations

import cProfile
import pstats
import sys

import numpy as np

from flwr_admm.core import ConsensusADMM, ResidualBalancing
from flwr_admm.core.types import Reply

P, CLIENTS, SAMPLED = 10**6, 100, 10


def main(relaxed: bool) -> None:
    """Warm the state up, then print the profile of four rounds."""
    extra = {"relaxation": 1.6, "schedule": ResidualBalancing()}
    admm = ConsensusADMM([np.zeros(P)], rho=1.0, **(extra if relaxed else {}))  # type: ignore[arg-type]
    rng = np.random.default_rng(0)
    pool = [rng.normal(size=P) for _ in range(2 * SAMPLED)]

    def round_of(k: int) -> None:
        first = SAMPLED * (k % (CLIENTS // SAMPLED))
        keys = range(first, first + SAMPLED)
        admm.step([Reply(f"c{i}", [pool[(i + k) % len(pool)].copy()], 10) for i in keys], k + 1)

    for k in range(CLIENTS // SAMPLED):
        round_of(k)
    profile = cProfile.Profile()
    profile.enable()
    for k in range(CLIENTS // SAMPLED, CLIENTS // SAMPLED + 4):
        round_of(k)
    profile.disable()
    pstats.Stats(profile).sort_stats("tottime").print_stats(12)


if __name__ == "__main__":
    main("--relaxed" in sys.argv)
