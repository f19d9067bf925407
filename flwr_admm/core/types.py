"""Value types, value checks and errors of the consensus ADMM core."""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np
from numpy.typing import NDArray

from flwr_admm.core.kernels import finite_sq_norm

Arrays = list[NDArray[np.float64]]
ClientRho = Literal["uniform", "reported"]
# "reported": s_i comes with each reply (`Reply.scale`), the linearized form's 1 / b_i
CLIENT_RHO_MODES = ("uniform", "reported")

NON_FINITE = "contains NaN or inf (or entries whose squared norm overflows)"


_DIGIT_RUN = re.compile(r"([0-9]+)")
MAX_NUMERIC_DIGITS = 30  # longer digit runs compare as strings (no huge int())


def natural_key(key: str) -> tuple[object, ...]:
    """Return a sort key that orders "partition-id:2" before "partition-id:10".

    Total for any string: ASCII digit runs of at most `MAX_NUMERIC_DIGITS` digits
    compare as integers, longer ones after them (by length, then as strings), and
    the text between runs as strings; the parts alternate text / run, so an integer
    is never compared with a string.
    """
    parts = _DIGIT_RUN.split(str(key))
    return tuple(part if i % 2 == 0 else _digit_run(part) for i, part in enumerate(parts))


def _digit_run(run: str) -> tuple[int, int, str]:
    if len(run) <= MAX_NUMERIC_DIGITS:
        return (0, int(run), "")
    return (1, len(run), run)


def check_rho(rho: float, field_name: str = "rho") -> float:
    """Rho as a float; ValueError naming `field_name` unless it is finite and >= 0."""
    if not (isinstance(rho, int | float) and math.isfinite(rho) and rho >= 0):
        raise ValueError(f"{field_name}: must be a finite number >= 0, got {rho!r}")
    return float(rho)


def check_tolerances(eps_abs: object, eps_rel: object) -> None:
    """Raise ValueError naming the field unless eps_abs, eps_rel are finite and >= 0."""
    for name, value in (("eps_abs", eps_abs), ("eps_rel", eps_rel)):
        if not (isinstance(value, int | float) and math.isfinite(value) and value >= 0):
            raise ValueError(f"{name}: must be a finite number >= 0, got {value!r}")


def check_relaxation(alpha: object) -> float:
    """Return alpha as a float; ValueError unless it is a number in (0, 2)."""
    if isinstance(alpha, bool) or not (isinstance(alpha, int | float) and 0 < alpha < 2):
        raise ValueError(f"relaxation: must be a number in (0, 2), got {alpha!r}")
    return float(alpha)


def check_dual_step(gamma: object, field_name: str = "dual_step") -> float:
    """Return the dual step gamma as a float; ValueError unless it is a number in (0, 1]."""
    if isinstance(gamma, bool) or not (isinstance(gamma, int | float) and 0 < gamma <= 1):
        raise ValueError(f"{field_name}: must be a number in (0, 1], got {gamma!r}")
    return float(gamma)


def check_scale(scale: object, field_name: str) -> float:
    """Return s_i as a float; ValueError naming `field_name` unless finite and > 0."""
    if isinstance(scale, bool) or not (isinstance(scale, int | float) and math.isfinite(scale)):
        raise ValueError(f"{field_name}: must be a finite number > 0, got {scale!r}")
    if scale <= 0:
        raise ValueError(f"{field_name}: must be a finite number > 0, got {scale!r}")
    return float(scale)


@dataclass
class ClientRecord:
    """What the server keeps of client i: w_i, y_i = rho_i u_i, n_i and s_i (rho_i = rho s_i)."""

    w: Arrays
    y: Arrays
    num_examples: int
    scale: float = 1.0


@dataclass(frozen=True)
class Reply:
    """One accepted client reply: its key, local model w_i, n_i and local loss f_i(w_i)."""

    key: str
    w: Arrays
    num_examples: int
    loss: float | None = None
    sq_norm: float | None = None  # ||w||^2 if the caller already computed it
    scale: float | None = None  # s_i under client_rho="reported" (finite, > 0)


@dataclass(frozen=True)
class RoundReport:
    """Residuals and bookkeeping of one aggregation."""

    rho: float
    next_rho: float
    primal_residual: float
    dual_residual: float
    eps_primal: float
    eps_dual: float
    objective: float | None
    num_replies: int
    num_clients_cached: int
    primal_scale: float = 0.0  # max(sqrt(sum p_i ||w_i||^2), ||z||)
    dual_scale: float = 0.0  # sqrt(sum p_i ||y_i||^2) after the dual step
    dual_step: float | None = None  # the round's gamma when a rule sets it (AdaptiveDualStep)

    @property
    def converged(self) -> bool:
        """Boyd's stopping rule: r <= eps_pri and s <= eps_dual."""
        return self.primal_residual <= self.eps_primal and self.dual_residual <= self.eps_dual


class NonFiniteReplyError(ValueError):
    """A reply holds NaN/inf (or entries whose squared norm overflows float64)."""


class RunDivergedError(RuntimeError):
    """A run diverged or stalled (`flwr_admm.core.health`): the message says how, what to try."""


def reply_problem(
    arrays: Sequence[NDArray[np.generic]],
    num_examples: int,
    expected_shapes: Sequence[tuple[int, ...]],
) -> str | None:
    """Return why a reply is unusable, or None when it is fine.

    Rejected: wrong number of arrays, wrong shapes, a non-numeric dtype kind,
    NaN/inf entries (or |entries| so large the squared norm overflows), num_examples <= 0.
    """
    return check_reply(arrays, num_examples, expected_shapes)[0]


def check_reply(
    arrays: Sequence[NDArray[np.generic]],
    num_examples: int,
    expected_shapes: Sequence[tuple[int, ...]],
    finite: bool = True,
) -> tuple[str | None, float | None]:
    """`reply_problem` plus sum ||a||^2 of the arrays, found in the same finiteness pass.

    With ``finite=False`` only the structure is checked (count, shapes, dtypes,
    num_examples) and the norm is None: for a caller that checks finiteness itself
    in a pass it makes anyway (`ConsensusADMM.absorb`).
    """
    if isinstance(num_examples, bool) or not isinstance(num_examples, int | np.integer):
        return f"num_examples must be an integer, got {type(num_examples).__name__}", None
    if num_examples <= 0:
        return f"num_examples must be > 0, got {num_examples}", None
    if len(arrays) != len(expected_shapes):
        return f"expected {len(expected_shapes)} arrays, got {len(arrays)}", None
    for i, (array, shape) in enumerate(zip(arrays, expected_shapes, strict=True)):
        if array.shape != tuple(shape):
            return f"array {i} has shape {array.shape}, expected {tuple(shape)}", None
        if array.dtype.kind not in "fiu":
            return f"array {i} has dtype {array.dtype}, expected a real number type", None
    if not finite:
        return None, None
    sq_norm = finite_sq_norm(arrays)
    if sq_norm is None:
        return "contains NaN or inf (or entries whose squared norm overflows)", None
    return None, sq_norm
