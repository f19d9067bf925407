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

The client side of the protocol lives in `flwr_admm.client.client_duals` and the
reply checks and folding in `flwr_admm.server.client_duals_replies`; their public names are
re-exported here.
"""

from __future__ import annotations

import io
import math
import os
from logging import INFO, WARNING
from pathlib import Path
from typing import Any

import numpy as np
from flwr.common import FitIns, FitRes, Parameters, Scalar, parameters_to_ndarrays
from flwr.common.logger import log
from flwr.server.client_manager import ClientManager
from flwr.server.client_proxy import ClientProxy
from flwr.server.strategy import FedAvg

from flwr_admm.core.kernels import BLOCK, blocks, single_thread_blas
from flwr_admm.core.regularizers import Regularizer
from flwr_admm.core.schedules import Constant
from flwr_admm.core.types import Arrays
from flwr_admm.protocol import MODE_CLIENT, MODE_KEY
from flwr_admm.server.checkpoint import (
    CheckpointError,
    checkpoint_every_value,
    config_differences,
    config_fingerprint,
    has_checkpoint,
    load_checkpoint,
    save_checkpoint,
)
from flwr_admm.server.client_duals_replies import ClientDualsReplyFolding, ClientEntry, RoundStats
from flwr_admm.server.sampling import check_flower_fields, record_round, sample_clients
from flwr_admm.uplink.channel import UplinkChannel
from flwr_admm.uplink.compression import Compressor
from flwr_admm.uplink.wire import NUMPY_TENSOR_TYPE

__all__ = ["FedADMMClientDuals"]

UNSUPPORTED = ("local_dp", "uplink_residual")
STRATEGY = "FedADMMClientDuals"  # in the fingerprinted configuration of its checkpoints


class FedADMMClientDuals(ClientDualsReplyFolding, FedAvg):
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
        super().__init__(**fedavg_kwargs)
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
        if uplink is not None and not isinstance(uplink, Compressor):
            raise ValueError(f"uplink: must be a Compressor or None, got {uplink!r}")
        if uplink is not None and not uplink.error_feedback:
            raise ValueError(
                "uplink: client-held duals need error_feedback=True (S would keep every "
                f"compression error), got {uplink!r}"
            )
        check_flower_fields(self, sampling_seed)
        self.channel = UplinkChannel(uplink)
        self.rho = float(rho)
        self.regularizer = regularizer
        self.eps_abs, self.eps_rel = float(eps_abs), float(eps_rel)
        self.stop_on_convergence = stop_on_convergence
        self.sampling_seed = sampling_seed
        self.z: Arrays | None = None
        self.contribution_sum: Arrays | None = None  # S = sum_i n_i c_i
        self.total_examples = 0  # N = sum_i n_i
        self.clients: dict[str, ClientEntry] = {}
        self.history: list[dict[str, Scalar]] = []
        self.converged = False
        self.last_round = 0
        self._dtypes: list[np.dtype[Any]] = []
        self._key_of_cid: dict[str, str] = {}
        self._broadcast: Parameters | None = None  # what we returned last (z serialized)
        self._round_offset = 0  # rounds done before a resume
        self.checkpoint_every = checkpoint_every_value(checkpoint_every)
        self.checkpoint_dir = None if checkpoint_dir is None else Path(checkpoint_dir)
        if self.checkpoint_dir is not None and resume and has_checkpoint(self.checkpoint_dir):
            self.load_checkpoint(self.checkpoint_dir)

    def __repr__(self) -> str:
        return f"FedADMMClientDuals(rho={self.rho}, regularizer={self.regularizer!r})"

    def initialize_parameters(self, client_manager: ClientManager) -> Parameters | None:
        """The restored z after a resume, else Flower's `initial_parameters`."""
        initial = super().initialize_parameters(client_manager)
        if self.z is None:
            return initial
        if initial is not None:
            shapes = [np.shape(a) for a in parameters_to_ndarrays(initial)]
            if shapes != [t.shape for t in self.z]:
                raise ValueError(
                    f"initial_parameters: shapes {shapes} differ from the checkpoint's "
                    f"{[t.shape for t in self.z]}"
                )
        self._broadcast = _serialize(self.z, self._dtypes)
        return self._broadcast

    # ------------------------------------------------------------------- fit
    def configure_fit(
        self, server_round: int, parameters: Parameters, client_manager: ClientManager
    ) -> list[tuple[ClientProxy, FitIns]]:
        """Send z^k, rho and the mode key, the same FitIns to every sampled client."""
        self._adopt(parameters)
        server_round += self._round_offset
        if self.stop_on_convergence and self.converged:
            log(INFO, "FedADMMClientDuals: converged; no clients sampled")
            return []
        config: dict[str, Scalar] = {}
        if self.on_fit_config_fn is not None:
            config = dict(self.on_fit_config_fn(server_round))
        config.update(self.channel.config())
        config.update({"rho": self.rho, MODE_KEY: MODE_CLIENT, "server_round": server_round})
        clients = sample_clients(
            self, client_manager, server_round, self.sampling_seed, self._key_of_cid
        )
        self.channel.sampled(len(clients), client_manager.num_available())
        fit_ins = FitIns(parameters, config)
        return [(client, fit_ins) for client in clients]

    def aggregate_fit(
        self,
        server_round: int,
        results: list[tuple[ClientProxy, FitRes]],
        failures: list[tuple[ClientProxy, FitRes] | BaseException],
    ) -> tuple[Parameters | None, dict[str, Scalar]]:
        """S += Delta_i, N += change of n_i per valid reply; z = prox_{g/rho}(S / N)."""
        server_round += self._round_offset
        counts: dict[str, Scalar] = {
            "num_failures": len(failures),
            "num_rejected": 0,
            "num_state_mismatch": 0,
        }
        if self.z is None or (not self.accept_failures and failures):
            return None, counts
        with single_thread_blas():
            stats = self._fold_replies(server_round, results, counts)
            if stats.num_replies == 0:
                log(
                    WARNING,
                    "FedADMMClientDuals round %s: no usable reply; z unchanged",
                    server_round,
                )
                return None, {
                    **counts,
                    **self.channel.round_metrics(aggregated=False),
                    "rho": self.rho,
                    "num_clients_known": len(self.clients),
                }
            dz_sq = self._z_step()
        metrics = {
            **self._residuals(stats, dz_sq),
            **counts,
            **self.channel.round_metrics(aggregated=True),
        }
        metrics = record_round(self, server_round, results, metrics)
        self._broadcast = _serialize(self.z, self._dtypes)
        if self.checkpoint_dir is not None and server_round % self.checkpoint_every == 0:
            self.save_checkpoint(self.checkpoint_dir)
        return self._broadcast, metrics

    # ------------------------------------------------------------- checkpoints
    def configuration(self) -> dict[str, Any]:
        """The configuration a checkpoint must agree with (JSON)."""
        return {
            "strategy": STRATEGY,
            "rho": self.rho,
            "regularizer": None if self.regularizer is None else self.regularizer.describe(),
            "eps_abs": self.eps_abs,
            "eps_rel": self.eps_rel,
        }

    def fingerprint(self) -> str:
        """SHA-256 of `configuration`."""
        return config_fingerprint(self.configuration())

    def save_checkpoint(self, path: str | os.PathLike[str]) -> Path:
        """Write z, S, N, the per-key entries, the round and `converged` (atomic, no pickle)."""
        if self.z is None or self.contribution_sum is None:
            raise CheckpointError("checkpoint: nothing to save before the first round")
        keys = list(self.clients)
        arrays: dict[str, Any] = {f"z_{i}": t for i, t in enumerate(self.z)}
        arrays.update({f"s_{i}": t for i, t in enumerate(self.contribution_sum)})
        arrays["entry_examples"] = np.array(
            [self.clients[k].num_examples for k in keys], dtype=np.int64
        )
        arrays["entry_rounds"] = np.array(
            [self.clients[k].last_round for k in keys], dtype=np.int64
        )
        manifest = {
            "fingerprint": self.fingerprint(),
            "configuration": self.configuration(),
            "num_tensors": len(self.z),
            "dtypes": [str(d) for d in self._dtypes],
            "total_examples": int(self.total_examples),
            "keys": keys,
            "key_of_cid": self._key_of_cid,
            "converged": self.converged,
        }
        return save_checkpoint(path, arrays, manifest, self.last_round)

    def load_checkpoint(self, path: str | os.PathLike[str]) -> int:
        """Restore the server state from directory `path`; return its round."""
        arrays, manifest = load_checkpoint(path)
        if manifest.get("fingerprint") != self.fingerprint():
            differences = config_differences(manifest.get("configuration"), self.configuration())
            detail = "; ".join(differences) or "not a FedADMMClientDuals checkpoint"
            raise CheckpointError(
                f"checkpoint: {path} was written with another configuration ({detail}); "
                "refusing to resume"
            )
        try:
            count = int(manifest["num_tensors"])
            z = [np.asarray(arrays[f"z_{i}"], dtype=np.float64) for i in range(count)]
            s = [np.asarray(arrays[f"s_{i}"], dtype=np.float64) for i in range(count)]
            dtypes = [np.dtype(d) for d in manifest["dtypes"]]
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
            last_round = int(manifest["round"])
        except (KeyError, TypeError, ValueError) as error:
            raise CheckpointError(f"checkpoint: {path} is incomplete ({error!r})") from error
        self.z, self.contribution_sum, self._dtypes = z, s, dtypes
        self.total_examples, self.clients = total, clients
        self._key_of_cid = {str(c): str(k) for c, k in manifest.get("key_of_cid", {}).items()}
        self.converged = bool(manifest.get("converged", False))
        self._broadcast = None
        self.last_round = self._round_offset = last_round
        return last_round

    # ----------------------------------------------------------------- helpers
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

    def _z_step(self) -> float:
        """Z <- prox_{g/rho}(S / N) in place, block by block; returns ||z' - z||^2.

        (No model-sized temporary: each block of the new z is compared with the old
        one while both are in cache.)
        """
        assert self.z is not None and self.contribution_sum is not None
        largest = max(t.size for t in self.z)
        new, diff = np.empty(min(BLOCK, largest)), np.empty(min(BLOCK, largest))
        total = 0.0
        for z, s in zip(self.z, self.contribution_sum, strict=True):
            z_flat, s_flat = z.reshape(-1), s.reshape(-1)
            for block in blocks(z_flat.size):
                size = block.stop - block.start
                np.divide(s_flat[block], float(self.total_examples), out=new[:size])
                if self.regularizer is not None:
                    self.regularizer.prox_([new[:size]], self.rho)
                np.subtract(new[:size], z_flat[block], out=diff[:size])
                total += float(np.dot(diff[:size], diff[:size]))
                z_flat[block] = new[:size]
        return total

    def _residuals(self, stats: RoundStats, dz_sq: float) -> dict[str, Scalar]:
        assert self.z is not None
        root_p = math.sqrt(sum(t.size for t in self.z))
        z_norm = math.sqrt(sum(float(np.vdot(t, t)) for t in self.z))
        eps_primal = root_p * self.eps_abs + self.eps_rel * max(stats.w_norm, z_norm)
        eps_dual = root_p * self.eps_abs + self.eps_rel * self.rho * stats.u_norm
        dual = self.rho * math.sqrt(dz_sq)
        metrics: dict[str, Scalar] = {
            "rho": self.rho,
            "dual_residual": dual,
            "eps_primal": eps_primal,
            "eps_dual": eps_dual,
            "num_replies": stats.num_replies,
            "num_delayed_residuals": stats.num_delayed,
            "num_clients_known": len(self.clients),
        }
        previous = stats.previous_primal
        if previous is not None:
            metrics["previous_primal_residual"] = previous
        self.converged = previous is not None and previous <= eps_primal and dual <= eps_dual
        metrics["converged"] = int(self.converged)
        if stats.objective is not None:
            objective = stats.objective
            if self.regularizer is not None:
                objective += self.regularizer.value(self.z)
            metrics["objective"] = objective
        return metrics


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
