"""Safeguarded type-II Anderson acceleration of the server's ADMM round map.

The fixed-point variable is the server state x = (z, y_1, ..., y_N) over every cached
client, in the weighted coordinates of fast ADMM's combined residual

    x = ( sqrt(rho_bar) z,  sqrt(p_1 / rho_1) y_1, ...,  sqrt(p_N / rho_N) y_N ),
    p_i = n_i / N,

so that ||x - x'||^2 = rho_bar ||z - z'||^2 + sum_i p_i ||y_i - y_i'||^2 / rho_i. A
round is the map T: x_k -> f_k = T(x_k) (clients' inexact solves at the centers
v_i = z - y_i / rho_i, z-step, dual step; with partial participation only the
replying clients' y_i move, and T changes with the sample). With the residual
g_k = f_k - x_k and the last m differences

    dX = [x_{j+1} - x_j],   dG = [g_{j+1} - g_j],   j = k - m, ..., k - 1,

type-II Anderson acceleration (Walker & Ni 2011; Fu, Zhang & Boyd 2019 for ADMM)
sends out

    gamma   = argmin_gamma ||g_k - dG gamma||^2 + lam ||dG||_F^2 ||gamma||^2
            = (dG^T dG + lam ||dG||_F^2 I)^-1 dG^T g_k
    x_{k+1} = f_k - (dX + dG) gamma                  (= f_k - dF gamma, dF = [f_{j+1} - f_j])

Safeguard (checked a posteriori: a round is the only way to evaluate T): when x_k
was an extrapolated point and ||g_k|| > D ||g_{k-1}||, the extrapolation is
rejected; the memory restarts from (x_k, g_k) and the plain step x_{k+1} = f_k is
taken, which keeps the round's client work (the "nesterov" choice of
`flwr_admm.core.acceleration`); with `patience` P > 0 the next P steps stay plain.
A change of rho, of the cached clients or of their n_i or s_i (the coordinates
change), or a non-finite residual, also restarts the memory. The memory costs
2 m (N + 1) model-sized float64 vectors. It is checkpointed (`AndersonADMM.dump`):
dX, dG, x_k, g_k as flat float64 vectors, the counters, and the signature (rho, the
client keys in the order of x's blocks, n_i, s_i), so a resumed run extrapolates
exactly as an unbroken one.
"""

from __future__ import annotations

import math
from collections.abc import Collection
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from numpy.typing import NDArray

from flwr_admm.core.kernels import axpy
from flwr_admm.core.sums import RunningSums
from flwr_admm.core.types import Arrays, ClientRecord, natural_key

Vector = NDArray[np.float64]
Signature = tuple[float, tuple[str, ...], tuple[tuple[int, float], ...]]  # rho, keys, n_i, s_i
PREFIX = "anderson_"  # checkpoint array names: anderson_dx.i, anderson_dg.i, anderson_x_prev, ...

DEFAULT_MEMORY = 5  # m
DEFAULT_SAFEGUARD = 1.0  # D
DEFAULT_REGULARIZATION = 1e-8  # lam


def anderson_weights(g: Vector, dg: Vector, regularization: float) -> Vector:
    """Return gamma = (dG^T dG + lam ||dG||_F^2 I)^-1 dG^T g (dG has one column per pair).

    A singular system (dG = 0 once the state stops moving, e.g. at float32 rounding,
    or lam = 0 with dependent columns) takes the least-norm least-squares solution.
    """
    gram = dg.T @ dg
    gram[np.diag_indices_from(gram)] += regularization * float(np.trace(gram))
    try:
        return np.asarray(np.linalg.solve(gram, dg.T @ g), dtype=np.float64)
    except np.linalg.LinAlgError:
        return np.asarray(np.linalg.lstsq(gram, dg.T @ g, rcond=None)[0], dtype=np.float64)


