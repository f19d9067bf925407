"""Client-level differential privacy: local clipping + Gaussian noise, and RDP accounting.

Local DP (the client side of `LocalDP`): with c_i the parameters client i received,

    delta_i  = w_i - c_i
    delta_i <- delta_i * min(1, C / ||delta_i||)          (clip to norm C)
    delta_i <- delta_i + N(0, (sigma C)^2 I)              (secret unless dp_seed is set)

and the client replies c_i + delta_i. One reply is the Gaussian mechanism with noise
multiplier sigma for the whole of the client's data (add/remove one client changes
the clipped update by at most C).

`PrivacyLedger` composes one Poisson-subsampled Gaussian event per round with Flower's
RDP accountant (`flwr.serverapp.RdpAccountant`, backed by Google's dp-accounting):
sampling rate q = sampled clients / population, noise multiplier sigma. It reports
two epsilons at the ledger's delta:

- ``dp_epsilon``: with amplification by sampling, valid against observers who do not
  learn which clients were sampled (e.g. anyone who sees only the released models);
- ``dp_epsilon_unamplified``: q = 1 (no amplification), valid even against the
  server, which knows whom it sampled and sees every reply.

Both treat each released model as a function of that round's noisy replies, the
DP-FedAvg model (McMahan et al. 2018). For FedADMM this is exact only when every
client replies in every round (then sum_i p_i u_i = 0 and z is the weighted mean of
the noisy replies); with partial participation the server reuses cached replies of
absent clients, and ``dp_epsilon`` is an approximation (``dp_epsilon_unamplified``,
which charges every round to every client, still bounds it).

The accountant's backend is the optional ``dp`` extra; without it `LocalDP` still
clips and noises, and a `PrivacyLedger` refuses to start.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from flwr.common import Scalar
from numpy.typing import NDArray

from flwr_admm.protocol import (
    DP_APPLIED,
    DP_APPLIED_CLIP,
    DP_APPLIED_NOISE,
    DP_CLIP,
    DP_DELTA,
    DP_EPSILON,
    DP_EPSILON_UNAMPLIFIED,
    DP_NOISE,
    DP_ROUNDS,
    DP_SAMPLING_RATE,
)

Arrays = list[NDArray[np.float64]]
# Integer orders keep dp-accounting on its closed-form path (fractional orders need a
# series that can fail to converge and then spam warnings).
RDP_ORDERS = tuple(float(a) for a in (*range(2, 129), 160, 192, 256, 384, 512, 1024))


def update_norm(delta: Sequence[NDArray[np.generic]]) -> float:
    """||delta|| over all arrays, as one flat vector."""
    flat = [np.asarray(a, dtype=np.float64).ravel() for a in delta]
    return math.sqrt(sum(float(a @ a) for a in flat))


def clip_update(delta: Sequence[NDArray[np.generic]], clip: float) -> Arrays:
    """Return delta * min(1, clip / ||delta||) (a copy)."""
    norm = update_norm(delta)
    factor = 1.0 if norm <= clip else clip / norm
    return [np.asarray(a, dtype=np.float64) * factor for a in delta]


@dataclass(frozen=True)
class LocalDP:
    """Clip each client's update to norm `clip`, add N(0, (noise_multiplier clip)^2).

    Parameters
    ----------
    clip : float
        Clipping norm C > 0.
    noise_multiplier : float
        sigma >= 0 (0 = clipping only, and no epsilon is reported).
    delta : float
        The delta at which epsilon is reported, in (0, 1).

    """

    clip: float
    noise_multiplier: float
    delta: float = 1e-5

    def __post_init__(self) -> None:
        if not (_is_number(self.clip) and math.isfinite(self.clip) and self.clip > 0):
            raise ValueError(f"clip: must be a finite number > 0, got {self.clip!r}")
        sigma = self.noise_multiplier
        if not (_is_number(sigma) and math.isfinite(sigma) and sigma >= 0):
            raise ValueError(f"noise_multiplier: must be a finite number >= 0, got {sigma!r}")
        if not (_is_number(self.delta) and 0 < self.delta < 1):
            raise ValueError(f"delta: must be a number in (0, 1), got {self.delta!r}")

    def config(self) -> dict[str, Scalar]:
        """Fit-config entries: ``dp-clip`` = C, ``dp-noise`` = sigma."""
        return {DP_CLIP: float(self.clip), DP_NOISE: float(self.noise_multiplier)}

    @classmethod
    def from_config(cls, config: dict[str, Scalar]) -> LocalDP | None:
        """Return the LocalDP a fit config asks for (None without ``dp-clip``)."""
        if DP_CLIP not in config:
            return None
        clip, noise = config[DP_CLIP], config.get(DP_NOISE, 0.0)
        if not (_is_number(clip) and _is_number(noise)):
            raise ValueError(f"{DP_CLIP} / {DP_NOISE}: must be numbers, got {clip!r}, {noise!r}")
        return cls(float(clip), float(noise))  # type: ignore[arg-type]

    def attestation(self) -> dict[str, Scalar]:
        """Reply metrics of a client that applied this: ``admm-dp-applied`` = 1, C, sigma."""
        return {
            DP_APPLIED: 1,
            DP_APPLIED_CLIP: float(self.clip),
            DP_APPLIED_NOISE: float(self.noise_multiplier),
        }

    def attestation_problem(self, metrics: Mapping[str, Any]) -> str | None:
        """Why a reply's metrics do not attest this clipping and noise (None: they do).

        A reply without ``admm-dp-applied`` = 1, or with another C or sigma, is an
        update the privacy ledger cannot account for: the server must not fold it.
        """
        applied = metrics.get(DP_APPLIED)
        if not (_is_number(applied) and applied == 1):
            return (
                f"no local-DP attestation ({DP_APPLIED} = {applied!r}): the strategy asks "
                "for local DP, which this client did not apply; the reply is not folded"
            )
        used = (metrics.get(DP_APPLIED_CLIP), metrics.get(DP_APPLIED_NOISE))
        if used != (float(self.clip), float(self.noise_multiplier)):
            return (
                f"{DP_APPLIED_CLIP} / {DP_APPLIED_NOISE} = {used}, the strategy asks for "
                f"clip {self.clip} and noise multiplier {self.noise_multiplier}"
            )
        return None

    def privatize(self, delta: Sequence[NDArray[np.generic]], rng: np.random.Generator) -> Arrays:
        """Clip `delta` to norm C, then add N(0, (sigma C)^2) to every coordinate."""
        clipped = clip_update(delta, self.clip)
        std = self.noise_multiplier * self.clip
        if std == 0.0:
            return clipped
        return [a + rng.normal(0.0, std, size=a.shape) for a in clipped]


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _require_dp_accounting() -> None:
    """Import Flower's RDP backend, or raise an ImportError naming the ``dp`` extra."""
    try:
        import dp_accounting  # noqa: F401
    except ImportError as error:
        raise ImportError(
            "PrivacyLedger: Flower's RDP accountant needs the dp-accounting package, "
            'which is not installed: pip install -e ".[dp]" in the flwr-admm checkout'
        ) from error


