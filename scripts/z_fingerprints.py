"""Print a SHA-256 of z and the residuals over 8 rounds of a few ConsensusADMM scenarios.

Run it before and after a change to the server's arithmetic that must keep every bit:

    python scripts/z_fingerprints.py > before.txt   # on the old commit
    python scripts/z_fingerprints.py | diff before.txt -

The model has a tensor of 300,000 values (three BLOCKs of the kernels) and a small
one; replies are deterministic functions of each client's center.
"""

from __future__ import annotations

import hashlib
from typing import Any

import numpy as np

from flwr_admm.core import AdaptiveDualStep, ConsensusADMM, ResidualBalancing
from flwr_admm.core.types import Reply

SHAPES = [(300_000,), (7, 3)]
SCENARIOS: dict[str, dict[str, Any]] = {
    "plain": {"rho": 1.0},
    "relaxed-RB": {"rho": 1.0, "relaxation": 1.6, "schedule": ResidualBalancing()},
    # FedADMM(form="prox")'s: rho0 0.1, residual balancing, the adaptive dual step
    "defaults": {"rho": 0.1, "schedule": ResidualBalancing(), "dual_step": AdaptiveDualStep()},
}


def fingerprint(settings: dict[str, Any], partial: bool) -> str:
    """Return the first 16 hex digits of the hash of z and (r, s, ||y||, rho') per round."""
    admm = ConsensusADMM([np.zeros(s) for s in SHAPES], **settings)
    rng = np.random.default_rng(1)
    target = [rng.normal(size=s) for s in SHAPES]
    digest = hashlib.sha256()
    for k in range(8):
        chosen = sorted(rng.choice(6, 3, replace=False)) if partial else range(6)
        replies = []
        for i in chosen:
            center = admm.center(f"c{i}")
            w = [
                0.5 * c + 0.5 * (i + 1) * g / 6 + 0.01 * rng.normal(size=c.shape)
                for c, g in zip(center, target, strict=True)
            ]
            replies.append(Reply(f"c{i}", w, 10 + int(i)))
        report = admm.step(replies, k + 1)
        for t in admm.z:
            digest.update(t.tobytes())
        values = [report.primal_residual, report.dual_residual, report.dual_scale, report.next_rho]
        digest.update(np.array(values).tobytes())
    return digest.hexdigest()[:16]


if __name__ == "__main__":
    for name, settings in SCENARIOS.items():
        for partial in (False, True):
            print(name, "partial" if partial else "full", fingerprint(settings, partial))
