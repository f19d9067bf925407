"""The run-config key ``form``: FedADMM's prox form or its linearized (Scaffnew) form.

``prox`` (default) is the seeds' iteration, configured by ``rho``, ``rho-schedule``,
``relaxation`` and ``dual-step``. The linearized forms take rho_i = 1 / b_i from each
reply's step budget b_i = K_i lr_i and carry their own server steps
(`flwr_admm.core.linearized`): ``linearized`` is `Linearized()` (the adaptive dual
step from 0.2, the gated momentum start, none under client-held duals; chosen on the
CNN task), ``linearized-convex`` is `LINEARIZED_CONVEX` (momentum start 0.7 with
restart, no gate, dual step 1; for full-batch convex clients, server-held duals
only). Those four keys are then fixed by the form, so a value other than their
default is refused rather than ignored. Only ``fedadmm`` and
``fedadmm-client-duals`` have a form; the latter's prox form runs a constant rho > 0
without over-relaxation.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from flwr_admm.core import AdaptiveDualStep, Linearized
from flwr_admm.core.linearized import LINEARIZED_CONVEX
from flwr_admm.core.schedules import make_schedule

if TYPE_CHECKING:
    from .run_config import RunSettings

FORM_STRATEGIES = ("fedadmm", "fedadmm-client-duals")
RECIPES: dict[str, Linearized] = {
    "linearized": Linearized(),
    "linearized-convex": LINEARIZED_CONVEX,
}
FORM_NAMES = ("prox", *RECIPES)
FIXED_BY_FORM = ("rho", "rho-schedule", "relaxation", "dual-step")  # prox-form keys

FORM_DEFAULTS: dict[str, Any] = {"form": "prox"}
FORM_HELP: dict[str, str] = {
    "form": f"one of {list(FORM_NAMES)} (strategy fedadmm or fedadmm-client-duals; the "
    "linearized forms take rho from each client's steps and learning rate)",
}


@dataclass(frozen=True)
class FormSettings:
    """The validated ``form``; `linearized` is None for the prox form."""

    name: str = "prox"

    @property
    def linearized(self) -> Linearized | None:
        """The `Linearized` recipe of a linearized form, None for the prox form."""
        return RECIPES.get(self.name)

    def strategy_kwargs(self, prox: Mapping[str, Any]) -> dict[str, Any]:
        """The strategy's keywords: `prox` (rho, rho_schedule, ...) or ``form=``."""
        recipe = self.linearized
        return dict(prox) if recipe is None else {"form": recipe}


def fedadmm_keywords(settings: RunSettings) -> dict[str, Any]:
    """FedADMM's keywords of the run config, on either API: the prox form's or ``form=``.

    The prox form gets the run config's rho, schedule, relaxation and dual step (the run
    config spells those out).
    """
    prox = {
        "rho": settings.rho,
        "rho_schedule": make_schedule(settings.rho_schedule),
        "relaxation": settings.relaxation,
        "dual_step": AdaptiveDualStep() if settings.dual_step == "adaptive" else settings.dual_step,
    }
    return settings.form.strategy_kwargs(prox)


def form_settings(
    config: Mapping[str, Any], defaults: Mapping[str, Any], strategy: str
) -> FormSettings:
    """Validate ``form`` in `config` against `strategy` and the keys it fixes.

    `defaults` are the app's run-config defaults: a linearized form refuses a prox-form
    key (`FIXED_BY_FORM`) set to anything else, naming it.
    """
    name = config.get("form", FORM_DEFAULTS["form"])
    if not isinstance(name, str) or name not in FORM_NAMES:
        raise ValueError(f"run config 'form': must be {FORM_HELP['form']}, got {name!r}")
    if name == "prox":
        if strategy == "fedadmm-client-duals":
            _check_client_duals(config)
        return FormSettings()
    if strategy not in FORM_STRATEGIES:
        raise ValueError(
            f"run config 'form': only strategies {list(FORM_STRATEGIES)} have a form; "
            f"leave it at 'prox' with strategy={strategy!r}"
        )
    if strategy == "fedadmm-client-duals" and RECIPES[name].momentum not in (None, 0.0):
        raise ValueError(
            f"run config 'form': {name!r} starts with server momentum, which needs "
            "server-held duals (strategy=fedadmm); use form='linearized' with "
            "strategy='fedadmm-client-duals'"
        )
    for key in FIXED_BY_FORM:
        if key in config and config[key] != defaults[key]:
            raise ValueError(
                f"run config {key!r}: fixed by form={name!r} (rho_i = 1 / (K_i lr_i), its "
                f"own server steps); leave it at {defaults[key]!r}, got {config[key]!r}"
            )
    return FormSettings(name)


def _check_client_duals(config: Mapping[str, Any]) -> None:
    """FedADMMClientDuals' prox form: constant rho > 0, no over-relaxation."""
    if config["rho"] == 0.0:
        raise ValueError("run config 'rho': must be > 0 with strategy=fedadmm-client-duals, got 0")
    if config["rho-schedule"] != "constant":
        raise ValueError(
            "run config 'rho-schedule': must be 'constant' with "
            f"strategy=fedadmm-client-duals, got {config['rho-schedule']!r}"
        )
    if config["relaxation"] != 1.0:
        raise ValueError(
            "run config 'relaxation': must be 1 with strategy=fedadmm-client-duals, "
            f"got {config['relaxation']!r}"
        )
