"""The streaming floor of plain FedADMM's aggregation: its reads and writes, nothing else.

`FedADMM.aggregate_fit` (plain, 10 of N replying) moves, per reply, the reply twice,
the old w_i once and y_i in and out (`benchmarks.bandwidth`'s byte count). The floor
runs exactly those passes, in the same block order as the fused kernels (blocks
outer, replies inner, so S_w, z' and S_y stay in cache), with the least arithmetic
that touches every byte, ``fastmath`` on and no norms:

    fold:   S_w += a w_i - b w_i,old                (blocks outer, replies inner)
    center: z' = S_w / S_s + c S_y,  ||z - z'||^2
    dual:   y_i += c_d (w_i - z'),  S_y += c_s (w_i - z')   (blocks outer)
    z' serialized (``tobytes``)

on float64 arrays laid out as the benchmark's: replies as read-only views into their
own bytes, two alternating sets, every client's state out of the cache. Its time over
the copy bound is what one core streams for this access pattern; the strategy's time
over the floor is what its norms, checks and Python cost on top. numba is required.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from statistics import median
from typing import Any

import numpy as np

from benchmarks.server_setup import SAMPLED
from flwr_admm.core.backend import FUSED_BLOCK

BLOCK = FUSED_BLOCK
CLIENTS = 4 * SAMPLED  # state arrays per kind: 320 MB at 1e6 values, far beyond the L3


def _kernels() -> tuple[Callable[..., None], Callable[..., None], Callable[..., None]]:
    """Compile the three floor loops (fastmath: vectorized, any order)."""
    from numba import njit

    @njit(fastmath=True, nogil=True, cache=False)
    def fold(acc: Any, a: float, w: Any, b: float, old: Any) -> None:
        for i in range(w.size):
            acc[i] += a * w[i] - b * old[i]

    @njit(fastmath=True, nogil=True, cache=False)
    def center(nsw: Any, ny: Any, z: Any, z_new: Any, ns: float, c: float) -> float:
        total = 0.0
        for i in range(z.size):
            value = nsw[i] / ns + c * ny[i]
            z_new[i] = value
            total += (z[i] - value) ** 2
        return total

    @njit(fastmath=True, nogil=True, cache=False)
    def dual(w: Any, y: Any, z: Any, acc: Any, c_d: float, c_s: float) -> None:
        for i in range(w.size):
            d = w[i] - z[i]
            y[i] += c_d * d
            acc[i] += c_s * d

    return fold, center, dual


def stream_floor_seconds(num_parameters: int, repeats: int, seed: int = 0) -> float:
    """Median CPU seconds of one round of the floor (10 replies of `num_parameters`)."""
    fold, center, dual = _kernels()
    rng = np.random.default_rng(seed)
    base = rng.standard_normal(num_parameters)
    old = [base + k for k in range(CLIENTS)]  # cached w_i, out of the cache
    ys = [base - k for k in range(CLIENTS)]
    replies = [  # read-only views into bytes, as the strategy receives them
        [np.frombuffer((base * (s + 2) + k).tobytes(), dtype=np.float64) for k in range(SAMPLED)]
        for s in range(2)
    ]
    nsw, ny, z, z_new = base * 3.0, base * 0.5, base * 0.1, np.empty_like(base)
    times = []
    for turn in range(repeats + 1):  # the first compiles
        sent = replies[turn % 2]
        chosen = [(turn * SAMPLED + k) % CLIENTS for k in range(SAMPLED)]
        started = time.process_time()
        for start in range(0, num_parameters, BLOCK):
            part = slice(start, start + BLOCK)
            for k in range(SAMPLED):
                fold(nsw[part], 3.0, sent[k][part], 3.0, old[chosen[k]][part])
        center(nsw, ny, z, z_new, 3.0 * CLIENTS, 0.01)
        for start in range(0, num_parameters, BLOCK):
            part = slice(start, start + BLOCK)
            for k in range(SAMPLED):
                dual(sent[k][part], ys[chosen[k]][part], z_new[part], ny[part], 1.0, 3.0)
        z_new.tobytes()
        if turn:
            times.append(time.process_time() - started)
    return median(times)
