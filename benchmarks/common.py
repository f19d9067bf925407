"""Shared helpers: machine description, interleaved timing, tables and JSON output."""

from __future__ import annotations

import argparse
import importlib
import json
import logging
import os
import platform
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

RESULTS_DIR = Path(__file__).resolve().parent / "results"
# Load average when the benchmark started (the machines are shared), next to the one
# at the end that `machine_info` reports.
LOAD_AT_START = list(os.getloadavg()) if hasattr(os, "getloadavg") else None
# BLAS threads during measurements. The 2 cores are shared with other jobs: two
# OpenBLAS threads on a busy core spin-wait (L-BFGS-B ran 10x slower), so one thread,
# the same for every candidate.
BLAS_THREADS = 1


def cpu_model() -> str:
    """Return the first ``model name`` of /proc/cpuinfo (platform.processor() elsewhere)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def memory_total_gib() -> float | None:
    """MemTotal of /proc/meminfo in GiB, or None where it does not exist."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return round(int(line.split()[1]) / 2**20, 1)
    except OSError:
        pass
    return None


def blas_info() -> list[dict[str, Any]]:
    """BLAS/OpenMP libraries numpy and scipy loaded (threadpoolctl), with thread counts."""
    import numpy  # noqa: F401  (load numpy's BLAS before asking)
    import scipy.linalg  # noqa: F401
    from threadpoolctl import threadpool_info

    keys = ("user_api", "internal_api", "prefix", "version", "architecture", "num_threads")
    return [
        {**{k: lib.get(k) for k in keys}, "library": Path(lib.get("filepath", "")).name}
        for lib in threadpool_info()
    ]


def numpy_blas_build() -> str:
    """Return the build-time BLAS of numpy from ``numpy.show_config`` (name and configuration)."""
    import numpy

    try:
        blas = numpy.show_config(mode="dicts")["Build Dependencies"]["blas"]  # type: ignore[index]
    except (TypeError, KeyError):  # older numpy without mode="dicts"
        return "unknown"
    return f"{blas.get('name')} {blas.get('version')} ({blas.get('openblas configuration', '')})"


def optional_versions(*modules: str) -> dict[str, str]:
    """Return the versions of the installed `modules` (a deep net's numbers depend on them)."""
    versions = {}
    for name in modules:
        try:
            versions[name] = str(importlib.import_module(name).__version__)
        except ImportError:
            continue
    return versions


def machine_info() -> dict[str, Any]:
    """Return what the numbers were measured on: cores, CPU, memory, library versions, load."""
    import flwr
    import numpy
    import scipy

    try:
        usable = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        usable = os.cpu_count() or 0
    return {
        "nproc": usable,
        "cpu_count": os.cpu_count(),
        "cpu_model": cpu_model(),
        "memory_total_gib": memory_total_gib(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "numpy": numpy.__version__,
        "scipy": scipy.__version__,
        "flwr": flwr.__version__,
        **optional_versions("torch", "sklearn"),
        "numpy_blas_build": numpy_blas_build(),
        "blas_runtime": blas_info(),
        "load_average_at_start": LOAD_AT_START,
        "load_average_at_end": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
    }


def interleaved_times(
    candidates: Mapping[str, Callable[[], object]],
    repeats: int,
    *,
    setup: Callable[[str], object] | None = None,
) -> tuple[dict[str, list[float]], dict[str, list[float]]]:
    """Time every candidate `repeats` times, alternating A B, B A, A B, ...

    Returns (wall seconds, CPU seconds of this process) per candidate. Alternating
    the order each repeat spreads machine noise (other jobs, frequency changes, cache
    state) evenly over the candidates; callers compare medians. CPU time excludes the
    time the process waited for a core, so on a busy shared machine it is the steadier
    measure of single-threaded work. `setup(name)` runs untimed before each call.
    """
    names = list(candidates)
    wall: dict[str, list[float]] = {name: [] for name in names}
    cpu: dict[str, list[float]] = {name: [] for name in names}
    for repeat in range(repeats):
        for name in names if repeat % 2 == 0 else reversed(names):
            if setup is not None:
                setup(name)
            wall_start, cpu_start = time.perf_counter(), time.process_time()
            candidates[name]()
            cpu[name].append(time.process_time() - cpu_start)
            wall[name].append(time.perf_counter() - wall_start)
    return wall, cpu


def settle_allocator() -> None:
    """Put glibc's malloc into the same state for every candidate of a comparison.

    glibc serves large blocks by mmap until a freed mmapped block raises its
    threshold (up to 32 MiB); from then on such blocks come from the reused heap
    and skip the page faults. Which candidate frees a big block first would
    otherwise decide how fast the other one allocates, so raise the threshold to
    its maximum once, up front.
    """
    import numpy

    block = numpy.empty(((32 << 20) - (1 << 16)) // 8)
    del block


def median(values: Sequence[float]) -> float:
    """Median of a non-empty sequence."""
    return float(statistics.median(values))


def format_table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """Return a GitHub-markdown table with columns padded to their widest cell."""
    cells = [[str(h) for h in headers], *[[_cell(v) for v in row] for row in rows]]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    lines = [_row(cells[0], widths), "|" + "|".join("-" * (w + 2) for w in widths) + "|"]
    lines += [_row(row, widths) for row in cells[1:]]
    return "\n".join(lines)


def _row(cells: Sequence[str], widths: Sequence[int]) -> str:
    return "| " + " | ".join(c.ljust(w) for c, w in zip(cells, widths, strict=True)) + " |"


def _cell(value: object) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.3g}"
    return str(value)


def size_text(num_bytes: float) -> str:
    """Bytes as MiB or GiB text."""
    if num_bytes >= 2**30:
        return f"{num_bytes / 2**30:.2f} GiB"
    return f"{num_bytes / 2**20:.1f} MiB"


def base_parser(description: str) -> argparse.ArgumentParser:
    """Parser with the options every benchmark shares: --quick and --output."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument(
        "--quick", action="store_true", help="tiny configuration for CI smoke runs (seconds)"
    )
    parser.add_argument(
        "--output", type=Path, default=None, help="JSON path (default benchmarks/results/)"
    )
    return parser


def write_json(name: str, payload: dict[str, Any], output: Path | None) -> Path:
    """Write `payload` plus the machine description to `output` or results/<name>.json."""
    path = output if output is not None else RESULTS_DIR / f"{name}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    document = {"benchmark": name, "machine": machine_info(), **payload}
    path.write_text(json.dumps(document, indent=2, sort_keys=False, default=_jsonable) + "\n")
    return path


def _jsonable(value: object) -> object:
    if hasattr(value, "item"):  # numpy scalars
        return value.item()
    raise TypeError(f"not JSON serializable: {type(value).__name__}")


def quiet_flower() -> None:
    """Silence Flower's INFO/WARNING chatter (round logs, missing metrics functions)."""
    logging.getLogger("flwr").setLevel(logging.ERROR)
