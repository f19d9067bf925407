"""Server cost against the memory-traffic limit: bytes per reply, bandwidth, time bound.

For P float64 parameters and m = 10 replies a round, the bytes `aggregate_fit` must
move per reply (reads + writes of model-sized arrays, 8 P bytes each; the per-round
arrays are divided by m):

- FedAvg: read the reply once; write the average once a round: 8 P (1 + 1/m).
- FedADMM (server-held duals, streaming replies one at a time): read the reply when
  folding it into S_w and again in the dual step (z' needs every reply first), read the
  client's previous w_i to take it out of S_w (partial participation only), read and
  write y_i: 8 P (4 + 1) with 10 of 100 clients, 8 P 4 when every client replies; per
  round S_w, S_y, z read and z', S_y written and the serialized z': 8 P 7 / m (the
  z-step sums ||z - z'||^2 without storing z - z', which only the relaxed dual step
  reads). With acceleration="nesterov": y_i,prev read and written and y_i read and
  written again (8 P 4 more), z_{k-1} read and written and z^ written (8 P 3 / m).
  The defaults (fast ADMM, alpha = 1.6, `ResidualBalancing`) count as the fast
  variant plus z - z' written (8 P / m): over-relaxation adds R = sum n_i w_i, folded
  in the pass that reads the reply, and the dz term of the dual step, read from the
  cache-sized dz.

With ``state_dtype="float32"`` (w_i, y_i, y_i,prev stored in 4 bytes; the reply, z and
the sums stay float64) the reply is read once: the fold rounds it into the stored
w_i (4 P written) and the dual step reads that copy (4 P), so per reply
8 P + 4 P (1 + 1 + 1 + 2) with 10 of 100 clients (28 P bytes against 40 P), and fast
ADMM adds 4 P 4 (16 P against 32 P).

Running sums (S_w, S_y, R) are not counted per reply: a server that streams replies
keeps them hot (8 MB each at 1e6 parameters, next to a 32 MiB L3).

The machine's bandwidth is a numpy copy (``np.copyto``, 16 bytes moved per float64)
of 256 MiB arrays (far beyond the L3 cache), best of 7 repeats, measured before and
after each strategy in the same run, the best of those samples taken (the machine is
shared: other jobs' traffic lowers some samples); the time the byte count allows is
bytes / bandwidth, and the achieved bandwidth is bytes / measured time (FedADMM's
arrays of 8 MB at 1e6 parameters partly stay in the cache, so the achieved figure can
exceed the copy's).

Each variant runs with ``kernels="numpy"`` and the plain and default strategies also
with ``kernels="numba"`` (the fused one-pass kernels, `flwr_admm.core.fused`): the
same bytes, fewer passes. With numba installed the run also times the streaming
floor (`benchmarks.stream_floor`): plain FedADMM's reads and writes with nothing
else, i.e. what one core streams for that access pattern against the copy bound.

    python -m benchmarks.bandwidth [--quick] [--params 1000000] [--clients 100]
"""

from __future__ import annotations

import time
from functools import partial
from typing import Any

from threadpoolctl import threadpool_limits

from benchmarks.common import (
    BLAS_THREADS,
    base_parser,
    copy_bandwidth,
    format_table,
    quiet_flower,
    settle_allocator,
    write_json,
)
from benchmarks.server_cost import measure
from benchmarks.server_setup import FLOAT, SAMPLED
from benchmarks.stream_floor import stream_floor_seconds
from flwr_admm.core.backend import compiled, numba_installed
from flwr_admm.core.settings import TEXTBOOK
from flwr_admm.server import FedADMM


def bytes_per_reply(
    kind: str, num_parameters: int, partial_participation: bool, state: int = FLOAT
) -> float:
    """Return the bytes `kind` must move per reply (see the module docstring).

    `state` is the bytes of one cached value (8: float64, 4: state_dtype="float32");
    the reply and the per-round arrays (z, sums) are float64 either way.
    """
    reply, m = FLOAT, SAMPLED
    if kind == "FedAvg":
        return num_parameters * reply * (1 + 1 / m)
    if state == FLOAT:  # the reply twice (it is the cached w_i), w_i old, y_i read + write
        per_reply = 2 * reply + (state if partial_participation else 0) + 2 * state
    else:  # the reply once, w_i = fl32(reply) written, w_i old, w_i again, y_i read + write
        per_reply = reply + state + (state if partial_participation else 0) + state + 2 * state
    per_round = 7 * FLOAT
    if "fast" in kind or "defaults" in kind:  # y_i,prev and y_i read + written once more
        per_reply, per_round = per_reply + 4 * state, per_round + 3 * FLOAT
    if "defaults" in kind:  # alpha = 1.6: z - z' stored for the dual step's relaxed term
        per_round += FLOAT
    return num_parameters * (per_reply + per_round / m)


