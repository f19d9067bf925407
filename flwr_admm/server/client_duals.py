"""FedADMMClientDuals: consensus ADMM with client-held duals (server keeps z, S, N).

Uniform constant rho > 0, scaled dual u_i kept by client i in its ``context.state``.
The server stores the consensus z, S = sum_i n_i c_i and N = sum_i n_i, where
c_i = w_i + u_i is client i's last contribution, plus two small integers per client
key (n_i and the round it last took part in). Round k:

    server   broadcasts z^k (one FitIns for every sampled client)
    client   if it took part before:  d2_i = ||w_i - z^k||^2,  u_i += w_i - z^k
             w_i' ~ argmin f_i(w) + rho/2 ||w - (z^k - u_i)||^2    (inexact local solve)
             sends Delta_i = n_i' (w_i' + u_i) - n_i c_i, then keeps w_i', u_i, n_i'
    server   S += Delta_i, N += n_i' - n_i  (one pass per reply, like FedAvg)
             z^{k+1} = prox_{g/rho}(S / N)

With every client in every round this is exactly server-held FedADMM with constant
rho: the z-step of round k+1 averages w_i^{k+1} + u_i^k with u_i^k updated by z^k.
Under partial participation it is a delayed-dual variant: a client's dual update uses
the z it sees at its next participation, and absent clients count with their
pre-update dual (server-held FedADMM updates u_i with the z of the round it replied).

Residuals. s = rho ||z^{k+1} - z^k|| as usual. The primal residual arrives one round
late: client i reports d2_i for its previous w_i, so the metric
``previous_primal_residual`` = sqrt(sum n_i d2_i / sum n_i) over the replying clients
that had taken part before is server-held FedADMM's primal residual of round k - 1
(with full participation). eps_pri = sqrt(P) eps_abs + eps_rel max(sqrt(sum p_i
||w_i'||^2), ||z^{k+1}||), eps_dual = sqrt(P) eps_abs + eps_rel rho sqrt(sum p_i
||u_i||^2), p_i = n_i / sum of the replies' n.

Lost client state. A reply reports the round of the client's previous participation
(0: none) and its change of n. If either disagrees with the server's record of that
key (e.g. an insecure SuperNode restarted with an empty state under a stable
``partition-id``), the client cannot remove its old contribution from S: the reply is
rejected (``num_state_mismatch``) and S is untouched, but the old n_i c_i stays in S
(a bias) for the rest of the run. Persistent client state (a SuperNode that keeps its
``context.state``, or a key that changes with it) prevents it.

Checkpoints (``checkpoint_dir``) hold z, S, N, the per-key entries, the round and the
convergence flag, plus a fingerprint of the configuration (rho, regularizer, eps_abs,
eps_rel). The duals stay with the clients: a resumed run continues exactly only if the
clients kept their ``context.state`` (persistent SuperNodes); a client that lost it is
rejected as out of sync, as above.

Uplink compression (``uplink=`` a `Compressor`, with error feedback). Client i keeps a
residual e_i (zero at first) in its ``context.state`` next to its dual, compresses
x = Delta_i + e_i, sends the payload and keeps e_i' = x - decode(payload); the server
adds decode(payload) to S (no center: the payload is the contribution change itself).
By telescoping, S = sum_i n_i c_i - sum_i e_i exactly (up to float rounding): the
unsent part waits on the client and enters S with its next reply. ``uplink_bytes``
reports the payload bytes of each round as in `FedADMM`. Local DP is not supported.

Clients MUST follow the protocol above; `ADMMClient` does when the fit config holds
``admm-duals = "client"``.

The client side of the protocol lives in `flwr_admm.client.client_duals`, the reply
checks in `flwr_admm.server.client_duals_replies`, and the round skeleton (sampling,
reply order, duplicate keys, checkpoints) in `flwr_admm.server.base.ConsensusStrategy`.
"""

from __future__ import annotations

import io
import math
import os
from typing import Any, ClassVar

import numpy as np
from flwr.common import FitIns, FitRes, Parameters, Scalar, parameters_to_ndarrays
from flwr.server.client_proxy import ClientProxy
from numpy.typing import NDArray

