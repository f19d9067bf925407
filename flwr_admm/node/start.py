"""Where a node's local solve starts: its own last w_i, the center v_i, or z.

``local_init`` (`ADMMClient`, `ADMMTrainStep.start`'s and `TorchADMM.start`'s ``init``):

- "previous": the node's own last w_i (kept in ``context.state``), the warm start;
- "center": v_i = z - u_i, the center of the penalty;
- "consensus": the received z, as FedDyn's and SCAFFOLD's clients start (sent by the
  client-held-dual strategies and, under ``admm-start``, by `FedADMM`);
- "auto" (the default): "consensus" wherever z is received, else "previous".

Under FedAvg, FedProx and rho = 0 every start is the received model.
"""

from __future__ import annotations

from typing import Literal, TypeVar

from flwr_admm.protocol import START_RECORD

__all__ = [
    "LOCAL_INITS",
    "LocalInit",
    "local_init_of",
    "resolved_init",
    "start_of",
    "start_source",
    "starts_at_z",
]

LocalInit = Literal["auto", "previous", "center", "consensus"]
LOCAL_INITS = ("auto", "previous", "center", "consensus")
Tensors = TypeVar("Tensors")  # a model's tensors: by name, or a list in wire order


def local_init_of(init: str | None = None) -> LocalInit:
    """Return the start `init` names ("auto" for None); ValueError unless in LOCAL_INITS."""
    if init is None:
        return "auto"
    if init not in LOCAL_INITS:
        raise ValueError(f"init: must be one of {list(LOCAL_INITS)}, got {init!r}")
    return init  # type: ignore[return-value]


def resolved_init(local_init: str, z_received: bool) -> str:
    """Return the start `local_init` means: "auto" is "consensus" where z is received.

    Why z: a solve started at v_i = z - u_i drifts from z by about its local drift d_i,
    so the next dual u_i ~ d_i - mean(d) puts the next start opposite that drift; with
    momentum SGD on a CNN that feedback diverges (docs/torch.md). Started at z the dual
    only corrects. Where no z is received (legacy server-held API) "auto" is "previous".
    """
    if local_init == "auto":
        return "consensus" if z_received else "previous"
    return local_init


def starts_at_z(init: str) -> bool:
    """Return whether `init` starts the solve at z wherever z is received (START_MARK)."""
    return resolved_init(init, z_received=True) == "consensus"


def start_source(
    init: str,
    *,
    admm: bool,
    rho: float,
    center: Tensors,
    previous: Tensors | None,
    consensus: Tensors | None,
) -> Tensors:
    """Return the tensors the local solve starts from, for `init`.

    FedADMM with rho > 0: the previous w_i ("previous", when kept), v_i ("center",
    and "previous" in a first round) or the received z ("consensus"); "auto" is
    "consensus" when `consensus` is given, else "previous". Otherwise (FedProx, FedAvg,
    rho = 0) the received arrays: no penalty ties w to z, so a warm start would ignore it.
    """
    if not (admm and rho > 0):
        return center
    init = resolved_init(init, z_received=consensus is not None)
    if init == "consensus":
        if consensus is None:
            raise ValueError(
                "local_init / init: 'consensus' starts the local solve at the received z, "
                f"which this message does not carry (no {START_RECORD!r} record and not "
                "client-held duals): use 'auto', 'previous' or 'center'"
            )
        return consensus
    if init == "previous" and previous is not None:
        return previous
    return center


def start_of(
    init: str | None,
    *,
    form: str,
    admm: bool,
    rho: float,
    center: Tensors,
    previous: Tensors | None,
    consensus: Tensors | None,
) -> tuple[Tensors, bool]:
    """Return where the local solve starts for `init`, and whether `init` starts at z.

    The prox form: `start_source`; the flag is the reply's START_MARK. The linearized
    form starts at z, its `center` ("auto" or "consensus"; any other `init`: ValueError).
    """
    chosen = local_init_of(init)
    if form == "linearized":
        if chosen not in ("auto", "consensus"):
            raise ValueError(f"init: the linearized form starts at z, got {chosen!r}")
        return center, True
    source = start_source(
        chosen, admm=admm, rho=rho, center=center, previous=previous, consensus=consensus
    )
    return source, starts_at_z(chosen)
