"""Where a client's local solve starts: its own last w_i, the center v_i, or z.

``local_init`` (`ADMMClient`, `flwr_admm.clientapp.ADMMTrainStep.start`,
`flwr_admm.torch.TorchADMM.start`):

- "previous": the client's own last w_i (kept in ``context.state``), the warm start;
- "center": v_i = z - u_i, the center of the penalty;
- "consensus": the received z, as FedDyn's clients start (client-held duals only:
  server-held FedADMM sends v_i, never z);
- "auto" (the default): "consensus" under client-held duals, "previous" otherwise.

Under FedAvg, FedProx and rho = 0 every start is the received model.
"""

from __future__ import annotations

from typing import Literal

__all__ = ["LOCAL_INITS", "LocalInit", "resolved_init"]

LocalInit = Literal["auto", "previous", "center", "consensus"]
LOCAL_INITS = ("auto", "previous", "center", "consensus")


def resolved_init(local_init: str, client_held: bool) -> str:
    """Return the start `local_init` means: "auto" is "consensus" where z is received.

    Under client-held duals (`FedADMMClientDuals`, which sends z) "auto" starts at z,
    FedDyn's start, measured better or equal on every case of
    ``python -m benchmarks.client_start`` but one (one round more of 70); under
    server-held duals (v_i only) "auto" is "previous", the client's own last w_i.
    """
    if local_init == "auto":
        return "consensus" if client_held else "previous"
    return local_init
