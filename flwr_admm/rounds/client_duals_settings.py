"""The settings client-held duals support, checked once for both `FedADMMClientDuals`.

With the duals on the clients the server keeps only z, S = sum_i n_i c_i and
N = sum_i n_i, so rho must be one constant > 0 for every client (a client's
u_i = y_i / rho would change meaning under a new rho), the z-step is the plain
z = prox_{g/rho}(S / N) (no over-relaxation), and an uplink compressor must feed its
error back (S would otherwise keep every compression error). Fast ADMM
(``acceleration``, ``restart_eta``) is checked as for `FedADMM`: the server
extrapolates z, each client its own dual (`flwr_admm.core.dual_momentum`). The
compressor check is `flwr_admm.uplink.compression.checked_uplink`.
"""

from __future__ import annotations

import math
from typing import Any

from flwr_admm.core.acceleration import DEFAULT_ETA, check_acceleration
from flwr_admm.core.regularizers import Regularizer
from flwr_admm.core.schedules import Constant

__all__ = ["check_client_duals_settings"]


def check_client_duals_settings(
    *,
    rho: Any,
    rho_schedule: Any,
    client_rho: Any,
    relaxation: Any,
    acceleration: Any,
    regularizer: Any,
    eps_abs: Any,
    eps_rel: Any,
    restart_eta: Any = DEFAULT_ETA,
) -> None:
    """Raise ValueError, naming the field and what is allowed, for an unsupported setting."""
    if rho_schedule is not None and not isinstance(rho_schedule, Constant):
        raise ValueError(
            "rho_schedule: not supported with client-held duals (allowed: None or "
            f"Constant(); rho must stay constant), got {rho_schedule!r}; use FedADMM"
        )
    if client_rho != "uniform":
        raise ValueError(
            "client_rho: only 'uniform' is supported with client-held duals, got "
            f"{client_rho!r}; use FedADMM for 'data_size'"
        )
    if relaxation != 1.0:
        raise ValueError(
            f"relaxation: only 1 is supported with client-held duals, got {relaxation!r}"
        )
    check_acceleration(acceleration, restart_eta)
    if not _finite_number(rho) or rho <= 0:
        raise ValueError(f"rho: must be a finite number > 0 with client-held duals, got {rho!r}")
    if regularizer is not None and not isinstance(regularizer, Regularizer):
        raise ValueError(f"regularizer: must be L1(...), L2(...) or None, got {regularizer!r}")
    for name, value in (("eps_abs", eps_abs), ("eps_rel", eps_rel)):
        if not _finite_number(value) or value < 0:
            raise ValueError(f"{name}: must be a finite number >= 0, got {value!r}")


def _finite_number(value: Any) -> bool:
    return not isinstance(value, bool) and isinstance(value, int | float) and math.isfinite(value)
