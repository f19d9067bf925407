"""FedADMM: Flower strategy for inexact consensus ADMM with server-held duals.

The strategy is a thin adapter over `flwr_admm.core.consensus.ConsensusADMM`:

- ``configure_fit`` sends client i its prox center v_i = z - u_i as the parameters and
  ``rho`` (and ``proximal_mu`` = rho) in the config. An unmodified FedProx client, one
  that starts at the received parameters and adds proximal_mu/2 ||w - received||^2,
  therefore runs a valid inexact ADMM w-step with FedADMM out of the box.
- ``aggregate_fit`` validates every reply, keys it by the client's ``client-key`` or
  ``partition-id`` metric (else ``ClientProxy.cid``), accepts it only from the node
  that key is bound to (``key_binding``), and runs the z- and dual steps.

Clients MUST minimize (approximately) f_i(w) + rho/2 ||w - v_i||^2 and return w_i.

The round skeleton (sampling, reply order, client identity and eviction, duplicate
keys, checkpoints) is `flwr_admm.server.base.ConsensusStrategy`; this module fills in
its hooks.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from functools import partial
from logging import INFO
from typing import Any, ClassVar

import numpy as np
from flwr.common import FitIns, NDArrays, Parameters, Scalar, parameters_to_ndarrays
from flwr.common.logger import log
from flwr.server.client_proxy import ClientProxy
from numpy.typing import NDArray

from flwr_admm.core import DEFAULT_HEALTH, HealthCheck, RhoSchedule
from flwr_admm.core.acceleration import DEFAULT_ETA
from flwr_admm.core.backend import Kernels
from flwr_admm.core.consensus import ClientRho, ConsensusADMM
from flwr_admm.core.regularizers import Regularizer
from flwr_admm.core.settings import (
    DEFAULT_ACCELERATION,
    SETTING_VIEWS,
    ConsensusSettings,
    SettingView,
    strategy_defaults,
)
from flwr_admm.core.tensor_policy import TensorSplit, absorb_together, check_rules, roles_of
from flwr_admm.core.types import NON_FINITE, Arrays, Reply, StateDtype
from flwr_admm.core.validation import check_reply
from flwr_admm.core.z_average import ZAverage
from flwr_admm.protocol import LOSS, NUM_CLIENTS_CACHED, NUM_RESYNCED, PROXIMAL_MU, RHO
from flwr_admm.server.base import ConsensusStrategy
from flwr_admm.server.report import report_metrics
from flwr_admm.server.sampling import KeyedReply
from flwr_admm.uplink.channel import Residual, UplinkChannel
from flwr_admm.uplink.compression import Compressor
from flwr_admm.uplink.privacy import LocalDP
from flwr_admm.uplink.wire import to_parameters

__all__ = ["FedADMM"]


class FedADMM(ConsensusStrategy):
    """Federated inexact consensus ADMM (server-held duals).

    Takes every keyword of Flower's `FedAvg` plus:

    Parameters
    ----------
    rho : float
        Penalty rho >= 0 (rho = 0 reproduces FedAvg).
    rho_schedule : RhoSchedule or str, optional
        `Constant`, `Geometric`, `StallIncrease`, `ResidualBalancing`, or one of their
        names. None (default): `ResidualBalancing()` from rho when rho > 0, else
        `Constant()`.
    regularizer : Regularizer, optional
        Server regularizer g (`L1`, `L2`); the z-step is its prox.
    client_rho : {"uniform", "data_size"}
        rho_i = rho or rho * n_i / max_j n_j.
    eps_abs, eps_rel : float
        Tolerances of Boyd's stopping thresholds eps_pri / eps_dual.
    relaxation : float or None
        Over-relaxation alpha in (0, 2) (Boyd et al. 2011, 3.4.3): replies enter the
        z-step and the dual step as alpha w_i + (1 - alpha) z. 1 is plain ADMM.
        None (default): 1.6 when rho > 0, else 1.
    acceleration : {None, "nesterov", "goldstein", "anderson"}
        Fast ADMM with restart (Goldstein et al. 2014; `flwr_admm.core.acceleration`):
        z and the replying clients' duals are extrapolated between rounds, restarting
        when the combined residual grows; "nesterov" restarts from the current point
        (use it with partial participation), "goldstein" from the previous one.
        "anderson": Anderson acceleration of the round map (`flwr_admm.core.anderson`),
        for full participation and deterministic local solvers (docs/tuning.md).
        "nesterov" by default; None is plain ADMM. No effect with rho = 0.
        Defaults measured with ``python -m benchmarks.defaults`` (docs/tuning.md); the
        textbook iteration is ``rho_schedule=Constant(), relaxation=1,
        acceleration=None``.
    restart_eta : float
        Restart when c_k >= restart_eta c_{k-1}; in (0, 1].
    state_dtype : {"float64", "float32"}
        Storage of the cached w_i, y_i, y_i,prev (z and the sums stay float64);
        "float32" halves the server's per-client memory, the optimum is reached up to
        float32 rounding (~1e-7 relative). Part of the checkpoint fingerprint.
    kernels : {"auto", "numpy", "numba"}
        numba's fused kernels ("auto": if installed) or numpy's (`ConsensusSettings`).
    z_average : {"cached", "replies"}
        The z-step averages the last w_i of every client seen ("cached", default) or
        only the round's replies (as FedDyn): faster with partial participation
        (docs/peers.md), the same with every client replying. Fingerprinted if set.
    stop_on_convergence : bool
        Sample no clients once r <= eps_pri and s <= eps_dual.
    sampling_seed : int or None
        Seeded client sampling (clients ordered by key, then cid); None uses
        Flower's unseeded `ClientManager.sample`.
    checkpoint_dir : path, optional
        Write the server state (z, duals, cached w_i, weights, rho and schedule state,
        round, config fingerprint) there after every `checkpoint_every` aggregations.
        If it already holds a checkpoint and `resume` is true, start from it.
    checkpoint_every : int
        Aggregations between checkpoints.
    resume : bool
        Resume from an existing checkpoint in `checkpoint_dir` (a mismatched or
        damaged checkpoint is an error, never a silent fresh start).
    uplink : Compressor, optional
        Compress client updates w_i - v_i (`StochasticQuantizer`, `TopK`); replies are
        decoded against the center each client was sent before validation.
    uplink_residual : {"update", "dual"}
        Where a client's compression residual goes (with ``error_feedback``): into its
        next update (error feedback, default) or into its share of the dual.
    local_dp : LocalDP, optional
        Clients clip w_i - v_i to norm C and add N(0, (sigma C)^2); ``dp_epsilon`` is
        reported every round (`flwr_admm.uplink.privacy`).
    key_binding : {"node", "authenticated", "reported"}
        "node" (default): a client key is accepted only from the node it was first
        accepted from; a conflicting claim is rejected (``num_key_conflicts``) and the
        owner's dual untouched; a key whose node left the federation restarts fresh
        under its new node. "authenticated" (SuperNode authentication on: node ids are
        fixed by registered keys): never rebound, so no node can take over an absent
        node's key. "reported": trust reported keys (a returning key keeps its
        dual under any node id, ``num_resynced``); only for trusted deployments. See
        `ConsensusStrategy`.
    max_client_age : int or None
        Evict (forget w_i, u_i, n_i; re-sum exactly) a client key whose last accepted
        reply is more than this many rounds old. None (default): never.
    max_clients : int or None
        Keep at most this many client keys, evicting the least recently heard (ties in
        key order) before each round. None (default): no limit.
    tensor_policy : mapping, optional
        ``{name pattern: role}`` with roles ``"consensus"`` (ADMM), ``"average"``
        (FedAvg, no dual) or ``"keep"`` (never changed); unmatched tensors: integer
        dtypes keep, ``*running_mean`` / ``*running_var`` average, the rest consensus
        (`flwr_admm.core.tensor_policy`).
    tensor_names : sequence of str, optional
        The names the patterns match (e.g. ``list(model.state_dict())``); default
        ``"0"``, ``"1"``, ... (legacy parameters carry no names).
    health : HealthCheck or None
        Divergence watchdog (`flwr_admm.core.health`, `ConsensusStrategy`); None: off.

    """

    label: ClassVar[str] = "FedADMM"
    counters: ClassVar[tuple[str, ...]] = (NUM_RESYNCED,)
    # Read-only views of `admm_settings` (`ConsensusSettings`), the core's settings.
    rho, rho_schedule, regularizer, client_rho, eps_abs, eps_rel, relaxation = SETTING_VIEWS
    acceleration: SettingView[str | None] = SettingView()
    restart_eta: SettingView[float] = SettingView()
    state_dtype: SettingView[StateDtype] = SettingView()

    def __init__(
        self,
        *,
        rho: float = 1.0,
        rho_schedule: RhoSchedule | str | None = None,
        regularizer: Regularizer | None = None,
        client_rho: ClientRho = "uniform",
        eps_abs: float = 1e-6,
        eps_rel: float = 1e-4,
        relaxation: float | None = None,
        acceleration: str | None = DEFAULT_ACCELERATION,
        restart_eta: float = DEFAULT_ETA,
        state_dtype: StateDtype = "float64",
        kernels: Kernels = "auto",
        z_average: ZAverage = "cached",
        stop_on_convergence: bool = False,
        sampling_seed: int | None = 0,
        checkpoint_dir: str | os.PathLike[str] | None = None,
        checkpoint_every: int = 1,
        resume: bool = True,
        uplink: Compressor | None = None,
        uplink_residual: Residual = "update",
        local_dp: LocalDP | None = None,
        key_binding: str = "node",
        max_client_age: int | None = None,
        max_clients: int | None = None,
        tensor_policy: Mapping[str, str] | None = None,
        tensor_names: Sequence[str] | None = None,
        health: HealthCheck | None = DEFAULT_HEALTH,
        **fedavg_kwargs: Any,
    ) -> None:
        self.tensor_rules = check_rules(tensor_policy)
        self.tensor_names = None if tensor_names is None else [str(n) for n in tensor_names]
        self.tensors: TensorSplit | None = None  # the non-consensus tensors, from the first z
        super().__init__(
            channel=UplinkChannel(uplink, local_dp, uplink_residual),
            stop_on_convergence=stop_on_convergence,
            sampling_seed=sampling_seed,
            checkpoint_dir=checkpoint_dir,
            checkpoint_every=checkpoint_every,
            key_binding=key_binding,
            max_client_age=max_client_age,
            max_clients=max_clients,
            health=health,
            **fedavg_kwargs,
        )
        schedule, alpha = strategy_defaults(rho, rho_schedule, relaxation)
        self.admm_settings = ConsensusSettings(
            rho=rho,
            rho_schedule=schedule,
            regularizer=regularizer,
            client_rho=client_rho,
            eps_abs=eps_abs,
            eps_rel=eps_rel,
            relaxation=alpha,
            acceleration=acceleration,
            restart_eta=restart_eta,
            state_dtype=state_dtype,
            kernels=kernels,
            z_average=z_average,
        )
        self.admm: ConsensusADMM | None = None
        self._sent_key: dict[str, str | None] = {}  # cid -> key whose center it was sent
        self._sent_rho: dict[str, float] = {}  # cid -> the rho_i its center was built with
        self._resume(resume)

    def __repr__(self) -> str:
        schedule = type(self.rho_schedule).__name__
        return (
            f"FedADMM(rho={self.rho}, rho_schedule={schedule}, "
            f"regularizer={self.regularizer!r}, relaxation={self.relaxation}, "
            f"acceleration={self.acceleration!r})"
        )

    # ------------------------------------------------------------------- fit
    def _fit_instructions(
        self, clients: list[ClientProxy], parameters: Parameters, config: dict[str, Scalar]
    ) -> list[tuple[ClientProxy, FitIns]]:
        """Send each sampled client its center v_i = z - u_i and its rho_i."""
        admm = self.admm
        assert admm is not None
        instructions = []
        for client in clients:
            key = self._key_of_cid.get(client.cid)
            center = admm.center(key)
            rho_i = admm.rho_for(key)
            payload = parameters if center is admm.z else self._to_parameters(self._merge(center))
            self._sent_key[client.cid] = key if key in admm.records else None
            self._sent_rho[client.cid] = rho_i
            fit_config = {**config, RHO: rho_i, PROXIMAL_MU: rho_i}
            instructions.append((client, FitIns(payload, fit_config)))
        return instructions

    def _open_round(self, keys: list[str]) -> None:
        assert self.admm is not None and self.tensors is not None
        self.admm.begin(keys)
        self.tensors.begin()

    def _fold_reply(self, keyed: KeyedReply, server_round: int, counts: dict[str, Scalar]) -> bool:
        """Absorb w_i, n_i (and f_i(w_i)) of one checked reply into the open round."""
        return self._fold_all([keyed], server_round, counts)[0]

    def _fold_all(
        self, replies: list[KeyedReply], server_round: int, counts: dict[str, Scalar]
    ) -> list[bool]:
        """Check every reply, then absorb the usable ones together (`absorb_together`).

        A compressed reply decodes into a new model-sized array: those are folded one
        at a time, each before the next is decoded.
        """
        if self.channel.compressor is not None and len(replies) > 1:
            return super()._fold_all(replies, server_round, counts)
        assert self.admm is not None and self.tensors is not None
        prepared = [self._prepared(keyed, counts) for keyed in replies]
        usable = [p for p in prepared if p is not None]
        refuse = partial(self._reject, problem=NON_FINITE, counts=counts)
        folded = iter(absorb_together(self.admm.absorb_all, self.tensors, usable, refuse))
        return [p is not None and next(folded) for p in prepared]

    def _prepared(
        self, keyed: KeyedReply, counts: dict[str, Scalar]
    ) -> tuple[Reply, NDArrays] | None:
        """Return a checked reply's consensus part and all its arrays; None if rejected."""
        key, proxy, res = keyed
        admm, split = self.admm, self.tensors
        assert admm is not None and split is not None
        checked = self._checked(keyed, split.shapes, counts)
        if checked is None:
            return None
        if admm.rho > 0 and key in admm.records and self._sent_key.get(proxy.cid) != key:
            # It trained around a center that was not its own (key_binding="reported",
            # new node id after a restart): keep its dual and cached share, send the
            # right center next round.
            log(INFO, "%s: %s re-identified under cid %s; resynced", self.label, key, proxy.cid)
            self.binding.bind(key, proxy.cid, self._clock)
            counts[NUM_RESYNCED] = int(counts[NUM_RESYNCED]) + 1
            return None
        loss = res.metrics.get(LOSS)
        finite = isinstance(loss, int | float) and math.isfinite(loss)
        objective = float(loss) if finite and isinstance(loss, int | float) else None
        arrays, sq_norm = checked
        if not split.trivial:  # only the consensus tensors go to the core
            if not split.finite(arrays):
                self._reject(key, NON_FINITE, counts)
                return None
            sq_norm = None
        n = int(res.num_examples)
        return Reply(key, split.consensus(arrays), n, objective, sq_norm), arrays

    def _checked(
        self, keyed: KeyedReply, shapes: list[tuple[int, ...]], counts: dict[str, Scalar]
    ) -> tuple[NDArrays, float | None] | None:
        """Decode a reply against its center and check its structure; None if rejected.

        NaN/inf entries are left to `ConsensusADMM.absorb_all`, which finds them in
        the pass that folds the reply in.
        """
        key, proxy, res = keyed
        try:
            arrays = self.channel.decode(res.parameters, partial(self._sent, proxy.cid))
            problem, sq_norm = check_reply(arrays, res.num_examples, shapes, finite=False)
        except Exception as error:  # a malformed reply must not stop the server
            problem, sq_norm = f"unreadable reply ({error!r})", None
        if problem is not None:
            self._reject(key, problem, counts)
            return None
        return arrays, sq_norm

    def _sent(self, cid: str) -> NDArrays:
        """Return the center client `cid` was sent this round, as it received it.

        Recomputed: z, the dual and the dtypes stay within a round; rho_i is the one
        sent (an eviction under ``client_rho="data_size"`` may have changed it since).
        """
        admm = self.admm
        assert admm is not None
        key = self._sent_key.get(cid)
        center = admm.center(key, self._sent_rho.get(cid, admm.rho_for(key)))  # as sent
        return [
            np.asarray(np.asarray(c, dtype=d), dtype=np.float64)
            for c, d in zip(self._merge(center), self._dtypes, strict=True)
        ]

    def _evict(self, keys: list[str]) -> None:
        """Forget `keys`: w_i, y_i, n_i leave the sums, re-summed exactly in key order."""
        assert self.admm is not None
        self.admm.evict(keys)
        gone = set(keys)
        for cid, key in self._sent_key.items():
            if key in gone:
                self._sent_key[cid] = None

    def _discard_round(self) -> dict[str, Scalar]:
        assert self.admm is not None and self.tensors is not None
        self.admm.cancel()
        self.tensors.begin()
        return {RHO: self.admm.rho, NUM_CLIENTS_CACHED: len(self.admm.records)}

    def _finish_round(self, server_round: int) -> dict[str, Scalar]:
        """Take z = prox(sum_i p_i (w_i + u_i)), u_i += w_i - z; return residuals, next rho."""
        assert self.admm is not None and self.tensors is not None
        report = self.admm.finish(server_round)
        self.tensors.finish()
        self.converged = report.converged
        return report_metrics(report)

    # ----------------------------------------------------------------- state
    def _consensus(self) -> Arrays | None:
        return None if self.admm is None else self._merge(self.admm.z)

    def _serialized_consensus(self) -> Parameters:
        assert self.admm is not None
        return self._to_parameters(self._merge(self.admm.z))

    def _adopt(self, parameters: Parameters) -> None:
        z = parameters_to_ndarrays(parameters)
        if self.admm is None or self.tensors is None:
            self._dtypes = [np.asarray(t).dtype for t in z]
            self.tensors = self._split(z)
            self.admm = self.admm_settings.new_admm(self.tensors.consensus(z))
        else:
            self.tensors.adopt(z)
            self.admm.adopt_consensus(self.tensors.consensus(z))

    def _split(self, z: NDArrays) -> TensorSplit:
        """Return the `TensorSplit` of z's tensors under `tensor_policy`."""
        names = (
            self.tensor_names if self.tensor_names is not None else [str(i) for i in range(len(z))]
        )
        if len(names) != len(z):
            raise ValueError(f"tensor_names: expected {len(z)} names, got {len(names)}")
        roles = roles_of(self.tensor_rules, names, [np.asarray(t).dtype for t in z])
        return TensorSplit(roles, z)

    def _merge(self, consensus: Arrays) -> Arrays:
        """Return the full tensor list: the core's consensus tensors and the held ones."""
        return consensus if self.tensors is None else self.tensors.merge(consensus)

    def _to_parameters(self, arrays: NDArrays) -> Parameters:
        return to_parameters(arrays, self._dtypes)  # Flower's bytes, one copy

    # ------------------------------------------------------------- checkpoints
    def configuration(self) -> dict[str, Any]:
        """Return rho, rho_schedule, regularizer, client_rho, eps, relaxation (JSON).

        `ConsensusStrategy.settings` adds sampling, identity, uplink and local DP.
        """
        described = {"strategy": self.label, **self.admm_settings.describe()}
        if self.tensor_rules or self.tensor_names is not None:  # absent: old checkpoints load
            described["tensor_policy"] = [list(rule) for rule in self.tensor_rules]
            described["tensor_names"] = self.tensor_names
        return described

    def _state_dict(self) -> tuple[dict[str, NDArray[Any]], dict[str, Any]]:
        """Return z, every cached w_i and dual, the sums, rho, schedule and privacy ledger."""
        assert self.admm is not None
        arrays, meta = self.admm.state_dict()
        ledger = self.channel.ledger
        assert self.tensors is not None
        arrays.update({f"tensors.{i}": t for i, t in self.tensors.held.items()})
        manifest = {
            "tensor_roles": list(self.tensors.roles),
            "admm": meta,
            "sent_key": self._sent_key,
            "privacy": ledger.state_dict() if ledger is not None else {},
        }
        return arrays, manifest

    def _load_state_dict(
        self, arrays: dict[str, NDArray[Any]], manifest: dict[str, Any], dtypes: list[np.dtype[Any]]
    ) -> None:
        meta = manifest["admm"]
        admm = self.admm_settings.new_admm([np.zeros(tuple(shape)) for shape in meta["shapes"]])
        admm.load_state_dict(arrays, meta)
        roles = manifest.get("tensor_roles") or ["consensus"] * len(admm.z)
        held = iter(admm.z)
        z = [
            arrays[f"tensors.{i}"] if r != "consensus" else next(held) for i, r in enumerate(roles)
        ]
        self.admm, self.tensors = admm, TensorSplit(roles, z)
        self._sent_key = dict(manifest.get("sent_key", {}))
        if self.channel.ledger is not None:
            self.channel.ledger.load_state_dict(manifest.get("privacy", {}))
