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

Run as a module it decomposes plain FedADMM's time (1e6 parameters, 10 of 100): the
strategy's `aggregate_fit` (``kernels="numba"``), its fused kernels alone on the
floor's arrays (fold, z-step pass, dual step, z' serialized), and the floor, timed
interleaved in one process (median CPU seconds, the fold and the dual step apart);
and what one core streams: a numba sum over one, then two 8 MB arrays at a time, a
read-modify-write (b += a), against ``np.copyto`` of 256 MiB (`benchmarks.bandwidth`'s
bound):

    python -m benchmarks.stream_floor [--quick] [--params 1000000]
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable
from functools import partial
from statistics import median
from typing import Any, NamedTuple

import numpy as np
from threadpoolctl import threadpool_limits

from benchmarks.common import (
    BLAS_THREADS,
    base_parser,
    copy_bandwidth,
    quiet_flower,
    settle_allocator,
    write_json,
)
from benchmarks.server_setup import SAMPLED, prepared_fedadmm
from flwr_admm.core.backend import FUSED_BLOCK, compiled
from flwr_admm.core.fused import LANES
from flwr_admm.server import FedADMM

BLOCK = FUSED_BLOCK
CLIENTS = 4 * SAMPLED  # state arrays per kind: 320 MB at 1e6 values, far beyond the L3


def _kernels() -> tuple[Callable[..., Any], Callable[..., Any], Callable[..., Any]]:
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


class FloorArrays:
    """The floor's arrays: old w_i and y_i of CLIENTS clients, two reply sets, the sums."""

    def __init__(self, num_parameters: int, seed: int = 0) -> None:
        rng = np.random.default_rng(seed)
        base = rng.standard_normal(num_parameters)
        self.size = num_parameters
        self.old = [base + k for k in range(CLIENTS)]  # cached w_i, out of the cache
        self.ys = [base - k for k in range(CLIENTS)]
        self.replies = [  # read-only views into bytes, as the strategy receives them
            [
                np.frombuffer((base * (s + 2) + k).tobytes(), dtype=np.float64)
                for k in range(SAMPLED)
            ]
            for s in range(2)
        ]
        self.nsw, self.ny, self.z = base * 3.0, base * 0.5, base * 0.1
        self.z_new = np.empty_like(base)
        self.turns = itertools.count()

    def next_round(self) -> tuple[list[Any], list[Any], list[Any]]:
        """Return the next round's replies, their old w_i and their y_i (alternating)."""
        turn = next(self.turns)
        chosen = [(turn * SAMPLED + k) % CLIENTS for k in range(SAMPLED)]
        return (
            self.replies[turn % 2],
            [self.old[c] for c in chosen],
            [self.ys[c] for c in chosen],
        )


class RoundKernels(NamedTuple):
    """One round's three passes, each over flat float64 blocks.

    fold(k, S_w, w_i, w_i,old) for reply k, center(S_w, S_y, z, z'),
    dual(w_i, y_i, z', S_y).
    """

    fold: Callable[[int, Any, Any, Any], Any]
    center: Callable[[Any, Any, Any, Any], Any]
    dual: Callable[[Any, Any, Any, Any], Any]


def floor_kernels() -> RoundKernels:
    """Return the floor's loops (`_kernels`) with the benchmark's constants."""
    fold, center, dual = _kernels()
    return RoundKernels(
        lambda k, acc, w, old: fold(acc, 3.0, w, 3.0, old),
        lambda nsw, ny, z, z_new: center(nsw, ny, z, z_new, 3.0 * CLIENTS, 0.01),
        lambda w, y, z, acc: dual(w, y, z, acc, 1.0, 3.0),
    )


def fused_kernels() -> RoundKernels:
    """Return FedADMM's fused kernels (norms and all), as plain FedADMM calls them."""
    kernels = compiled()
    lanes = np.zeros((SAMPLED, LANES))  # each reply's partial sums of squares
    return RoundKernels(
        lambda k, acc, w, old: kernels.fold(acc, 3.0, w, 3.0, old, None, lanes[k]),
        lambda nsw, ny, z, z_new: kernels.center(
            nsw, ny, None, z, z_new, None, 3.0 * CLIENTS, 0.01, 0.0, 0.0, True
        ),
        lambda w, y, z, acc: kernels.dual(w, y, z, None, acc, 1.0, 0.0, 3.0),
    )


def timed_round(arrays: FloorArrays, kernels: RoundKernels) -> tuple[float, float]:
    """Run one round on `arrays`; return the CPU seconds of its fold and its dual step.

    Blocks outer, replies inner, as `flwr_admm.core.batch` and `flwr_admm.core.steps`.
    """
    sent, old, ys = arrays.next_round()
    size, nsw, ny, z_new = arrays.size, arrays.nsw, arrays.ny, arrays.z_new
    started = time.process_time()
    for start in range(0, size, BLOCK):
        part = slice(start, start + BLOCK)
        for k in range(SAMPLED):
            kernels.fold(k, nsw[part], sent[k][part], old[k][part])
    folded = time.process_time()
    kernels.center(nsw, ny, arrays.z, z_new)
    dual_started = time.process_time()
    for start in range(0, size, BLOCK):
        part = slice(start, start + BLOCK)
        for k in range(SAMPLED):
            kernels.dual(sent[k][part], ys[k][part], z_new[part], ny[part])
    dual_seconds = time.process_time() - dual_started
    z_new.tobytes()
    return folded - started, dual_seconds


