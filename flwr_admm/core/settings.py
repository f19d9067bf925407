"""The consensus-ADMM settings a server strategy is built with, checked once, and its defaults."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

import numpy as np

from flwr_admm.core.consensus import ConsensusADMM
from flwr_admm.core.regularizers import Regularizer
from flwr_admm.core.schedules import (
    AdaptiveDualStep,
    Constant,
    DualStep,
    ResidualBalancing,
    RhoSchedule,
    check_dual_step_spec,
    make_schedule,
)
from flwr_admm.core.steps import ZAverage
from flwr_admm.core.types import Arrays, ClientRho

__all__ = [
    "DEFAULT_DUAL_STEP",
    "DEFAULT_RELAXATION",
    "DEFAULT_RHO",
    "TEXTBOOK",
    "ConsensusSettings",
    "describe_step",
    "given_rho",
    "schedule_of",
    "strategy_defaults",
]

# Defaults of the FedADMM strategies (not of the core), chosen on a CNN trained by
# momentum SGD on minibatches (`python -m benchmarks.cnn`) and checked on the convex tasks
# (`python -m benchmarks.defaults`, docs/tuning.md): over-relaxation speeds up
# full-batch convex runs but blows up the CNN. With rho = 0 the schedule is Constant.
DEFAULT_RHO = 0.1
DEFAULT_RELAXATION = 1.0
# gamma from 0.2, raised while the replies' residuals keep pointing along their duals
# (deterministic local solves), kept at 0.2 under minibatch noise (`core.schedules`)
DEFAULT_DUAL_STEP: DualStep = AdaptiveDualStep()
# The textbook iteration: constant rho, alpha = 1, gamma = 1.
TEXTBOOK: Mapping[str, Any] = MappingProxyType(
    {"rho_schedule": Constant(), "relaxation": 1.0, "dual_step": 1.0}
)


@dataclass(frozen=True)
class ConsensusSettings:
    """Settings of a `ConsensusADMM` server, validated together when built.

    The fields are `ConsensusADMM`'s parameters (``rho_schedule`` is its ``schedule``;
    `schedule_of` turns a name or None into one). rho, relaxation, dual_step,
    start_momentum and start_steady (or None) are kept as floats.

    Raises
    ------
    ValueError
        Naming the field and its allowed values.

    """

    rho: float = 1.0
    rho_schedule: RhoSchedule = field(default_factory=Constant)
    regularizer: Regularizer | None = None
    client_rho: ClientRho = "uniform"
    eps_abs: float = 1e-6
    eps_rel: float = 1e-4
    relaxation: float = 1.0
    z_average: ZAverage = "cached"
    dual_step: DualStep = 1.0
    start_momentum: float = 0.0
    start_steady: float | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.rho_schedule, RhoSchedule):
            raise ValueError(
                f"rho_schedule: must be a RhoSchedule or a schedule name, got {self.rho_schedule!r}"
            )
        if self.regularizer is not None and not isinstance(self.regularizer, Regularizer):
            raise ValueError(
                f"regularizer: must be L1(...), L2(...) or None, got {self.regularizer!r}"
            )
        # Build once: the core checks rho, client_rho, eps, relaxation and their combination.
        self.new_admm([np.zeros(1)])
        object.__setattr__(self, "rho", float(self.rho))
        object.__setattr__(self, "relaxation", float(self.relaxation))
        object.__setattr__(self, "dual_step", check_dual_step_spec(self.dual_step))
        object.__setattr__(self, "start_momentum", float(self.start_momentum))
        if self.start_steady is not None:
            object.__setattr__(self, "start_steady", float(self.start_steady))

    def new_admm(self, z: Arrays) -> ConsensusADMM:
        """Start a fresh numpy core at consensus `z` with these settings."""
        return ConsensusADMM(
            z,
            self.rho,
            self.rho_schedule,
            self.regularizer,
            self.client_rho,
            self.eps_abs,
            self.eps_rel,
            self.relaxation,
            z_average=self.z_average,
            dual_step=self.dual_step,
            start_momentum=self.start_momentum,
            start_steady=self.start_steady,
        )

    def describe(self) -> dict[str, Any]:
        """Return the settings as JSON: schedule and regularizer by their `describe`."""
        return {
            "rho": self.rho,
            "rho_schedule": self.rho_schedule.describe(),
            "regularizer": None if self.regularizer is None else self.regularizer.describe(),
            "client_rho": self.client_rho,
            "eps_abs": self.eps_abs,
            "eps_rel": self.eps_rel,
            "relaxation": self.relaxation,
            # only when set: checkpoints written before the option keep their fingerprint
            **({} if self.z_average == "cached" else {"z_average": self.z_average}),
            **({} if self.dual_step == 1.0 else {"dual_step": describe_step(self.dual_step)}),
            **({} if self.start_momentum == 0.0 else {"start_momentum": self.start_momentum}),
            **({} if self.start_steady is None else {"start_steady": self.start_steady}),
        }


def describe_step(step: DualStep) -> float | dict[str, Any]:
    """Return a dual step as JSON: the number, or the rule's `describe`."""
    return step.describe() if isinstance(step, AdaptiveDualStep) else step


def strategy_defaults(
    rho: object, rho_schedule: RhoSchedule | str | None, relaxation: float | None
) -> tuple[RhoSchedule, float]:
    """Return the schedule and alpha a strategy uses when given None for them.

    rho > 0: `ResidualBalancing()` and DEFAULT_RELAXATION; rho = 0 (FedAvg, exactly):
    `Constant()` and 1. Given values pass through (`schedule_of` for the schedule).
    """
    penalized = isinstance(rho, int | float) and not isinstance(rho, bool) and rho > 0
    if rho_schedule is None:
        schedule: RhoSchedule = ResidualBalancing() if penalized else Constant()
    else:
        schedule = schedule_of(rho_schedule)
    if relaxation is None:
        relaxation = DEFAULT_RELAXATION if penalized else 1.0
    return schedule, relaxation


def given_rho(rho: float | None, proximal_mu: float | None) -> float:
    """Return the penalty rho a strategy was given as ``rho`` or as ``proximal_mu``.

    ``proximal_mu`` is FedProx's name for it, so that a FedProx call site runs
    unchanged. Neither given: DEFAULT_RHO. The value is checked by `ConsensusSettings`.

    Raises
    ------
    ValueError
        If both are given and differ, naming both.

    """
    if rho is None:
        return DEFAULT_RHO if proximal_mu is None else proximal_mu
    if proximal_mu is not None and proximal_mu != rho:
        raise ValueError(
            f"rho, proximal_mu: two names of one penalty (proximal_mu is FedProx's name "
            f"for rho); give one, or equal values, got rho={rho!r}, proximal_mu={proximal_mu!r}"
        )
    return rho


def schedule_of(rho_schedule: RhoSchedule | str | None) -> RhoSchedule:
    """Return the schedule a strategy's ``rho_schedule`` keyword names.

    A name goes through `make_schedule`, None is `Constant()`; anything else is
    returned as it is (`ConsensusSettings` refuses what is not a `RhoSchedule`).
    """
    if isinstance(rho_schedule, str):
        return make_schedule(rho_schedule)
    return Constant() if rho_schedule is None else rho_schedule
