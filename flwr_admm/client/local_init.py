"""Where a client's local solve starts: its own last w_i, the center v_i, or z.

``local_init`` (`ADMMClient`, `flwr_admm.clientapp.ADMMTrainStep.start`,
`flwr_admm.torch.TorchADMM.start`):

- "previous": the client's own last w_i (kept in ``context.state``), the warm start;
- "center": v_i = z - u_i, the center of the penalty;
- "consensus": the received z, as FedDyn's and SCAFFOLD's clients start (sent by
  `FedADMMClientDuals` and, under ``admm-start``, by the Message-API `FedADMM`);
- "auto" (the default): "consensus" wherever z is received, else "previous".

Under FedAvg, FedProx and rho = 0 every start is the received model.
"""

from __future__ import annotations

from typing import Literal

__all__ = ["LOCAL_INITS", "LocalInit", "resolved_init"]

LocalInit = Literal["auto", "previous", "center", "consensus"]
LOCAL_INITS = ("auto", "previous", "center", "consensus")


def resolved_init(local_init: str, z_received: bool) -> str:
    """Return the start `local_init` means: "auto" is "consensus" where z is received.

    A solve started at the far center v_i = z - u_i drifts away from z by about its
    plain local drift d_i, so the next dual u_i ~ d_i - mean(d) puts the next start
    opposite that drift: with momentum SGD on a CNN the gain per round exceeds 1 and
    the run diverges (docs/torch.md). Started at z the dual only corrects. Under
    client-held duals z is also FedDyn's start, measured better or equal on every case
    of ``python -m benchmarks.client_start`` but one (one round more of 70). Where no z
    is received (the legacy server-held API) "auto" is "previous", the own last w_i.
    """
    if local_init == "auto":
        return "consensus" if z_received else "previous"
    return local_init