def stream_floor_seconds(num_parameters: int, repeats: int, seed: int = 0) -> float:
    """Median CPU seconds of one round of the floor (10 replies of `num_parameters`)."""
    kernels = floor_kernels()
    arrays = FloorArrays(num_parameters, seed)
    timed_round(arrays, kernels)  # compiles
    times = []
    for _ in range(repeats):
        started = time.process_time()
        timed_round(arrays, kernels)
        times.append(time.process_time() - started)
    return median(times)


def stream_rates(num_parameters: int, repeats: int) -> dict[str, float]:
    """Bytes per second one core moves: 1 and 2 read streams, b += a, np.copyto 256 MiB."""
    from numba import njit

    @njit(fastmath=True, cache=False)
    def one(a: Any) -> float:
        total = 0.0
        for i in range(a.size):
            total += a[i]
        return total

    @njit(fastmath=True, cache=False)
    def two(a: Any, b: Any) -> float:
        total = 0.0
        for i in range(a.size):
            total += a[i] + b[i]
        return total

    @njit(fastmath=True, cache=False)
    def update(a: Any, b: Any) -> None:
        for i in range(a.size):
            b[i] += a[i]

    rng = np.random.default_rng(1)
    arrays = [rng.standard_normal(num_parameters) for _ in range(40)]  # 320 MB at 1e6
    nbytes = arrays[0].nbytes
    rates: dict[str, float] = {}
    cases: list[tuple[str, Callable[..., Any], int, int]] = [
        ("one read stream", one, 1, 1),
        ("two read streams", two, 2, 2),
        ("read-modify-write b += a", update, 2, 3),
    ]
    for label, kernel, width, moved in cases:
        kernel(*arrays[:width])  # compiles
        best = float("inf")
        for _ in range(repeats):
            started = time.perf_counter()
            for j in range(0, len(arrays) - width + 1, width):
                kernel(*arrays[j : j + width])
            best = min(best, time.perf_counter() - started)
        rates[label] = (len(arrays) // width) * moved * nbytes / best
    rates["np.copyto 256 MiB"] = copy_bandwidth(256 * 2**20, repeats)
    return rates


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Time the strategy, its kernels and the floor interleaved; the stream rates; write JSON."""
    parser = base_parser(__doc__.splitlines()[0])
    parser.add_argument("--params", type=int, default=10**6)
    args = parser.parse_args(argv)
    quiet_flower()
    settle_allocator()
    num_parameters = 10**5 if args.quick else args.params
    repeats = 5 if args.quick else 15
    started = time.perf_counter()
    with threadpool_limits(BLAS_THREADS):
        compiled()
        plain = partial(
            FedADMM, acceleration=None, relaxation=1.0, rho_schedule="constant", kernels="numba"
        )
        strategy, timed = prepared_fedadmm(num_parameters, 10 * SAMPLED, plain)
        turns = itertools.count()
        server_round = 11

        def strategy_round() -> tuple[float, float]:
            begun = time.process_time()
            strategy.aggregate_fit(server_round, timed[next(turns) % 2], [])
            return time.process_time() - begun, float("nan")

        arrays, fused, floor = FloorArrays(num_parameters), fused_kernels(), floor_kernels()
        cases: dict[str, Callable[[], tuple[float, float]]] = {
            "FedADMM.aggregate_fit (numba)": strategy_round,
            "fused kernels": lambda: timed_round(arrays, fused),
            "floor": lambda: timed_round(arrays, floor),
        }
        for case in cases.values():  # compile, warm up
            case()
            case()
        samples: dict[str, list[tuple[float, float, float]]] = {label: [] for label in cases}
        for _ in range(repeats):
            for label, case in cases.items():
                begun = time.process_time()
                parts = case()
                samples[label].append((time.process_time() - begun, *parts))
        rates = stream_rates(num_parameters, 7)
    rows = {
        label: {
            "seconds": median(s[0] for s in values),
            "fold_seconds": median(s[1] for s in values),
            "dual_seconds": median(s[2] for s in values),
        }
        for label, values in samples.items()
    }
    print(f"plain FedADMM, {num_parameters:,} parameters, 10 of 100 replies, medians of {repeats}")
    for label, row in rows.items():
        split = ""
        if label != "FedADMM.aggregate_fit (numba)":
            split = f" (fold {row['fold_seconds'] * 1e3:.2f}, dual {row['dual_seconds'] * 1e3:.2f})"
        print(f"  {label:32s} {row['seconds'] * 1e3:7.2f} ms{split}")
    print("one core streams (GB/s, bytes read + written):")
    for label, rate in rates.items():
        print(f"  {label:32s} {rate / 1e9:6.1f}")
    payload = {
        "quick": args.quick,
        "num_parameters": num_parameters,
        "repeats": repeats,
        "rows": rows,
        "stream_rates": rates,
        "seconds": time.perf_counter() - started,
    }
    path = write_json("stream_floor", payload, args.output)
    print(f"\nwrote {path} ({payload['seconds']:.0f} s)")
    return payload


if __name__ == "__main__":
    main()