from flwr_admm.core.kernels import axpy, single_thread_blas
from flwr_admm.core.regularizers import Regularizer
from flwr_admm.core.schedules import Constant
from flwr_admm.core.types import Arrays
from flwr_admm.protocol import (
    CONVERGED,
    DUAL_RESIDUAL,
    EPS_DUAL,
    EPS_PRIMAL,
    EXAMPLES_CHANGE,
    MODE_CLIENT,
    MODE_KEY,
    NUM_CLIENTS_CACHED,
    NUM_DELAYED_RESIDUALS,
    NUM_REPLIES,
    NUM_STATE_MISMATCH,
    OBJECTIVE,
    PREVIOUS_PRIMAL_RESIDUAL,
    RHO,
)
from flwr_admm.server.base import ConsensusStrategy
from flwr_admm.server.client_duals_replies import (
    ClientEntry,
    RoundStats,
    decoded_change,
    protocol_problem,
    z_step,
)
from flwr_admm.uplink.channel import UplinkChannel
from flwr_admm.uplink.compression import Compressor
from flwr_admm.uplink.wire import NUMPY_TENSOR_TYPE

__all__ = ["FedADMMClientDuals"]

UNSUPPORTED = ("local_dp", "uplink_residual")
STRATEGY = "FedADMMClientDuals"  # in the fingerprinted configuration of its checkpoints