class PrivacyLedger:
    """RDP accountant for per-round sampled Gaussian releases (module docstring).

    Call `record(sample_size, population)` once per aggregated round.

    Parameters
    ----------
    noise_multiplier : float
        sigma > 0 of every release.
    delta : float
        Target delta of the reported epsilon.

    """

    def __init__(self, noise_multiplier: float, delta: float) -> None:
        if not (_is_number(noise_multiplier) and noise_multiplier > 0):
            raise ValueError(f"noise_multiplier: must be > 0, got {noise_multiplier!r}")
        _require_dp_accounting()  # fail when configured, not after the first round
        self.noise_multiplier, self.delta = float(noise_multiplier), float(delta)
        self._population: int | None = None
        self._amplified: Any = None
        self._unamplified: Any = None
        self._last_rate = 0.0

    def _accountants(self, population: int) -> tuple[Any, Any]:
        from flwr.serverapp import (
            NeighboringRelation,
            PrivacyConfig,
            RdpAccountant,
            SamplingMethod,
        )

        logging.getLogger("absl").setLevel(logging.ERROR)
        relation = NeighboringRelation.ADD_OR_REMOVE_ONE

        def make(method: Any) -> Any:
            return RdpAccountant(
                PrivacyConfig(self.delta, population, relation, method), orders=RDP_ORDERS
            )

        return make(SamplingMethod.POISSON), make(SamplingMethod.NO_AMPLIFICATION)

    def record(self, sample_size: int, population: int) -> None:
        """Compose one round: q = sample_size / population (the first population is kept)."""
        from flwr.serverapp import GaussianPrivacyEvent

        if population < 1 or sample_size < 1:
            return
        if self._population is None:
            self._population = population
            self._amplified, self._unamplified = self._accountants(population)
        pop = self._population
        size = min(pop, max(1, round(sample_size * pop / population)))
        self._last_rate = size / pop
        self._amplified.compose(GaussianPrivacyEvent(self.noise_multiplier, size, pop))
        self._unamplified.compose(GaussianPrivacyEvent(self.noise_multiplier, pop, pop))

    @property
    def rounds(self) -> int:
        """Rounds composed so far."""
        return 0 if self._amplified is None else int(self._amplified.num_releases)

    def epsilon(self, amplified: bool = True) -> float:
        """Cumulative epsilon at `delta` (0 before the first round)."""
        accountant = self._amplified if amplified else self._unamplified
        return 0.0 if accountant is None else float(accountant.get_epsilon(self.delta))

    def metrics(self) -> dict[str, Scalar]:
        """Return the ledger's metrics after the last recorded round."""
        return {
            DP_EPSILON: self.epsilon(True),
            DP_EPSILON_UNAMPLIFIED: self.epsilon(False),
            DP_DELTA: self.delta,
            DP_SAMPLING_RATE: self._last_rate,
            DP_ROUNDS: self.rounds,
        }

    def state_dict(self) -> dict[str, Any]:
        """JSON state (Flower's accountant ledgers) for checkpoints."""
        if self._amplified is None:
            return {}
        return {
            "population": self._population,
            "amplified": self._amplified.state_dict(),
            "unamplified": self._unamplified.state_dict(),
            "last_rate": self._last_rate,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore `state_dict` output."""
        if not state:
            return
        self._population = int(state["population"])
        self._amplified, self._unamplified = self._accountants(self._population)
        self._amplified.load_state_dict(state["amplified"])
        self._unamplified.load_state_dict(state["unamplified"])
        self._last_rate = float(state["last_rate"])
