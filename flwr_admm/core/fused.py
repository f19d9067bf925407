"""Fused one-pass kernels of the server's hot loop, for float64 C-contiguous arrays.

numpy runs each term of an update as its own pass (and each squared norm as one
more); here every element of a reply, dual or sum is read and written once per
kernel. Four kernels, each one pass over flat float64 arrays:

    fold:  S_w += a w - b w_old,  R += a w,  returns ||w||^2 (lanes kept by the caller)
    dual:  d = w_i - z',  y_i += c_d d + c_dz dz,  S_y += c_s d,
           returns (||d||^2, ||y_i'||^2)
    shift: t = gamma (y_i - y_i,prev),  y_i,prev = y_i,  y_i += t,  S_y += n_i t
    center: z' = S_w / S_s + c_y S_y + c_r R + c_z z,  dz = z - z' (stored if asked),
            returns (||z'||^2, ||dz||^2)

The functions are plain Python over numpy arrays (readable, and runnable without
numba as the reference); `flwr_admm.core.backend.compiled` jit-compiles them with
numba, an optional dependency (``flwr-admm[fast]``), with ``fastmath`` off: the
operations and their order are fixed, so a result is the same bit for bit from run
to run. A squared norm is summed in LANES partial sums, element k into lane
k mod LANES, the lanes added in order at the end: the arrays are viewed as rows of
LANES values and the loop over a row is elementwise, so the compiler vectorizes it
without reassociating any sum. numpy's BLAS dot sums in its own order (and daxpy
may fuse a multiply-add), so the two backends agree to rounding (~1e-16 relative
per operation), not bit for bit. NaN/inf entries (or an overflowing square) make
the returned norm non-finite, as on the numpy path.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

__all__ = ["LANES", "center", "dual", "fold", "shift"]

LANES = 64  # partial sums per squared norm: one row of the vectorized loop


def fold(
    acc: NDArray[np.float64],
    a: float,
    w: NDArray[np.float64],
    b: float,
    w_old: NDArray[np.float64] | None,
    acc2: NDArray[np.float64] | None,
    lanes: NDArray[np.float64],
) -> float:
    """S_w += a w - b w_old and R += a w (w_old, R optional); return ||w||^2 so far.

    Elementwise acc = (acc - b w_old) + a w, the order of the numpy path's axpy
    calls; `acc2` (R) = acc2 + a w. One read of w, w_old, acc, acc2. The squares go
    into the caller's LANES partial sums `lanes` (zeros for one call), and their
    total in order is returned: a tensor folded block by block (blocks of a multiple
    of LANES values, the same `lanes` throughout) gets the bits of one call.
    """
    rows = w.size // LANES
    body, shape = rows * LANES, (rows, LANES)  # the rows; then the tail, body..size
    sq = lanes.copy()  # a local copy: the compiler sees it alias none of the arrays
    acc_m, w_m = acc[:body].reshape(shape), w[:body].reshape(shape)
    old_m = None if w_old is None else w_old[:body].reshape(shape)
    acc2_m = None if acc2 is None else acc2[:body].reshape(shape)
    for r in range(rows):
        for k in range(LANES):
            x = w_m[r, k]
            sq[k] += x * x
            value = acc_m[r, k]
            if old_m is not None:
                value -= b * old_m[r, k]
            acc_m[r, k] = value + a * x
        if acc2_m is not None:  # its own loop over the row (in L1): still vectorized
            for k in range(LANES):
                acc2_m[r, k] += a * w_m[r, k]
    for i in range(body, w.size):  # element i into lane i mod LANES
        x = w[i]
        sq[i - body] += x * x
        value = acc[i]
        if w_old is not None:
            value -= b * w_old[i]
        acc[i] = value + a * x
        if acc2 is not None:
            acc2[i] += a * x
    total = 0.0
    for k in range(LANES):
        lanes[k] = sq[k]
        total += sq[k]
    return total


def dual(
    w: NDArray[np.float64],
    y: NDArray[np.float64],
    z: NDArray[np.float64],
    dz: NDArray[np.float64] | None,
    acc: NDArray[np.float64] | None,
    c_d: float,
    c_dz: float,
    c_s: float,
) -> tuple[float, float]:
    """Dual step of one reply: y_i += c_d d + c_dz dz, S_y += c_s d, d = w_i - z'.

    With c_d = rho_i alpha, c_dz = rho_i (1 - alpha), c_s = n_i rho_i alpha; dz is
    None when alpha = 1, acc (S_y) None when the caller adds the replies' part at
    once (a None drops its term at compile time). Returns (||w_i - z'||^2,
    ||y_i'||^2). One read of w_i, z', dz; y_i and S_y read and written once.
    """
    rows = w.size // LANES
    body, shape = rows * LANES, (rows, LANES)  # the rows; then the tail, body..size
    r_lanes, y_lanes = np.zeros(LANES), np.zeros(LANES)
    w_m, y_m, z_m = w[:body].reshape(shape), y[:body].reshape(shape), z[:body].reshape(shape)
    dz_m = None if dz is None else dz[:body].reshape(shape)
    acc_m = None if acc is None else acc[:body].reshape(shape)
    for r in range(rows):
        for k in range(LANES):
            d = w_m[r, k] - z_m[r, k]
            r_lanes[k] += d * d
            value = y_m[r, k] + c_d * d
            if dz_m is not None:
                value += c_dz * dz_m[r, k]
            y_m[r, k] = value
            y_lanes[k] += value * value
            if acc_m is not None:
                acc_m[r, k] += c_s * d
    for i in range(body, w.size):  # element i into lane i mod LANES
        d = w[i] - z[i]
        r_lanes[i - body] += d * d
        value = y[i] + c_d * d
        if dz is not None:
            value += c_dz * dz[i]
        y[i] = value
        y_lanes[i - body] += value * value
        if acc is not None:
            acc[i] += c_s * d
    r_sq = y_sq = 0.0
    for k in range(LANES):
        r_sq += r_lanes[k]
        y_sq += y_lanes[k]
    return r_sq, y_sq


def shift(
    y: NDArray[np.float64],
    y_prev: NDArray[np.float64],
    acc: NDArray[np.float64],
    gamma: float,
    weight: float,
) -> None:
    """Fast ADMM's extrapolation: t = gamma (y_i - y_i,prev), y_i,prev = y_i, y_i += t.

    S_y += n_i t (`weight` = n_i); with gamma = 0 only y_i,prev = y_i. One read and
    write of y_i, y_i,prev and S_y.
    """
    moving = gamma != 0.0
    for i in range(y.size):
        value = y[i]
        step = value - y_prev[i]
        y_prev[i] = value
        if moving:
            step *= gamma
            y[i] = value + step
            acc[i] += weight * step


def center(
    nsw: NDArray[np.float64],
    ny: NDArray[np.float64],
    share: NDArray[np.float64] | None,
    z: NDArray[np.float64],
    z_new: NDArray[np.float64],
    dz: NDArray[np.float64] | None,
    ns: float,
    c_y: float,
    c_r: float,
    c_z: float,
    dz_norm: bool,
) -> tuple[float, float]:
    """Set z' = S_w / S_s + c_y S_y + c_r R + c_z z (the z-step's average), dz = z - z'.

    In the numpy path's order; `share` (R) None drops the relaxed terms c_r R + c_z z.
    `dz` None stores no z - z' (nothing reads it: alpha = 1, or a prox follows);
    `dz_norm` sums ||z - z'||^2 all the same. One read of S_w, S_y, R, z. Returns
    (||z'||^2, ||z - z'||^2) in LANES partial sums (the second 0.0 unless `dz_norm`),
    so the round report need not read z' and dz again.
    """
    rows = z.size // LANES
    z_lanes, dz_lanes = np.zeros(LANES), np.zeros(LANES)
    for r in range(rows + 1):  # the rows, then the tail (element i into lane i mod LANES)
        start = r * LANES
        for k in range(min(LANES, z.size - start)):
            i = start + k
            value = nsw[i] / ns
            if c_y != 0.0:
                value += c_y * ny[i]
            if share is not None:
                value += c_r * share[i]
                value += c_z * z[i]
            z_new[i] = value
            z_lanes[k] += value * value
            if dz_norm:
                step = z[i] - value
                if dz is not None:
                    dz[i] = step
                dz_lanes[k] += step * step
    z_sq = dz_sq = 0.0
    for k in range(LANES):
        z_sq += z_lanes[k]
        dz_sq += dz_lanes[k]
    return z_sq, dz_sq