class FedADMMClientDuals(ConsensusStrategy):
    """Federated consensus ADMM with client-held duals (see the module docstring).

    Takes every keyword of Flower's `FedAvg` plus:

    Parameters
    ----------
    rho : float
        Constant penalty rho > 0.
    regularizer : Regularizer, optional
        Server regularizer g (`L1`, `L2`); the z-step is prox_{g/rho}(S / N).
    eps_abs, eps_rel : float
        Tolerances of Boyd's stopping thresholds eps_pri / eps_dual.
    stop_on_convergence : bool
        Sample no clients once r_prev <= eps_pri and s <= eps_dual.
    sampling_seed : int or None
        Seeded client sampling as in `FedADMM`; None uses Flower's unseeded sampling.
    checkpoint_dir : path, optional
        Write the server state (z, S, N, per-key n_i and last round, round, converged,
        config fingerprint) there after every `checkpoint_every` aggregations. If it
        already holds a checkpoint and `resume` is true, start from it; round numbers
        continue. The clients' duals are not in it: they must keep their state.
    checkpoint_every : int
        Aggregations between checkpoints.
    resume : bool
        Resume from an existing checkpoint in `checkpoint_dir` (a mismatched or
        damaged checkpoint is an error, never a silent fresh start).
    uplink : Compressor, optional
        Uplink compression of the clients' contribution changes (`StochasticQuantizer`,
        `TopK`), with error feedback (required: ``error_feedback=False`` is refused,
        since S would keep every compression error). Each client keeps its residual
        e_i in its ``context.state``; S = sum_i n_i c_i - sum_i e_i. The round metric
        ``uplink_bytes`` counts the payload bytes. ``local_dp`` and
        ``uplink_residual`` are not supported (use `FedADMM`).
    rho_schedule, client_rho, relaxation :
        Accepted only at their defaults (None, "uniform", 1): a changing or per-client
        rho, or over-relaxation, would need every client's dual, which the server
        does not hold. Use `FedADMM` for them.

    """

    label: ClassVar[str] = STRATEGY
    counters: ClassVar[tuple[str, ...]] = (NUM_STATE_MISMATCH,)

    def __init__(
        self,
        *,
        rho: float = 1.0,
        regularizer: Regularizer | None = None,
        eps_abs: float = 1e-6,
        eps_rel: float = 1e-4,
        stop_on_convergence: bool = False,
        sampling_seed: int | None = 0,
        rho_schedule: Any = None,
        client_rho: str = "uniform",
        relaxation: float = 1.0,
        checkpoint_dir: str | os.PathLike[str] | None = None,
        checkpoint_every: int = 1,
        resume: bool = True,
        uplink: Compressor | None = None,
        **fedavg_kwargs: Any,
    ) -> None:
        for name in UNSUPPORTED:
            if name in fedavg_kwargs:
                raise ValueError(
                    f"{name}: not supported by FedADMMClientDuals (client-held duals); use FedADMM"
                )
        super().__init__(
            channel=UplinkChannel(_checked_uplink(uplink)),
            stop_on_convergence=stop_on_convergence,
            sampling_seed=sampling_seed,
            checkpoint_dir=checkpoint_dir,
            checkpoint_every=checkpoint_every,
            **fedavg_kwargs,
        )
        _check_unsupported(rho_schedule, client_rho, relaxation)
        if isinstance(rho, bool) or not (
            isinstance(rho, int | float) and math.isfinite(rho) and rho > 0
        ):
            raise ValueError(
                f"rho: must be a finite number > 0 with client-held duals, got {rho!r}"
            )
        if regularizer is not None and not isinstance(regularizer, Regularizer):
            raise ValueError(f"regularizer: must be L1(...), L2(...) or None, got {regularizer!r}")
        for name, value in (("eps_abs", eps_abs), ("eps_rel", eps_rel)):
            if not (isinstance(value, int | float) and math.isfinite(value) and value >= 0):
                raise ValueError(f"{name}: must be a finite number >= 0, got {value!r}")
        self.rho = float(rho)
        self.regularizer = regularizer
        self.eps_abs, self.eps_rel = float(eps_abs), float(eps_rel)
        self.z: Arrays | None = None
        self.contribution_sum: Arrays | None = None  # S = sum_i n_i c_i
        self.total_examples = 0  # N = sum_i n_i
        self.clients: dict[str, ClientEntry] = {}
        self._broadcast: Parameters | None = None  # what we returned last (z serialized)
        self._stats = RoundStats()  # of the round being folded in
        self._resume(resume)

    def __repr__(self) -> str:
        return f"FedADMMClientDuals(rho={self.rho}, regularizer={self.regularizer!r})"

    # ------------------------------------------------------------------- fit
    def _fit_instructions(
        self, clients: list[ClientProxy], parameters: Parameters, config: dict[str, Scalar]
    ) -> list[tuple[ClientProxy, FitIns]]:
        """Send z^k, rho and the mode key, the same FitIns to every sampled client."""
        fit_ins = FitIns(parameters, {**config, RHO: self.rho, MODE_KEY: MODE_CLIENT})
        return [(client, fit_ins) for client in clients]

    def _open_round(self, keys: list[str]) -> None:
        self._stats = RoundStats()

    def _fold_reply(
        self,
        key: str,
        proxy: ClientProxy,
        res: FitRes,
        server_round: int,
        counts: dict[str, Scalar],
    ) -> bool:
        """Add Delta_i to S and n_i' - n_i to N for a reply that keeps the protocol."""
        assert self.contribution_sum is not None
        report = protocol_problem(self.clients.get(key), res)
        if report is not None:
            problem, mismatch = report
            self._reject(key, problem, counts)
            counts[NUM_STATE_MISMATCH] = int(counts[NUM_STATE_MISMATCH]) + mismatch
            return False
        problem_or_none, delta = decoded_change(self.channel, res, self.contribution_sum)
        if problem_or_none is not None:
            self._reject(key, problem_or_none, counts)
            return False
        for acc, change in zip(self.contribution_sum, delta, strict=True):
            axpy(1.0, np.asarray(change, dtype=np.float64), acc)
        self.total_examples += int(res.metrics[EXAMPLES_CHANGE])
        self.clients[key] = ClientEntry(int(res.num_examples), server_round)
        self._key_of_cid[proxy.cid] = key
        self._stats.add(res)
        return True

    def _discard_round(self) -> dict[str, Scalar]:
        return {RHO: self.rho, NUM_CLIENTS_CACHED: len(self.clients)}

    def _finish_round(self, server_round: int) -> dict[str, Scalar]:
        """Take the z-step z = prox_{g/rho}(S / N); return the round's residuals."""
        assert self.z is not None and self.contribution_sum is not None
        with single_thread_blas():
            dz_sq = z_step(
                self.z, self.contribution_sum, self.total_examples, self.regularizer, self.rho
            )
        return self._residuals(self._stats, dz_sq)

    def _residuals(self, stats: RoundStats, dz_sq: float) -> dict[str, Scalar]:
        """Compute s = rho ||z' - z||, the delayed r, eps_pri and eps_dual; set `converged`."""
        assert self.z is not None
        root_p = math.sqrt(sum(t.size for t in self.z))
        z_norm = math.sqrt(sum(float(np.vdot(t, t)) for t in self.z))
        eps_primal = root_p * self.eps_abs + self.eps_rel * max(stats.w_norm, z_norm)
        eps_dual = root_p * self.eps_abs + self.eps_rel * self.rho * stats.u_norm
        dual = self.rho * math.sqrt(dz_sq)
        metrics: dict[str, Scalar] = {
            RHO: self.rho,
            DUAL_RESIDUAL: dual,
            EPS_PRIMAL: eps_primal,
            EPS_DUAL: eps_dual,
            NUM_REPLIES: stats.num_replies,
            NUM_DELAYED_RESIDUALS: stats.num_delayed,
            NUM_CLIENTS_CACHED: len(self.clients),
        }
        previous = stats.previous_primal
        if previous is not None:
            metrics[PREVIOUS_PRIMAL_RESIDUAL] = previous
        self.converged = previous is not None and previous <= eps_primal and dual <= eps_dual
        metrics[CONVERGED] = int(self.converged)
        if stats.objective is not None:
            objective = stats.objective
            if self.regularizer is not None:
                objective += self.regularizer.value(self.z)
            metrics[OBJECTIVE] = objective
        return metrics

    # ----------------------------------------------------------------- state
    def _consensus(self) -> Arrays | None:
        return self.z

    def _serialized_consensus(self) -> Parameters:
        assert self.z is not None
        self._broadcast = _serialize(self.z, self._dtypes)
        return self._broadcast

    def _adopt(self, parameters: Parameters) -> None:
        """Take the broadcast z as z^k (decoded unless it is what we returned)."""
        if parameters is self._broadcast and self.z is not None:
            return
        received = parameters_to_ndarrays(parameters)
        z = [np.array(t, dtype=np.float64) for t in received]
        if self.z is None:
            self._dtypes = [np.asarray(t).dtype for t in received]
            self.contribution_sum = [np.zeros_like(t) for t in z]
        elif [t.shape for t in z] != [t.shape for t in self.z]:
            raise ValueError(
                f"parameters: expected shapes {[t.shape for t in self.z]}, "
                f"got {[t.shape for t in z]}"
            )
        self.z = z

    # ------------------------------------------------------------- checkpoints
    def configuration(self) -> dict[str, Any]:
        """Return the configuration a checkpoint must agree with (JSON)."""
        return {
            "strategy": STRATEGY,
            "rho": self.rho,
            "regularizer": None if self.regularizer is None else self.regularizer.describe(),
            "eps_abs": self.eps_abs,
            "eps_rel": self.eps_rel,
        }

    def _state_dict(self) -> tuple[dict[str, NDArray[Any]], dict[str, Any]]:
        """Return z, S, N and the per-key entries (n_i, last round)."""
        assert self.z is not None and self.contribution_sum is not None
        keys = list(self.clients)
        arrays: dict[str, NDArray[Any]] = {f"z_{i}": t for i, t in enumerate(self.z)}
        arrays.update({f"s_{i}": t for i, t in enumerate(self.contribution_sum)})
        arrays["entry_examples"] = np.array(
            [self.clients[k].num_examples for k in keys], dtype=np.int64
        )
        arrays["entry_rounds"] = np.array(
            [self.clients[k].last_round for k in keys], dtype=np.int64
        )
        manifest = {
            "num_tensors": len(self.z),
            "total_examples": int(self.total_examples),
            "keys": keys,
        }
        return arrays, manifest

    def _load_state_dict(
        self, arrays: dict[str, NDArray[Any]], manifest: dict[str, Any], dtypes: list[np.dtype[Any]]
    ) -> None:
        count = int(manifest["num_tensors"])
        z = [np.asarray(arrays[f"z_{i}"], dtype=np.float64) for i in range(count)]
        s = [np.asarray(arrays[f"s_{i}"], dtype=np.float64) for i in range(count)]
        keys = [str(k) for k in manifest["keys"]]
        examples, rounds = arrays["entry_examples"], arrays["entry_rounds"]
        if [t.shape for t in s] != [t.shape for t in z] or len(dtypes) != count:
            raise ValueError("z, S and dtypes disagree")
        if examples.shape != (len(keys),) or rounds.shape != (len(keys),):
            raise ValueError("entries and keys disagree")
        clients = {
            key: ClientEntry(int(n), int(r))
            for key, n, r in zip(keys, examples.tolist(), rounds.tolist(), strict=True)
        }
        total = int(manifest["total_examples"])
        self.z, self.contribution_sum = z, s
        self.total_examples, self.clients = total, clients
        self._broadcast = None


def _checked_uplink(uplink: Compressor | None) -> Compressor | None:
    if uplink is not None and not isinstance(uplink, Compressor):
        raise ValueError(f"uplink: must be a Compressor or None, got {uplink!r}")
    if uplink is not None and not uplink.error_feedback:
        raise ValueError(
            "uplink: client-held duals need error_feedback=True (S would keep every "
            f"compression error), got {uplink!r}"
        )
    return uplink


def _check_unsupported(rho_schedule: Any, client_rho: str, relaxation: float) -> None:
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


def _serialize(arrays: Arrays, dtypes: list[np.dtype[Any]]) -> Parameters:
    """`ndarrays_to_parameters` with one copy per tensor instead of ~two (same bytes)."""
    tensors = []
    for array, dtype in zip(arrays, dtypes, strict=True):
        array = np.asarray(array, dtype=dtype, order="C")  # keeps 0-d arrays 0-d
        header = io.BytesIO()
        np.lib.format.write_array_header_1_0(
            header, np.lib.format.header_data_from_array_1_0(array)
        )
        tensors.append(b"".join([header.getvalue(), array.reshape(-1).view(np.uint8).data]))
    return Parameters(tensors=tensors, tensor_type=NUMPY_TENSOR_TYPE)
