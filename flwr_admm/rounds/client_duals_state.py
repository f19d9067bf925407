"""The server's state with client-held duals: z, S, N, the per-key entries and the sweep.

The protocol is `flwr_admm.rounds.client_duals`'s module docstring. Settings
(`check_settings`): the server keeps only z, S and N, so rho must be one constant > 0
for every client (a client's u_i = y_i / rho would change meaning under a new rho) and
the z-step is the plain z = prox_{g/rho}(S / (N + N_stale)), without over-relaxation.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from logging import INFO
from typing import Any

import numpy as np
from flwr.common.logger import log
from numpy.typing import NDArray

from flwr_admm.core.client_duals import restore_payload, share_weight
from flwr_admm.core.regularizers import Regularizer
from flwr_admm.core.schedules import (
    AdaptiveDualStep,
    DualStep,
    check_dual_step_spec,
    first_gamma,
    saved_gamma,
)
from flwr_admm.core.settings import describe_step
from flwr_admm.core.types import Arrays
from flwr_admm.protocol import (
    ACK_ROUND,
    ALIGN,
    CONVERGED,
    DUAL_STEP,
    GAMMA,
    NUM_CLIENTS_CACHED,
    REBUILD,
    REBUILDING,
    RESTORE,
    RESTORE_EXAMPLES,
    RESTORED,
    RHO,
    STEP_BUDGET,
)
from flwr_admm.rounds.client_duals_replies import (
    RoundStats,
    protocol_problem,
    z_round,
)
from flwr_admm.rounds.client_duals_sweep import RebuildSweep

__all__ = ["STRATEGY", "ClientDualsState", "ClientEntry", "check_settings"]

STRATEGY = "FedADMMClientDuals"  # in the fingerprinted configuration of its checkpoints


@dataclass(slots=True)
class ClientEntry:
    """All the server keeps per client key: n_i, the round it was added, omega_i in S.

    omega_i is n_i, or n_i / b_i in the linearized form (`share_weight`).
    """

    num_examples: int
    last_round: int
    weight: float


def entry_arrays(clients: dict[str, ClientEntry]) -> dict[str, NDArray[Any]]:
    """Return the entries' n_i, last rounds and omega_i as arrays, in the order of `clients`."""
    entries = list(clients.values())
    return {
        "entry_examples": np.array([e.num_examples for e in entries], dtype=np.int64),
        "entry_rounds": np.array([e.last_round for e in entries], dtype=np.int64),
        "entry_weights": np.array([e.weight for e in entries], dtype=np.float64),
    }


def entries_from_arrays(
    keys: list[str], arrays: Mapping[str, NDArray[Any]]
) -> dict[str, ClientEntry]:
    """Rebuild the entries of `keys` from `entry_arrays` output; ValueError if they differ.

    A checkpoint written before omega_i was kept weighed every share by n_i (the prox
    form's omega_i; `ClientDualsState.load_state_dict` refuses a linearized one).
    """
    examples, rounds = arrays["entry_examples"], arrays["entry_rounds"]
    weights = arrays.get("entry_weights", examples.astype(np.float64))
    if any(a.shape != (len(keys),) for a in (examples, rounds, weights)):
        raise ValueError("entries and keys disagree")
    rows = zip(keys, examples.tolist(), rounds.tolist(), weights.tolist(), strict=True)
    return {key: ClientEntry(int(n), int(r), float(w)) for key, n, r, w in rows}