@dataclass
class AndersonMemory:
    """Type-II Anderson acceleration of a fixed-point map on flat vectors.

    `step(x_k, f_k)` takes the point a round started from and its image T(x_k) and
    returns x_{k+1}; see the module docstring for the formulas.
    """

    memory: int = DEFAULT_MEMORY
    safeguard: float = DEFAULT_SAFEGUARD
    regularization: float = DEFAULT_REGULARIZATION
    patience: int = 0  # plain steps after a rejection before the next extrapolation
    dx: list[Vector] = field(default_factory=list)
    dg: list[Vector] = field(default_factory=list)
    x_prev: Vector | None = None
    g_prev: Vector | None = None
    extrapolated: bool = False  # x_k came out of an Anderson step
    accepted: int = 0
    rejected: int = 0
    restarts: int = 0
    _wait: int = 0

    def __post_init__(self) -> None:
        if isinstance(self.memory, bool) or not (isinstance(self.memory, int) and self.memory > 0):
            raise ValueError(f"memory: must be an int >= 1, got {self.memory!r}")
        if not (math.isfinite(self.safeguard) and self.safeguard > 0):
            raise ValueError(f"safeguard: must be a finite number > 0, got {self.safeguard!r}")
        if isinstance(self.patience, bool) or not (
            isinstance(self.patience, int) and self.patience >= 0
        ):
            raise ValueError(f"patience: must be an int >= 0, got {self.patience!r}")
        if not (math.isfinite(self.regularization) and self.regularization >= 0):
            raise ValueError(
                f"regularization: must be a finite number >= 0, got {self.regularization!r}"
            )

    def restart(self) -> None:
        """Forget every pair (the next step is plain)."""
        self.dx, self.dg, self.x_prev, self.g_prev = [], [], None, None
        self.extrapolated = False
        self.restarts += 1

    def step(self, x: Vector, f: Vector) -> Vector:
        """Return x_{k+1} from x_k and f_k = T(x_k); remember the pair."""
        g = f - x  # g_k
        if not np.all(np.isfinite(g)):
            self.restart()
            return f
        if self.extrapolated and self.g_prev is not None:
            if np.linalg.norm(g) > self.safeguard * np.linalg.norm(self.g_prev):
                self.rejected += 1
                self.restart()  # and remember (x_k, g_k) as the first pair
                self._wait = self.patience
            else:
                self.accepted += 1
        if self.x_prev is not None and self.g_prev is not None:
            self.dx.append(x - self.x_prev)
            self.dg.append(g - self.g_prev)
            del self.dx[: -self.memory], self.dg[: -self.memory]
        self.x_prev, self.g_prev = x, g
        self.extrapolated = False
        if not self.dg:
            return f
        if self._wait > 0:  # patience after a rejection
            self._wait -= 1
            return f
        dx, dg = np.stack(self.dx, axis=1), np.stack(self.dg, axis=1)
        gamma = anderson_weights(g, dg, self.regularization)
        out = f - (dx + dg) @ gamma  # x_{k+1} = f_k - dF gamma
        if not np.all(np.isfinite(out)):
            self.restart()
            return f
        self.extrapolated = True
        return np.asarray(out, dtype=np.float64)

    # ------------------------------------------------------------- checkpoint
    def dump(self) -> tuple[dict[str, Vector], dict[str, Any]]:
        """Return the pairs and x_k, g_k as named float64 vectors, and the counters (JSON)."""
        arrays: dict[str, Vector] = {}
        for i, (dx, dg) in enumerate(zip(self.dx, self.dg, strict=True)):
            arrays[f"{PREFIX}dx.{i}"], arrays[f"{PREFIX}dg.{i}"] = dx, dg
        if self.x_prev is not None and self.g_prev is not None:
            arrays[f"{PREFIX}x_prev"], arrays[f"{PREFIX}g_prev"] = self.x_prev, self.g_prev
        meta = {
            "pairs": len(self.dx),
            "has_prev": self.x_prev is not None,
            "extrapolated": self.extrapolated,
            "accepted": self.accepted,
            "rejected": self.rejected,
            "restarts": self.restarts,
            "wait": self._wait,
        }
        return arrays, meta

    def load(self, arrays: dict[str, NDArray[Any]], meta: dict[str, Any], size: int) -> None:
        """Restore what `dump` wrote (vectors of length `size`); ValueError if incomplete.

        The settings (m, D, lam, patience) stay this object's own.
        """
        pairs, has_prev = int(meta["pairs"]), bool(meta["has_prev"])
        names = [f"{PREFIX}{kind}.{i}" for i in range(pairs) for kind in ("dx", "dg")]
        names += [f"{PREFIX}x_prev", f"{PREFIX}g_prev"] if has_prev else []
        held = sorted(name for name in arrays if name.startswith(PREFIX))
        if held != sorted(names) or pairs > self.memory or (pairs and not has_prev):
            raise ValueError(
                f"checkpoint: Anderson memory incomplete: the manifest names {pairs} pairs "
                f"(m = {self.memory}){' and x_k, g_k' if has_prev else ''}, the arrays file "
                f"holds {held}"
            )
        for name in names:
            if arrays[name].shape != (size,) or arrays[name].dtype != np.float64:
                raise ValueError(
                    f"checkpoint: Anderson memory {name}: expected float64 of shape ({size},), "
                    f"got {arrays[name].dtype} of shape {arrays[name].shape}"
                )

        def take(name: str) -> Vector:
            return np.array(arrays[f"{PREFIX}{name}"], dtype=np.float64)

        self.dx = [take(f"dx.{i}") for i in range(pairs)]
        self.dg = [take(f"dg.{i}") for i in range(pairs)]
        self.x_prev = take("x_prev") if has_prev else None
        self.g_prev = take("g_prev") if has_prev else None
        self.extrapolated = bool(meta["extrapolated"])
        self.accepted, self.rejected = int(meta["accepted"]), int(meta["rejected"])
        self.restarts, self._wait = int(meta["restarts"]), int(meta["wait"])


