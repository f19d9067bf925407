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
from logging import INFO, WARNING
from typing import Any, ClassVar

import numpy as np
from flwr.common import FitIns, NDArrays, Parameters, Scalar, parameters_to_ndarrays
from flwr.common.logger import log
from flwr.server.client_proxy import ClientProxy
from numpy.typing import NDArray

from flwr_admm.core import HealthCheck, RhoSchedule
from flwr_admm.core.acceleration import DEFAULT_ETA
from flwr_admm.core.consensus import ClientRho, ConsensusADMM
from flwr_admm.core.health import DEFAULT_HEALTH
from flwr_admm.core.linearized import (
    FormSpec,
    budget_scale,
    check_form,
    dual_tensors,
    strategy_settings,
)
from flwr_admm.core.regularizers import Regularizer
from flwr_admm.core.settings import DEFAULT_ACCELERATION
from flwr_admm.core.snapshot import restore, snapshot
from flwr_admm.core.start_marks import StartMarks
from flwr_admm.core.tensor_policy import (
    TensorSplit,
    absorb_together,
    check_rules,
    nonnegative_of,
    roles_of,
)
from flwr_admm.core.types import NON_FINITE, Arrays, Reply
from flwr_admm.core.validation import check_reply
from flwr_admm.core.z_average import ZAverage
from flwr_admm.protocol import (
    FORM,
    FORM_LINEARIZED,
    LOSS,
    NUM_CLIENTS_CACHED,
    NUM_RESYNCED,
    NUM_STOCK_REPLIES,
    PROXIMAL_MU,
    RHO,
    START_TENSORS,
)
from flwr_admm.rounds.report import report_metrics
from flwr_admm.server.base import ConsensusStrategy
from flwr_admm.server.sampling import KeyedReply
from flwr_admm.uplink.channel import Residual, UplinkChannel
from flwr_admm.uplink.compression import Compressor
from flwr_admm.uplink.privacy import LocalDP
from flwr_admm.uplink.wire import to_parameters

__all__ = ["FedADMM"]