class ClientDualsState:
    """z, S = sum_i omega_i c_i, N = sum_i omega_i, entries per key, the rebuild sweep.

    Parameters
    ----------
    rho, regularizer, eps_abs, eps_rel :
        As in `FedADMMClientDuals`, checked by `check_settings` (ValueError naming the
        field).

    Attributes
    ----------
    z : list of ndarray or None
        What the next round sends; None before the first round.
    contribution_sum : list of ndarray or None
        S; sized (zeros) by the first z.
    total_examples : float
        N = sum_i omega_i (omega_i = n_i but in the linearized form, `share_weight`).
    clients : dict
        key -> `ClientEntry` (n_i in S, the round it was added): the acknowledgement.
    sweep : RebuildSweep
        Takes stale shares out of S.
    stats : RoundStats
        Of the round being folded in.

    """

    def __init__(
        self,
        *,
        rho: float,
        regularizer: Regularizer | None,
        eps_abs: float,
        eps_rel: float,
        dual_step: DualStep = 1.0,
        restores: bool = True,
        linearized: bool = False,
    ) -> None:
        check_settings(rho=rho, regularizer=regularizer, eps_abs=eps_abs, eps_rel=eps_rel)
        # gamma: the nodes' u_i += gamma (w_i - z^k), or the rule that sets it from the
        # alignment the nodes report (`AdaptiveDualStep`)
        self.dual_step = check_dual_step_spec(dual_step)
        self.gamma = first_gamma(self.dual_step)  # the gamma the next round sends
        self.rho = float(rho)
        self.regularizer = regularizer
        self.eps_abs, self.eps_rel = float(eps_abs), float(eps_rel)
        self.z: Arrays | None = None
        self.contribution_sum: Arrays | None = None  # S = sum_i omega_i c_i
        self.total_examples = 0.0  # N = sum_i omega_i
        self.clients: dict[str, ClientEntry] = {}
        self.sweep = RebuildSweep()
        self.stats = RoundStats()
        # offer K's shares back (admm-restore): c_i is the whole state only when
        # u_i += 1 (w_i - z) and nothing else is kept (no e_i, b_i)
        self.restores = restores and self.dual_step == 1.0
        self.linearized = linearized  # replies carry b_i (admm-step-budget): omega_i = n_i / b_i

    # ------------------------------------------------------------------ rounds
    def adopt(self, z: Arrays) -> None:
        """Take z as z^k; the first z also sizes S (zeros)."""
        if self.contribution_sum is None:
            self.contribution_sum = [np.zeros_like(t) for t in z]
        self.z = z

    def instructions(self, key: str | None) -> dict[str, int | float | bytes]:
        """Return `key`'s ack round a (0: S holds none of it), rebuild flag and gamma.

        gamma (``admm-dual-step``) is sent only when it is not the textbook 1, and under
        `AdaptiveDualStep` ``admm-align`` = 1 (report the alignment terms). A key
        whose share sigma_i the server kept (K) is offered c_i = sigma_i / n_i
        (``admm-restore``, ``admm-restore-examples``), in case its node lost its state.
        """
        entry = None if key is None else self.clients.get(key)
        step: dict[str, int | float] = {} if self.gamma == 1.0 else {DUAL_STEP: self.gamma}
        if isinstance(self.dual_step, AdaptiveDualStep):
            step[ALIGN] = 1
        if key is None or entry is None:
            return {ACK_ROUND: 0, REBUILD: 0, **step}
        sent: dict[str, int | float | bytes] = {
            ACK_ROUND: entry.last_round,
            REBUILD: int(self.sweep.wants_share(key)),
            **step,
        }
        if self.offers(key):
            share = self.sweep.known[key]
            sent[RESTORE] = restore_payload(share, entry.num_examples)
            sent[RESTORE_EXAMPLES] = entry.num_examples
        return sent

    def offers(self, key: str) -> bool:
        """Return whether `key` is offered its kept share back (``admm-restore``)."""
        entry = self.clients.get(key)
        return (
            self.restores
            and entry is not None
            and entry.num_examples > 0
            and (key in self.sweep.known)
        )

    def problem(
        self, key: str, metrics: Mapping[str, Any], num_examples: object, *, secure: bool = False
    ) -> tuple[str, int] | None:
        """Return (why, 1 if a state mismatch) if the reply breaks the protocol, else None."""
        entry, offered = self.clients.get(key), not secure and self.offers(key)
        return protocol_problem(
            entry, metrics, num_examples, secure=secure, offered=offered, linearized=self.linearized
        )

    def weight(self, num_examples: int, metrics: Mapping[str, Any]) -> float:
        """Return omega_i of an admitted reply: n_i, or n_i / b_i in the linearized form."""
        budget = float(metrics[STEP_BUDGET]) if self.linearized else None
        return share_weight(num_examples, budget)

    def record(
        self, key: str, num_examples: int, server_round: int, *, full: bool, weight: float
    ) -> bool:
        """N += omega_i' - omega_i, entry_i = (n_i', k, omega_i'); True for a resync.

        A resync's old share is taken out of S if the server kept it, else it goes stale.
        """
        assert self.contribution_sum is not None
        entry = self.clients.get(key)
        resync = full and entry is not None
        if entry is not None and resync:
            log(INFO, "FedADMMClientDuals: %s resynchronized (its state was lost)", key)
            if not self.sweep.take_out(key, self.contribution_sum):
                self.sweep.drop(key, entry.weight, self.contribution_sum)
        self.total_examples += weight - (0.0 if entry is None else entry.weight)
        self.clients[key] = ClientEntry(num_examples, server_round, weight)
        return resync

    def fold(
        self,
        key: str,
        change: Sequence[NDArray[np.generic]],
        share: Sequence[NDArray[np.generic]] | None,
        num_examples: int,
        server_round: int,
        metrics: Mapping[str, Any],
        *,
        full: bool,
    ) -> bool:
        """S += Delta_i (and S_new += sigma_i' in a sweep), then `record`; True for a resync.

        A resync's full contribution is kept as the key's known share (`RebuildSweep`).
        """
        assert self.contribution_sum is not None
        restored = metrics.get(RESTORED, 0) == 1  # checked by `problem`: it was offered
        weight, entry = self.weight(num_examples, metrics), self.clients.get(key)
        resync = self.record(key, num_examples, server_round, full=full, weight=weight)
        self.sweep.fold(
            key, self.contribution_sum, change, share, full=full, resync=resync, restored=restored
        )
        flat = (np.asarray(t, dtype=np.float64).reshape(-1) for t in change)
        change_sq = sum(float(a @ a) for a in flat)  # ||Delta_i||^2: the server's own check
        if not self.linearized:
            self.stats.add(num_examples, metrics, change_sq)
        else:  # Delta_i = omega_i (c_i' - c_i) only while b_i stays
            same = entry is not None and entry.weight == weight
            self.stats.add(num_examples, metrics, change_sq if same else None, weight)
        return resync

    def evict(self, keys: Iterable[str]) -> int:
        """Forget `keys`: drop their entries, N -= n_i; take out or sweep out their shares."""
        evicted = 0
        for key in keys:
            entry = self.clients.pop(key, None)
            if entry is None or self.contribution_sum is None:
                continue
            evicted += 1
            self.total_examples -= entry.weight
            if not self.sweep.take_out(key, self.contribution_sum):
                self.sweep.drop(key, entry.weight, self.contribution_sum)
        self.end_sweep()
        return evicted

    def end_sweep(self) -> None:
        """Set S := S_new once every key the server holds has rebuilt."""
        rebuilt = self.sweep.finish(self.clients)
        if rebuilt is not None:
            self.contribution_sum = rebuilt

    def finish_round(self) -> tuple[dict[str, Any], bool]:
        """Take the z-step z = prox_{g/rho}(S / (N + N_stale)); return (metrics, converged).

        Not converged while a sweep is on: S still holds a stale share.
        """
        self.end_sweep()
        weight = self.total_examples + self.sweep.stale_examples
        self.z, metrics, converged = z_round(self, self.stats, weight)
        if isinstance(self.dual_step, AdaptiveDualStep):  # gamma of the next round's step
            metrics[GAMMA] = self.gamma
            self.gamma = self.dual_step.next(self.gamma, self.stats.alignment)
        converged = converged and not self.sweep.active
        metrics[CONVERGED] = int(converged)
        metrics[NUM_CLIENTS_CACHED] = len(self.clients)
        metrics[REBUILDING] = int(self.sweep.active)
        return metrics, converged

    def discard_metrics(self) -> dict[str, Any]:
        """Return the metrics of a round whose replies were all discarded."""
        return {
            RHO: self.rho,
            NUM_CLIENTS_CACHED: len(self.clients),
            REBUILDING: int(self.sweep.active),
        }

    # -------------------------------------------------------------- checkpoints
    def configuration(self, strategy: str) -> dict[str, Any]:
        """Return the configuration a checkpoint must agree with (JSON)."""
        return {
            "strategy": strategy,
            "rho": self.rho,
            "regularizer": None if self.regularizer is None else self.regularizer.describe(),
            "eps_abs": self.eps_abs,
            "eps_rel": self.eps_rel,
            **({} if self.dual_step == 1.0 else {"dual_step": describe_step(self.dual_step)}),
        }

    def state_dict(self) -> tuple[dict[str, NDArray[Any]], dict[str, Any]]:
        """Return z, S, N, the per-key entries (n_i, last round) and the sweep."""
        assert self.z is not None and self.contribution_sum is not None
        arrays: dict[str, NDArray[Any]] = {f"z_{i}": t for i, t in enumerate(self.z)}
        arrays.update({f"s_{i}": t for i, t in enumerate(self.contribution_sum)})
        arrays.update(entry_arrays(self.clients))
        sweep_arrays, sweep_manifest = self.sweep.state_dict()
        manifest = {
            "num_tensors": len(self.z),
            "total_examples": float(self.total_examples),
            "keys": list(self.clients),
            **sweep_manifest,
        }
        if isinstance(self.dual_step, AdaptiveDualStep):
            manifest["gamma"] = self.gamma
        return {**arrays, **sweep_arrays}, manifest

    def load_state_dict(
        self,
        arrays: dict[str, NDArray[Any]],
        manifest: dict[str, Any],
        shapes: Sequence[tuple[int, ...]] | None = None,
    ) -> None:
        """Restore `state_dict` output.

        ValueError, with nothing changed, if z and S disagree, or z's shapes are not
        `shapes` (the model's, when the caller knows them), or an adaptive gamma is missing.
        """
        count = int(manifest["num_tensors"])
        z = [np.asarray(arrays[f"z_{i}"], dtype=np.float64) for i in range(count)]
        s = [np.asarray(arrays[f"s_{i}"], dtype=np.float64) for i in range(count)]
        z_shapes = [t.shape for t in z]
        if [t.shape for t in s] != z_shapes or (shapes is not None and list(shapes) != z_shapes):
            raise ValueError("z, S and the model's shapes disagree")
        if self.linearized and "entry_weights" not in arrays:
            raise ValueError(
                "entry_weights: a linearized-form checkpoint written before S weighed c_i "
                "by n_i / b_i holds shares this version cannot take out; start afresh"
            )
        clients = entries_from_arrays([str(k) for k in manifest["keys"]], arrays)
        adaptive = isinstance(self.dual_step, AdaptiveDualStep)
        gamma = saved_gamma(manifest) if adaptive else self.gamma
        self.sweep.load_state_dict(arrays, manifest, s)
        self.z, self.contribution_sum = z, s
        self.total_examples, self.clients = float(manifest["total_examples"]), clients
        self.gamma = gamma


def check_settings(
    rho: Any,
    regularizer: Any,
    eps_abs: Any,
    eps_rel: Any,
) -> None:
    """Raise ValueError, naming the field and what is allowed, for an unsupported setting."""
    if not _finite_number(rho) or rho <= 0:
        raise ValueError(f"rho: must be a finite number > 0 with client-held duals, got {rho!r}")
    if regularizer is not None and not isinstance(regularizer, Regularizer):
        raise ValueError(f"regularizer: must be L1(...), L2(...) or None, got {regularizer!r}")
    for name, value in (("eps_abs", eps_abs), ("eps_rel", eps_rel)):
        if not _finite_number(value) or value < 0:
            raise ValueError(f"{name}: must be a finite number >= 0, got {value!r}")


def _finite_number(value: Any) -> bool:
    return not isinstance(value, bool) and isinstance(value, int | float) and math.isfinite(value)
