"""One FedADMM round at a node, in the form and dual mode its config names.

The round is `flwr_admm.serverapp.FedADMM`'s. `NodeRound.open` reads the node's part
(prox form: center v_i and rho, FedProx's mu alone is FedProx, neither is FedAvg;
linearized form: z and y_i; client-held duals: `flwr_admm.node.duals`), the caller runs
its own local loop, and `NodeRound.close` builds the wire-neutral `Reply`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
from flwr.common import RecordDict, Scalar

from flwr_admm.core.linearized import check_form, scale_of_budget
from flwr_admm.core.types import Arrays
from flwr_admm.node.config import client_held, read_rho
from flwr_admm.node.duals import DualsRound
from flwr_admm.node.reply import Reply
from flwr_admm.node.start import start_of
from flwr_admm.protocol import DUAL_RECORD, FORM, RHO, START_MARK, STEP_BUDGET
from flwr_admm.uplink.compression import Compressor

__all__ = ["NodeRound", "budget_given", "start_mark"]


def budget_given(step_budget: float | None) -> float:
    """Return the linearized form's b_i; ValueError naming ``step_budget`` unless > 0."""
    if step_budget is None:
        raise ValueError(
            "step_budget: the linearized form needs the local step budget "
            "K lr (K lr / (1 - momentum) with momentum SGD): rho_i = 1 / b_i"
        )
    scale_of_budget(step_budget, "step_budget")  # ValueError unless finite and > 0
    return float(step_budget)


def start_mark(admm: bool, at_z: bool) -> dict[str, Scalar]:
    """Return a prox-form reply's ``admm-started-at-z`` (FedADMM only; 1: started at z).

    A FedADMM reply without it comes from a stock FedProx handler, whose dual the
    server holds at 0 (`flwr_admm.rounds.fedadmm.StartMarks`).
    """
    return {START_MARK: int(at_z)} if admm else {}


@dataclass(frozen=True)
class NodeRound:
    """What one FedADMM round gives a node: center, rho, start, and how to reply.

    Attributes
    ----------
    center : list of array
        v_i: the received center, or z^k - u_i under client-held duals; z under the
        linearized form.
    rho : float
        rho_i (``rho``, else FedProx's mu, else 0; 0 under the linearized form).
    admm : bool
        The server is FedADMM in the prox form (``rho`` in the config).
    server_round : int or None
        The round of the config.
    previous : list of array or None
        The node's own last w_i: the warm start given to `open`, or the w_i of the
        acknowledged state under client-held duals.
    consensus : list of array or None
        The received z, where ``init="consensus"`` starts; None when none came.
    form : {"prox", "linearized"}
        ``admm-form`` of the config.
    correction : list of array or None
        y_i under the linearized form (received, or u_i / b_i kept here).
    duals : DualsRound or None
        Under client-held duals: the acknowledged state and the updated dual.

    """

    center: Arrays
    rho: float
    admm: bool
    server_round: int | None
    previous: Arrays | None = None
    consensus: Arrays | None = None
    form: str = "prox"
    correction: Arrays | None = None
    duals: DualsRound | None = None

    @classmethod
    def open(
        cls,
        received: Arrays,
        config: Mapping[str, Any],
        records: RecordDict,
        *,
        second: Arrays | None = None,
        previous: Arrays | None = None,
        server_round: int | None = None,
    ) -> NodeRound:
        """Read one round: `received` the model block, `second` its companion (z or y_i).

        `records` is ``context.state`` (client-held duals keep their states there),
        `previous` the node's warm start under server-held duals.
        """
        rho, form, admm = read_rho(config), check_form(config.get(FORM, "prox")), RHO in config
        if client_held(config):
            if rho <= 0 or server_round is None:
                raise ValueError(
                    "rho: client-held duals need rho > 0 and an integer server round, "
                    f"got rho={rho!r}, server round={server_round!r}"
                )
            duals = DualsRound.open(records, received, config, server_round)
            linear = form == "linearized"  # from z^k, y_i = u_i / b_i kept by the node
            return cls(
                center=received if linear else duals.center,  # z^k - u_i
                rho=rho,
                admm=admm,
                server_round=server_round,
                previous=None if duals.own is None else duals.own.w,  # restored: no w_i
                consensus=received,
                form=form,
                correction=duals.correction if linear else None,
                duals=duals,
            )
        if form == "linearized":  # z, then y_i; no prox term
            if second is None:
                raise ValueError(f"{DUAL_RECORD}: the linearized form sends y_i next to z")
            return cls(received, 0.0, False, server_round, previous, received, form, second)
        return cls(received, rho, admm, server_round, previous, consensus=second)  # z: admm-start

    def start(self, init: str | None = None) -> tuple[Arrays, bool]:
        """Return where the local solve starts (copies), and whether `init` starts at z."""
        source, at_z = start_of(
            init,
            form=self.form,
            admm=self.admm,
            rho=self.rho,
            center=self.center,
            previous=self.previous,
            consensus=self.consensus,
        )
        return [t.copy() for t in source], at_z

    def close(
        self,
        w: Arrays,
        num_examples: int,
        *,
        at_z: bool = False,
        step_budget: float | None = None,
        compressor: Compressor | None = None,
        rng: np.random.Generator | None = None,
    ) -> Reply:
        """Return the reply to this round from the trained w_i.

        `at_z`: the solve started at z by its ``init`` (START_MARK, server-held prox
        form); `step_budget`: b_i (linearized form, required there); `compressor` and
        `rng`: client-held duals' uplink compression.
        """
        w = [np.asarray(t, dtype=np.float64) for t in w]
        linearized = self.form == "linearized"
        budget = budget_given(step_budget) if linearized else None
        if self.duals is not None:
            reply = self.duals.close(w, num_examples, budget=budget, compressor=compressor, rng=rng)
        else:
            reply = Reply(w, start_mark(self.admm, at_z))
        if budget is not None:
            reply.metrics[STEP_BUDGET] = budget
        return reply
