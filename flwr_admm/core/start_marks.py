"""Which clients solve the ADMM step from z, read from their replies' START_MARK.

Our client helpers (`TorchADMM`, `ADMMTrainStep`, `ADMMClient`) mark every FedADMM
reply with ``admm-started-at-z``: 1 when the local solve started at the received z,
0 when it started elsewhere (its own last w_i, or v_i, as asked). A reply without the
mark comes from a stock FedProx handler, which starts at the received center
v_i = z - u_i and uses it as its prox center. Started there, w_i ~ v_i + d_i (d_i the
node's plain local drift), so the next dual u_i ~ d_i - mean(d) puts the next start
opposite that drift: with momentum SGD on a CNN the gain per round exceeds 1 and the
run diverges (docs/torch.md). Such a client's dual is therefore held at 0: its center
is z and its step FedProx's. The server sends z next to the center to the clients
whose last reply said they start there (the legacy API, where z costs a second block
of tensors that a stock NumPyClient would not expect).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from flwr_admm.core.consensus import ConsensusADMM
from flwr_admm.protocol import START_MARK

__all__ = ["StartMarks"]


@dataclass
class StartMarks:
    """The marks of one strategy's clients: stock ones this round, those starting at z.

    Attributes
    ----------
    stock : set of str
        Keys whose reply this round carried no mark (with rho > 0).
    at_z : set of str
        Keys whose last accepted reply started at z (mark 1).
    warned : set of str
        Stock keys already logged.

    """

    stock: set[str] = field(default_factory=set)
    at_z: set[str] = field(default_factory=set)
    warned: set[str] = field(default_factory=set)

    def begin(self) -> None:
        """Open a round: no stock reply seen yet."""
        self.stock = set()

    def read(self, key: str, metrics: Mapping[str, Any], rho: float) -> None:
        """Note the mark of `key`'s reply (a FedADMM round with rho > 0 only)."""
        if rho <= 0:
            return
        mark = metrics.get(START_MARK)
        if mark is None:
            self.stock.add(key)
        if mark == 1:
            self.at_z.add(key)
        else:
            self.at_z.discard(key)

    def settle(self, admm: ConsensusADMM, warn: Callable[[str], None]) -> int:
        """Hold the stock clients' duals at 0 (after the round); warn once per key.

        Returns how many replies of the round were stock ones.
        """
        held = admm.reset_duals(self.stock)
        for key in sorted(set(held) - self.warned):
            warn(
                f"{key} replied without {START_MARK!r} (a stock FedProx handler, which "
                "starts at its center): its dual is held at 0, so it runs FedProx's step "
                "around z; flwr_admm.torch.TorchADMM or flwr_admm.clientapp.ADMMTrainStep "
                "run the ADMM step"
            )
            self.warned.add(key)
        return len(self.stock)

    def forget(self, keys: set[str]) -> None:
        """Drop evicted keys."""
        self.at_z -= keys
        self.warned -= keys
