"""The linearized ("Scaffnew", ProxSkip) form of consensus ADMM: settings and step budgets.

Mishchenko et al. (ICML 2022) run consensus ADMM with the prox step replaced by K_i
plain gradient steps from the server's point, and the penalty fixed by the step
budget b_i = K_i lr_i instead of being a knob. Client i receives z and its dual y_i:

    w_i  <- w_i - lr_i (grad f_i(w_i) + y_i)     K_i steps from w_i = z, no prox term
    rho_i = 1 / b_i,  b_i = K_i lr_i             (the client reports b_i)
    z'    = sum_i n_i (rho_i w_i + y_i) / sum_i n_i rho_i
    y_i  += rho_i (w_i - z')                     (replying clients)

y_i enters every local step as the linear term of f_i(w) + <y_i, w>. The server step
is `ConsensusADMM`'s with rho = 1 and rho_i = s_i = 1 / b_i (``client_rho="reported"``);
only what is sent (z and y_i instead of v_i = z - y_i / rho_i) and where rho_i comes
from differ. The dual step keeps sum_i n_i y_i = 0, so with every client replying
z' = sum_i n_i rho_i w_i / sum_i n_i rho_i, the n-weighted mean when the b_i are equal
(under partial participation too with ``z_average="replies"``).

SCAFFOLD option II with server step 1 (`flwr_admm.rounds.scaffold`) is this iteration
exactly when every client replies every round with the same b_i, with
p_i = n_i / sum_j n_j and y_i = c - c_i. By induction: both start at 0; SCAFFOLD's step
g - c_i + c is g + y_i, x' = sum_i p_i y_i^loc is z', and
c_i+ - c+ = (c_i - c) - (y_i^loc - x') / (K lr), i.e. y_i' = y_i + rho (w_i - z').

With heavy-ball momentum mu a step moves lr / (1 - mu) times the gradient once the
velocity settles, so b_i = K_i lr / (1 - mu) (`step_budget`).

Server steps (`Linearized`; ``form="linearized"`` is ``Linearized()``): the clients
start at x = z + beta (z - z_prev) with a restart test and a steady gate
(`flwr_admm.core.start_momentum`), and the dual step is damped,
y_i += gamma rho_i (w_i - z'); neither moves the fixed point. ``Linearized()`` is
beta 0.9 behind the gate (opened by two rounds in a row whose steps kept their
direction with every client replying, shut by a restart or a partial round; 0 under
client-held duals) with the adaptive gamma
(`flwr_admm.core.schedules`, from 0.2); `LINEARIZED_CONVEX` (beta 0.7 without the
gate, gamma 1) is for full-batch convex clients; `SCAFFNEW` (beta 0, gamma 1) is the
textbook iteration.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from flwr_admm.core.consensus import ConsensusADMM
from flwr_admm.core.regularizers import Regularizer
from flwr_admm.core.schedules import (
    AdaptiveDualStep,
    Constant,
    DualStep,
    check_dual_step_spec,
)
from flwr_admm.core.settings import (
    DEFAULT_DUAL_STEP,
    DEFAULT_RHO,
    ConsensusSettings,
    given_rho,
    strategy_defaults,
)
from flwr_admm.core.start_momentum import check_momentum, check_steady
from flwr_admm.core.steps import ZAverage
from flwr_admm.core.tensor_policy import TensorSplit
from flwr_admm.core.types import Arrays, check_scale
from flwr_admm.protocol import STEP_BUDGET

__all__ = [
    "CLIENT_HELD_FIXED",
    "FORMS",
    "LINEARIZED_CONVEX",
    "SCAFFNEW",
    "STOCK_MU",
    "Form",
    "FormSpec",
    "Linearized",
    "budget_scale",
    "check_form",
    "chosen_form",
    "client_held_steps",
    "dual_tensors",
    "scale_of_budget",
    "step_budget",
    "strategy_settings",
]

Form = Literal["prox", "linearized"]
FORMS: tuple[str, ...] = ("prox", "linearized")


# Chosen on the CNN task (momentum SGD, minibatches; docs/torch.md), where the textbook
# dual step and an ungated momentum start diverge or end far behind, then on the convex
# tasks (docs/tuning.md), where the gated start speeds up full participation
DEFAULT_MOMENTUM = 0.9
DEFAULT_STEADY = 0.9  # the gate: cos(d_k, d_{k-1}) >= 0.9 two rounds in a row
DEFAULT_LINEARIZED_DUAL_STEP: DualStep = AdaptiveDualStep()  # 0.2 upward (`core.schedules`)


@dataclass(frozen=True)
class Linearized:
    """The linearized form with its server steps, for ``FedADMM(form=Linearized(...))``.

    Parameters
    ----------
    momentum : float or None
        beta in [0, 1) of the momentum start with restart: the clients start at
        x = z + beta (z - z_prev) (`flwr_admm.core.start_momentum`); 0: at z. None
        (default): the strategy's, 0.9 with server-held duals (`FedADMM`), 0 with
        client-held ones (`FedADMMClientDuals`, which cannot send a start per node).
    steady : float or None
        tau in (-1, 1) of the momentum's steady gate: it opens after two rounds in a
        row in which every cached client replied (none a stock handler) and the
        round's step kept its direction, cos(d_k, d_{k-1}) >= tau, and holds until a
        restart, a partial round or a stock reply (`flwr_admm.core.start_momentum`);
        None: no gate, the restart test alone.
    dual_step : float or AdaptiveDualStep
        gamma in (0, 1]: y_i += gamma rho_i (w_i - z'); 1 is the textbook step. An
        `AdaptiveDualStep` sets gamma each round (`flwr_admm.core.schedules`; under
        client-held duals from the alignment terms the nodes report, except under
        SecAgg+, where gamma stays at its floor).

    """

    momentum: float | None = None
    dual_step: DualStep = DEFAULT_LINEARIZED_DUAL_STEP
    steady: float | None = DEFAULT_STEADY

    def __post_init__(self) -> None:
        if self.momentum is not None:
            object.__setattr__(self, "momentum", check_momentum(self.momentum, "momentum"))
        object.__setattr__(self, "dual_step", check_dual_step_spec(self.dual_step))
        object.__setattr__(self, "steady", check_steady(self.steady, "steady"))


SCAFFNEW = Linearized(momentum=0.0, dual_step=1.0)  # the textbook iteration
# for full-batch convex clients: the fastest on the convex tasks, diverges on the CNN
LINEARIZED_CONVEX = Linearized(momentum=0.7, dual_step=1.0, steady=None)
FormSpec = Form | Linearized  # what a strategy's ``form`` takes
# FedProx's mu sent to a stock handler under the linearized form, and its rho_i there:
# such a handler replies without a step budget and runs FedProx around z
STOCK_MU = DEFAULT_RHO


def check_form(value: object) -> Form:
    """Return the form `value` names (a `Linearized` is "linearized"); ValueError otherwise."""
    if isinstance(value, Linearized):
        return "linearized"
    if not isinstance(value, str) or value not in FORMS:
        raise ValueError(f"form: must be one of {list(FORMS)} or a Linearized(...), got {value!r}")
    return "linearized" if value == "linearized" else "prox"


def chosen_form(form: FormSpec | None, prox_keywords: Mapping[str, object]) -> FormSpec:
    """Return `form`, or for None `FedADMM`'s default: ``Linearized()``, or "prox".

    "prox" when one of `prox_keywords` (rho, proximal_mu, rho_schedule, relaxation,
    dual_step, regularizer, compressor, local DP: settings of the prox form only) is
    given (not None): asking for one of them asks for that form.
    """
    if form is not None:
        return form
    return "prox" if any(v is not None for v in prox_keywords.values()) else Linearized()


def strategy_settings(
    form: FormSpec,
    given: dict[str, Any],
    *,
    regularizer: Regularizer | None,
    eps_abs: float,
    eps_rel: float,
    relaxation: float | None,
    z_average: ZAverage,
    dual_step: DualStep | None,
    channel: dict[str, object],
) -> ConsensusSettings:
    """Return the core settings a FedADMM strategy's keywords give, in either form.

    `given` holds ``rho``, ``proximal_mu`` and ``rho_schedule``; `channel` the
    ``uplink`` and ``local_dp`` objects. "prox": the strategy defaults
    (`strategy_defaults`, DEFAULT_DUAL_STEP for a None dual step). "linearized" (or a
    `Linearized`): rho = 1, rho_i = 1 / b_i reported (``client_rho="reported"``),
    Constant, and the `Linearized` server steps (``Linearized()`` for the string).

    Raises
    ------
    ValueError
        Naming the field: under "prox" as `ConsensusSettings`; under "linearized" the
        first keyword it fixes that was given (not None).

    """
    if check_form(form) == "prox":
        rho = given_rho(given.get("rho"), given.get("proximal_mu"))
        schedule, alpha = strategy_defaults(rho, given.get("rho_schedule"), relaxation)
        return ConsensusSettings(
            rho=rho,
            rho_schedule=schedule,
            regularizer=regularizer,
            eps_abs=eps_abs,
            eps_rel=eps_rel,
            relaxation=alpha,
            z_average=z_average,
            dual_step=DEFAULT_DUAL_STEP if dual_step is None else dual_step,
        )
    fixed = {**given, "relaxation": relaxation, "dual_step": dual_step}
    fixed.update(regularizer=regularizer, **channel)
    for name, value in fixed.items():
        if value is not None:
            raise ValueError(
                f"{name}: not used with form='linearized' (rho_i = 1 / (K_i lr_i) from "
                "each reply; the dual step and momentum are Linearized(dual_step=..., "
                "momentum=...); no prox term, over-relaxation, regularizer, "
                f"uplink or local DP yet); leave it unset, got {value!r}"
            )
    steps = form if isinstance(form, Linearized) else Linearized()
    beta = DEFAULT_MOMENTUM if steps.momentum is None else steps.momentum
    return ConsensusSettings(
        rho=1.0,
        rho_schedule=Constant(),
        client_rho="reported",
        eps_abs=eps_abs,
        eps_rel=eps_rel,
        z_average=z_average,
        dual_step=steps.dual_step,
        start_momentum=beta,
        start_steady=steps.steady if beta > 0.0 else None,
    )


# what FedADMMClientDuals' keywords must stay at under the linearized form
CLIENT_HELD_FIXED: dict[str, object] = {
    "rho": None,
    "proximal_mu": None,
    "regularizer": None,
    "dual_step": 1.0,
    "uplink": None,
}


def client_held_steps(form: FormSpec, given: Mapping[str, object]) -> tuple[DualStep, float]:
    """Return (dual step, rho = 1) of client-held duals in the linearized form.

    rho_i = 1 / b_i is taken on the nodes, so the state's rho is 1. The momentum start
    is refused: it needs each node's start, which client-held duals do not send
    (``Linearized(momentum=None)``, the default, is 0 here).

    Raises
    ------
    ValueError
        Naming the field: a momentum start, or a keyword of `given` that is not at its
        value in `CLIENT_HELD_FIXED` (rho, the prox-form settings, uplink, ...).

    """
    steps = form if isinstance(form, Linearized) else Linearized()
    if steps.momentum not in (None, 0.0):
        raise ValueError(
            f"momentum: the momentum start needs server-held duals (FedADMM); use "
            f"Linearized(momentum=0.0) with FedADMMClientDuals, got {steps.momentum!r}"
        )
    for name, value in given.items():
        if value != CLIENT_HELD_FIXED[name]:
            raise ValueError(
                f"{name}: not used with form='linearized' under client-held duals (rho_i "
                "= 1 / (K_i lr_i) on each node, the dual step is Linearized(dual_step=...); "
                f"no prox term, regularizer, over-relaxation or uplink); leave it unset, "
                f"got {value!r}"
            )
    return steps.dual_step, 1.0


def step_budget(steps: int, learning_rate: float, momentum: float = 0.0) -> float:
    """Return the step budget b = K lr / (1 - momentum) a client reports (rho_i = 1 / b).

    Raises
    ------
    ValueError
        Naming ``steps`` (an integer >= 1), ``learning_rate`` (finite, > 0) or
        ``momentum`` (in [0, 1)).

    """
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise ValueError(f"steps: must be an integer >= 1, got {steps!r}")
    if isinstance(learning_rate, bool) or not isinstance(learning_rate, int | float):
        raise ValueError(f"learning_rate: must be a finite number > 0, got {learning_rate!r}")
    if not (math.isfinite(learning_rate) and learning_rate > 0):
        raise ValueError(f"learning_rate: must be a finite number > 0, got {learning_rate!r}")
    if isinstance(momentum, bool) or not (isinstance(momentum, int | float) and 0 <= momentum < 1):
        raise ValueError(f"momentum: must be a number in [0, 1), got {momentum!r}")
    return steps * float(learning_rate) / (1.0 - momentum)


def scale_of_budget(value: object, field_name: str) -> float:
    """Return s_i = rho_i = 1 / b_i of a reported budget b_i; ValueError unless finite, > 0."""
    budget = check_scale(value, field_name)
    scale = 1.0 / budget
    if not math.isfinite(scale):
        raise ValueError(f"{field_name}: must be a finite number > 0, got {value!r}")
    return scale


def dual_tensors(admm: ConsensusADMM, held: TensorSplit | None, key: str | None) -> Arrays:
    """Return y_i of client `key` as the full tensor list (zeros if new or not consensus).

    `held`: the split when some tensors are outside the consensus (they carry no dual),
    None when every tensor is a consensus variable.
    """
    record = admm.records.get(key) if key is not None else None
    y = [np.zeros_like(t) for t in admm.z] if record is None else record.y
    if held is None:
        return list(y)
    full = list(held.merge(y))
    for i in held.held:
        full[i] = np.zeros(np.shape(full[i]))
    return full


def budget_scale(metrics: Mapping[str, Any]) -> tuple[float | None, str | None]:
    """Return (s_i = 1 / b_i, None) from a reply's ``admm-step-budget``, or (None, problem)."""
    if STEP_BUDGET not in metrics:
        return None, (
            f"no {STEP_BUDGET!r} in its metrics: the handler did not run FedADMM's "
            "linearized form (a stock FedProx/FedAvg handler, or a helper predating it); "
            "serve it with flwr_admm.clientapp.ADMMTrainStep or make_client_app, or use "
            "form='prox'"
        )
    try:
        return scale_of_budget(metrics[STEP_BUDGET], STEP_BUDGET), None
    except ValueError as error:
        return None, str(error)