class FedADMM(ConsensusStrategy):
    """Federated inexact consensus ADMM (server-held duals), Flower's legacy strategy API.

    The round, the defaults and every keyword below are those of the Message-API
    `flwr_admm.serverapp.FedADMM`, the reference; the same replies give the same
    iterates. Takes Flower's legacy `FedAvg` keywords plus these, all keyword-only as
    Flower's legacy FedAvg:

    Parameters
    ----------
    rho, proximal_mu, rho_schedule, regularizer, client_rho, eps_abs, eps_rel, \
    relaxation, acceleration, restart_eta, z_average, dual_step, \
    stop_on_convergence, sampling_seed, checkpoint_dir, checkpoint_every, resume, \
    uplink, uplink_residual, local_dp, key_binding, max_client_age, max_clients, \
    tensor_policy, form :
        As in `flwr_admm.serverapp.FedADMM`. Clients are Flower's `ClientProxy`s (keyed
        by ``client-key`` or ``partition-id`` in the fit metrics, else the cid); the
        start point z follows the center as a second block of tensors (config
        ``admm-start = 1``) for clients whose replies say they start there
        (`flwr_admm.core.start_marks`). Under ``form="linearized"`` the parameters
        are z followed by y_i, the config holds ``admm-form = "linearized"`` and
        ``proximal_mu = 0``, and a reply without ``admm-step-budget`` is rejected.
    tensor_names : sequence of str, optional
        The names the `tensor_policy` patterns match (e.g. ``list(model.state_dict())``);
        default ``"0"``, ``"1"``, ... (legacy parameters carry no names).
    health : HealthCheck or None
        Divergence watchdog (`flwr_admm.core.health`, `ConsensusStrategy`); None: off.

    """

    label: ClassVar[str] = "FedADMM"
    counters: ClassVar[tuple[str, ...]] = (NUM_RESYNCED,)

    def __init__(
        self,
        *,
        rho: float | None = None,
        proximal_mu: float | None = None,
        rho_schedule: RhoSchedule | str | None = None,
        regularizer: Regularizer | None = None,
        client_rho: ClientRho = "uniform",
        eps_abs: float = 1e-6,
        eps_rel: float = 1e-4,
        relaxation: float | None = None,
        acceleration: str | None = DEFAULT_ACCELERATION,
        restart_eta: float = DEFAULT_ETA,
        z_average: ZAverage = "cached",
        dual_step: float | None = None,
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
        form: FormSpec = "prox",
        **fedavg_kwargs: Any,
    ) -> None:
        self.form = check_form(form)
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
        self.admm_settings = strategy_settings(
            form,
            {"rho": rho, "proximal_mu": proximal_mu, "rho_schedule": rho_schedule},
            regularizer=regularizer,
            client_rho=client_rho,
            eps_abs=eps_abs,
            eps_rel=eps_rel,
            relaxation=relaxation,
            acceleration=acceleration,
            restart_eta=restart_eta,
            z_average=z_average,
            dual_step=dual_step,
            channel={"uplink": uplink, "local_dp": local_dp},
        )
        self.admm: ConsensusADMM | None = None
        self._sent_key: dict[str, str | None] = {}  # cid -> key whose center it was sent
        self._sent_rho: dict[str, float] = {}  # cid -> the rho_i its center was built with
        self.marks = StartMarks()  # stock FedProx clients: their duals are held at 0
        self._resume(resume)

    def __repr__(self) -> str:
        s = self.admm_settings
        return (
            f"FedADMM(rho={s.rho}, rho_schedule={type(s.rho_schedule).__name__}, "
            f"regularizer={s.regularizer!r}, relaxation={s.relaxation}, "
            f"acceleration={s.acceleration!r})"
        )

    # ------------------------------------------------------------------- fit
    def _fit_instructions(
        self, clients: list[ClientProxy], parameters: Parameters, config: dict[str, Scalar]
    ) -> list[tuple[ClientProxy, FitIns]]:
        """Send each sampled client its center v_i = z - u_i and its rho_i."""
        admm = self.admm
        assert admm is not None
        instructions: list[tuple[ClientProxy, FitIns]] = []
        start = self._merge(admm.start_point()) if self.form == "linearized" else []
        for client in clients:
            key = self._key_of_cid.get(client.cid)
            if self.form == "linearized":  # the start (z or x), then y_i (core.linearized)
                assert self.tensors is not None
                self._sent_key[client.cid] = key if key in admm.records else None
                both = start + dual_tensors(admm, self.tensors, key)
                linear = {**config, FORM: FORM_LINEARIZED, PROXIMAL_MU: 0.0}
                instructions.append((client, FitIns(to_parameters(both, self._dtypes * 2), linear)))
                continue
            center = admm.center(key)
            rho_i = admm.rho_for(key)
            payload = parameters if center is admm.z else self._to_parameters(self._merge(center))
            self._sent_key[client.cid] = key if key in admm.records else None
            self._sent_rho[client.cid] = rho_i
            fit_config = {**config, RHO: rho_i, PROXIMAL_MU: rho_i}
            if center is not admm.z and key in self.marks.at_z:  # v_i, then z: the start
                both = self._merge(center) + self._merge(admm.z)
                payload = to_parameters(both, self._dtypes * 2)
                fit_config[START_TENSORS] = 1
            instructions.append((client, FitIns(payload, fit_config)))
        return instructions

    def _open_round(self, keys: list[str]) -> None:
        assert self.admm is not None and self.tensors is not None
        self.admm.begin(keys)
        self.tensors.begin()
        self.marks.begin()

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
            why = split.problem(arrays)
            if why is not None:
                self._reject(key, why, counts)
                return None
            sq_norm = None
        n, scale = int(res.num_examples), None
        if self.form == "linearized":  # rho_i = 1 / b_i, b_i the reply's step budget
            scale, why = budget_scale(res.metrics)
            if why is not None:
                self._reject(key, why, counts)
                return None
        else:
            self.marks.read(key, res.metrics, admm.rho)
        return Reply(key, split.consensus(arrays), n, objective, sq_norm, scale), arrays

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
            problem = problem or self.channel.attestation_problem(res.metrics)  # local DP
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
        self.marks.forget(gone)
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
        stock = self.marks.settle(self.admm, partial(log, WARNING, "FedADMM: %s"))  # y_i = 0
        return {**report_metrics(report), NUM_STOCK_REPLIES: stock}

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
        return TensorSplit(roles, z, nonnegative_of(names))

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
        form = {} if self.form == "prox" else {"form": self.form}  # prox: as before
        described = {"strategy": self.label, **form, **self.admm_settings.describe()}
        if self.tensor_rules or self.tensor_names is not None:  # absent: old checkpoints load
            described["tensor_policy"] = [list(rule) for rule in self.tensor_rules]
            described["tensor_names"] = self.tensor_names
        return described

    def _state_dict(self) -> tuple[dict[str, NDArray[Any]], dict[str, Any]]:
        """Return z, every cached w_i and dual, the sums, rho, schedule and privacy ledger."""
        assert self.admm is not None and self.tensors is not None
        arrays, manifest = snapshot(self.admm, self.tensors)
        ledger = self.channel.ledger
        privacy = ledger.state_dict() if ledger is not None else {}
        return arrays, {**manifest, "sent_key": self._sent_key, "privacy": privacy}

    def _load_state_dict(
        self, arrays: dict[str, NDArray[Any]], manifest: dict[str, Any], dtypes: list[np.dtype[Any]]
    ) -> None:
        self.admm, self.tensors = restore(self.admm_settings, arrays, manifest)
        self._sent_key = dict(manifest.get("sent_key", {}))
        if self.channel.ledger is not None:
            self.channel.ledger.load_state_dict(manifest.get("privacy", {}))
