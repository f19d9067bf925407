"""FedADMM's linearized form under PyTorch: the step budget b_i of the user's own loop.

`TorchADMM` runs the form (`flwr_admm.core.linearized`) and adds <y_i, w> to the
user's loss, so the optimizer sees grad f_i + y_i through its momentum or
preconditioner; `Budget` counts b_i (rho_i = 1 / b_i) over the optimizer's steps. The
fitted budget is exactly K lr for plain SGD. A loop that stepped but never added the
linear term is refused at the reply: its y_i would be silently dropped.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

__all__ = ["Budget"]


@dataclass
class Budget:
    """The linearized form's step budget b_i, counted over the user's optimizer steps.

    `sgd` sums lr (1 - dampening) / (1 - momentum) per `torch.optim.SGD` step (the
    parameter-weighted mean over its groups); for any other optimizer `gradients`
    sums the gradients it stepped on, and `value` fits K <w_0 - w_K, G> / ||G||^2.
    """

    params: list[torch.Tensor]  # the penalized (trainable) parameters, found once
    start: list[torch.Tensor]  # w_0, for the fitted budget
    ids: frozenset[int]  # id() of each of `params`, to find them in param groups
    steps: int = 0
    sgd: float = 0.0
    gradients: list[torch.Tensor] | None = None
    linear_used: bool = False

    @classmethod
    def of(cls, params: Sequence[torch.Tensor]) -> Budget:
        """Start counting over `params`, from their current values (w_0)."""
        return cls(list(params), [p.detach().clone() for p in params], frozenset(map(id, params)))

    def step(self, optimizer: torch.optim.Optimizer) -> None:
        """Count one optimizer step."""
        self.steps += 1
        if type(optimizer) is torch.optim.SGD and self.gradients is None:
            self.sgd += _sgd_step(optimizer, self.ids)
            return
        if self.gradients is None:  # a non-SGD optimizer: fit the budget instead
            self.gradients = [torch.zeros_like(p) for p in self.params]
        with torch.no_grad():
            for total, p in zip(self.gradients, self.params, strict=True):
                if p.grad is not None:
                    total += p.grad

    def value(self) -> float:
        """Return b_i; ValueError when it cannot be trusted (see `TorchADMM.step_budget`)."""
        if self.steps == 0:
            raise ValueError(
                "step_budget: no optimizer step was counted; call admm.after_step(optimizer) "
                "after every optimizer.step() under the linearized form"
            )
        if not self.linear_used:
            raise ValueError(
                "penalty_term: the linearized form adds <y_i, w> to the loss; add "
                "admm.penalty_term() to every minibatch's loss (it was never called)"
            )
        if self.gradients is None:
            return self.sgd
        with torch.no_grad():
            moved = sum(
                float(torch.sum((w0 - p) * g))
                for w0, p, g in zip(self.start, self.params, self.gradients, strict=True)
            )
            size = sum(float(torch.sum(g * g)) for g in self.gradients)
        budget = self.steps * moved / size if size > 0 else math.nan
        if not (math.isfinite(budget) and budget > 0):
            raise ValueError(
                f"step_budget: the fitted budget K <w_0 - w_K, G> / ||G||^2 is {budget!r}, "
                "not > 0 (the steps did not descend along the gradients)"
            )
        return budget


def _sgd_step(optimizer: torch.optim.Optimizer, ids: frozenset[int]) -> float:
    """Return one SGD step's budget: the size-weighted mean of lr (1 - d) / (1 - mu)."""
    total, size = 0.0, 0
    for group in optimizer.param_groups:
        count = sum(p.numel() for p in group["params"] if id(p) in ids)
        momentum = float(group.get("momentum", 0.0))
        damped = 1.0 - float(group.get("dampening", 0.0)) if momentum > 0 else 1.0
        total += count * float(group["lr"]) * damped / (1.0 - momentum)
        size += count
    return total / size if size else 0.0