@dataclass
class AndersonADMM:
    """Anderson acceleration of ConsensusADMM's state x = (z, y_i): coordinates and memory.

    `remember` (at the start of a round) keeps z and the sampled clients' y_i, the
    parts of x_k a round overwrites; `step` (after the round) builds x_k and f_k in
    the weighted coordinates, takes the Anderson step and writes x_{k+1} back into
    z and every cached y_i, with S_y = sum n_i y_i summed again in key order.
    """

    accel: AndersonMemory = field(default_factory=AndersonMemory)
    z_before: Arrays = field(default_factory=list)
    y_before: dict[str, Arrays] = field(default_factory=dict)
    cached_before: frozenset[str] = frozenset()
    signature: Signature | None = None  # (rho, keys, (n_i, s_i)) of the memory
    replied_only: bool = False  # keep the y_i of clients absent this round where they are

    def remember(self, z: Arrays, records: dict[str, ClientRecord], keys: Collection[str]) -> None:
        """Copy z and y_i of the sampled clients already cached (x_k's changing parts)."""
        self.z_before = [t.copy() for t in z]
        self.y_before = {k: [t.copy() for t in records[k].y] for k in keys if k in records}
        self.cached_before = frozenset(records)

    def step(
        self,
        z: Arrays,
        records: dict[str, ClientRecord],
        sums: RunningSums,
        rho: float,
        rho_changed: bool,
        replied: Collection[str] = (),
    ) -> Arrays:
        """Return z_{k+1}; move every cached y_i to x_{k+1} and recompute S_y.

        A change of rho (`rho_changed`) restarts the memory and keeps the plain step.
        """
        if rho_changed:
            self.accel.restart()
            self.signature, self.y_before, self.z_before = None, {}, []
            return z
        keys = sorted(records, key=natural_key)
        signature = (
            rho,
            tuple(keys),
            tuple((records[k].num_examples, records[k].scale) for k in keys),
        )
        if signature != self.signature:
            self.accel.restart()
            self.signature = signature
        zero = [np.zeros_like(t, dtype=np.float64) for t in z]
        scales = [math.sqrt(sums.rho_bar(rho))] + [
            math.sqrt(records[k].num_examples / sums.n / (rho * records[k].scale)) for k in keys
        ]
        # y_i of x_k: the copy for a sampled client, 0 for one first cached this round
        before = [self.z_before] + [
            self.y_before.get(k, records[k].y if k in self.cached_before else zero) for k in keys
        ]
        after = [z] + [records[k].y for k in keys]
        x = _flatten(before, scales)
        f = _flatten(after, scales)
        self.y_before, self.z_before = {}, []
        out = self.accel.step(x, f)
        parts = _unflatten(out, scales, z)
        for key, part in zip(keys, parts[1:], strict=True):
            if self.replied_only and key not in replied:
                continue
            for y, t in zip(records[key].y, part, strict=True):
                y[...] = t
        for acc in sums.ny:  # S_y = sum n_i y_i, exactly in key order
            acc.fill(0.0)
        for key in keys:
            for acc, y in zip(sums.ny, records[key].y, strict=True):
                axpy(float(records[key].num_examples), y, acc)
        return parts[0]

    # ------------------------------------------------------------- checkpoint
    def dump(self) -> tuple[dict[str, Vector], dict[str, Any]]:
        """Return the memory's vectors and metadata, with the signature of its coordinates.

        Between rounds z_before, y_before are empty: only the memory and the
        signature (rho, client keys in block order, n_i, s_i) carry over.
        """
        arrays, meta = self.accel.dump()
        if self.signature is not None:
            rho, keys, weights = self.signature
            meta["signature"] = {
                "rho": rho,
                "keys": list(keys),
                "weights": [[n, s] for n, s in weights],
            }
        else:
            meta["signature"] = None
        return arrays, meta

    def load(self, arrays: dict[str, NDArray[Any]], meta: dict[str, Any], size: int) -> None:
        """Restore what `dump` wrote for a model of `size` parameters; ValueError if damaged."""
        saved = meta["signature"]
        if saved is None:
            if meta["has_prev"]:
                raise ValueError("checkpoint: Anderson memory without its signature")
            self.signature = None
            self.accel.load(arrays, meta, 0)
        else:
            keys = tuple(str(k) for k in saved["keys"])
            weights = tuple((int(n), float(s)) for n, s in saved["weights"])
            if len(weights) != len(keys):
                raise ValueError(
                    f"checkpoint: Anderson memory signature: {len(keys)} keys, "
                    f"{len(weights)} weights"
                )
            self.signature = (float(saved["rho"]), keys, weights)
            self.accel.load(arrays, meta, (len(keys) + 1) * size)  # x = (z, y_1..y_N)
        self.z_before, self.y_before, self.cached_before = [], {}, frozenset()


def _flatten(parts: list[Arrays], scales: list[float]) -> Vector:
    """Return the concatenation of scale_j * part_j (each part a list of arrays)."""
    pieces = [
        scale * np.ravel(t).astype(np.float64)
        for part, scale in zip(parts, scales, strict=True)
        for t in part
    ]
    return np.concatenate(pieces) if pieces else np.zeros(0)


def _unflatten(x: Vector, scales: list[float], like: Arrays) -> list[Arrays]:
    """Invert `_flatten`: part_j = x_j / scale_j, each shaped like `like`."""
    parts, offset = [], 0
    for scale in scales:
        part = []
        for t in like:
            part.append(x[offset : offset + t.size].reshape(t.shape) / scale)
            offset += t.size
        parts.append(part)
    return parts