PLAIN = {**TEXTBOOK, "rho": 1.0}
FAST = {"acceleration": "nesterov", "relaxation": 1.0, "rho_schedule": "constant"}
NUMPY, NUMBA = {"kernels": "numpy"}, {"kernels": "numba"}
# label: (strategy keywords, bytes of one cached value); "numba": the fused kernels
# (float32 state takes the numpy path whatever `kernels` says)
VARIANTS: dict[str, tuple[dict[str, Any], int]] = {
    "FedADMM": ({**PLAIN, **NUMPY}, FLOAT),
    "FedADMM numba": ({**PLAIN, **NUMBA}, FLOAT),
    "FedADMM float32": ({**PLAIN, **NUMPY, "state_dtype": "float32"}, 4),
    "FedADMM fast": ({**FAST, **NUMPY}, FLOAT),
    "FedADMM (defaults)": (NUMPY, FLOAT),
    "FedADMM (defaults) numba": (NUMBA, FLOAT),
    "FedADMM (defaults) float32": ({**NUMPY, "state_dtype": "float32"}, 4),
}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Measure the bandwidth, then FedAvg and each FedADMM variant; print and write JSON."""
    parser = base_parser(__doc__.splitlines()[0])
    parser.add_argument("--params", type=int, default=10**6)
    parser.add_argument("--clients", type=int, default=100)
    args = parser.parse_args(argv)
    quiet_flower()
    settle_allocator()
    num_parameters = 10**5 if args.quick else args.params
    repeats = 5 if args.quick else 9
    started = time.perf_counter()
    rows: list[dict[str, Any]] = []
    copies: list[float] = []
    with threadpool_limits(BLAS_THREADS):
        copies.append(copy_bandwidth(256 * 2**20, 7))
        if any(kwargs.get("kernels") == "numba" for kwargs, _ in VARIANTS.values()):
            compiled()  # numba's compilation (or cache load) is not timed
        for label, (kwargs, state) in VARIANTS.items():
            row = measure(num_parameters, args.clients, repeats, False, partial(FedADMM, **kwargs))
            rows.append({"variant": label, "state_bytes_per_value": state, **row})
            copies.append(copy_bandwidth(256 * 2**20, 7))
        floor = stream_floor_seconds(num_parameters, repeats) if numba_installed() else None
        copies.append(copy_bandwidth(256 * 2**20, 7))
    bandwidth = max(copies)  # the best the shared machine showed during the run
    partial_participation = args.clients > SAMPLED
    table = []
    for row in rows:
        for kind, seconds in (
            ("FedAvg", row["fedavg_seconds"]),
            (row["variant"], row["fedadmm_seconds"]),
        ):
            state = FLOAT if kind == "FedAvg" else row["state_bytes_per_value"]
            moved = SAMPLED * bytes_per_reply(kind, num_parameters, partial_participation, state)
            bound = moved / bandwidth
            row.setdefault("analysis", {})[kind] = {
                "bytes_per_round": moved,
                "bound_seconds": bound,
                "seconds": seconds,
                "achieved_bytes_per_second": moved / seconds,
                "time_over_bound": seconds / bound,
            }
            table.append(
                [
                    kind if kind != "FedAvg" else f"FedAvg (next to {row['variant']})",
                    f"{moved / 2**20:.0f} MiB",
                    f"{bound * 1e3:.1f}",
                    f"{seconds * 1e3:.1f}",
                    f"{moved / seconds / 1e9:.1f}",
                    f"{seconds / bound:.2f}",
                    f"{row['time_ratio']:.2f}" if kind != "FedAvg" else "1",
                ]
            )
    samples = ", ".join(f"{c / 1e9:.1f}" for c in copies)
    print(f"copy bandwidth: {bandwidth / 1e9:.1f} GB/s, the best of {samples} (before, between)")
    headers = [
        "strategy",
        "bytes/round",
        "bound ms",
        "measured ms",
        "achieved GB/s",
        "time / bound",
        "time / FedAvg",
    ]
    print(format_table(headers, table))
    stream_floor = None
    if floor is not None:
        plain = SAMPLED * bytes_per_reply("FedADMM", num_parameters, partial_participation)
        fused = next(r["fedadmm_seconds"] for r in rows if r["variant"] == "FedADMM numba")
        stream_floor = {
            "seconds": floor,
            "time_over_bound": floor / (plain / bandwidth),
            "fedadmm_numba_over_floor": fused / floor,
        }
        print(
            f"\nstreaming floor of plain FedADMM's bytes: {floor * 1e3:.1f} ms, "
            f"{stream_floor['time_over_bound']:.2f} x its bound; "
            f"FedADMM numba / floor: {stream_floor['fedadmm_numba_over_floor']:.2f}"
        )
    payload = {
        "quick": args.quick,
        "num_parameters": num_parameters,
        "num_clients": args.clients,
        "copy_bandwidth": bandwidth,
        "copy_bandwidth_samples": copies,
        "stream_floor": stream_floor,
        "seconds": time.perf_counter() - started,
        "results": rows,
    }
    path = write_json("bandwidth", payload, args.output)
    print(f"\nwrote {path} ({payload['seconds']:.0f} s)")
    return payload


if __name__ == "__main__":
    main()
