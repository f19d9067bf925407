"""ADMMClient: one legacy NumPyClient for FedADMM, FedProx, FedAvg, SCAFFOLD and FedDyn.

The fit config names the protocol (and FedADMM's form and dual mode); its node half is
`flwr_admm.node`'s (SecAgg+: `flwr_admm.client.secagg`). This class runs the numpy
local loop (`penalized_local_solve`) between opening and closing a round and translates
the legacy wire (one flat list of tensors, `flwr_admm.node.blocks`). ``local_steps``,
``local_epochs``, ``learning_rate`` and ``batch_size`` in the config override the
constructor values; use ``to_client()`` so that compressed replies go out as packed bytes.
"""

from __future__ import annotations

import math

import numpy as np
from flwr.client import Client, NumPyClient
from flwr.common import Context, NDArrays, Parameters, RecordDict, Scalar
from numpy.typing import NDArray

from flwr_admm.client.evaluation import evaluate_model
from flwr_admm.client.secagg import SecureRound, secure_reply
from flwr_admm.core.linearized import step_budget
from flwr_admm.core.local_solver import LocalPlan, LocalResult, ProxStep, penalized_local_solve
from flwr_admm.core.types import Arrays
from flwr_admm.models.base import Model
from flwr_admm.node import records
from flwr_admm.node.blocks import split
from flwr_admm.node.config import server_round_of
from flwr_admm.node.duals import check_uplink
from flwr_admm.node.peers import PeerRound
from flwr_admm.node.start import LOCAL_INITS, LocalInit, resolved_init
from flwr_admm.node.step import NodeRound
from flwr_admm.protocol import (
    BATCH_SIZE,
    CLIENT_KEY,
    FORM,
    GRAD_NORM,
    LEARNING_RATE,
    LOCAL_EPOCHS,
    LOCAL_STEPS,
    LOSS,
    PARTITION_ID,
    PEER,
    RHO,
    SECAGG_SCALE,
    STEP_BUDGET,
)
from flwr_admm.uplink.channel import ClientUplink, UplinkClient


class ADMMClient(NumPyClient):
    """NumPyClient running the penalized local loop of inexact ADMM.

    Parameters
    ----------
    model : Model
        A `flwr_admm.models` model (or anything with the same contract).
    X, y : array
        Local training data; labels must be valid for the model.
    local_steps, local_epochs : int
        Length of the local loop: steps (full or mini batches) or epochs; set one.
    learning_rate : float
        Local step size lr.
    batch_size : int, optional
        Minibatch size; None = full batch.
    local_init : {"auto", "previous", "center", "consensus"}
        Start: own last w_i (in ``context.state``), v_i, or the received z
        (`flwr_admm.node.start`; "consensus" under client-held duals only, as server-held
        FedADMM sends this client no z). "auto": z under client-held duals, else the
        own last w_i. With rho = 0 the loop starts at the received parameters.
    prox_step : {"exact", "gradient"}
        Proximal-gradient step (stable for any rho) or the explicit gradient step.
    grad_tol : float, optional
        Stop once ||grad f_i(w) + rho (w - v)|| <= grad_tol.
    context : flwr.common.Context, optional
        Flower context: its ``state`` keeps w_i across rounds, its node_config gives
        ``partition-id``. Without it the client object itself keeps w_i.
    X_val, y_val : array, optional
        Evaluation data; the training data when absent.
    client_key : str, optional
        Stable key the server uses for this client's dual (default: partition-id).
    seed : int
        Seed of the minibatch order and stochastic rounding (combined with the round
        and the partition-id).
    dp_seed : int, optional
        Seed of the local-DP noise, for reproducible experiments only. None (default)
        draws it from OS entropy: noise a server can regenerate gives no privacy.

    """

    def __init__(
        self,
        model: Model,
        X: NDArray[np.generic],
        y: NDArray[np.generic],
        *,
        local_steps: int | None = 10,
        learning_rate: float = 0.1,
        batch_size: int | None = None,
        local_epochs: int | None = None,
        local_init: LocalInit = "auto",
        prox_step: ProxStep = "exact",
        grad_tol: float | None = None,
        context: Context | None = None,
        X_val: NDArray[np.generic] | None = None,
        y_val: NDArray[np.generic] | None = None,
        client_key: str | None = None,
        seed: int = 0,
        dp_seed: int | None = None,
    ) -> None:
        if local_init not in LOCAL_INITS:
            raise ValueError(f"local_init: must be one of {list(LOCAL_INITS)}, got {local_init!r}")
        self.model = model
        self.X = model.check_data(X, field="X")
        self.y = model.encode_labels(y)
        if self.y.shape[0] != self.X.shape[0]:
            raise ValueError(
                f"y: expected {self.X.shape[0]} labels (rows of X), got {self.y.shape[0]}"
            )
        if (X_val is None) != (y_val is None):
            raise ValueError("X_val / y_val: give both or neither")
        self.X_val = self.X if X_val is None else model.check_data(X_val, field="X_val")
        self.y_val = self.y if y_val is None else model.encode_labels(y_val)
        if self.y_val.shape[0] != self.X_val.shape[0]:
            raise ValueError("y_val: must have one label per row of X_val")
        self.plan = LocalPlan(
            learning_rate=learning_rate,
            steps=None if local_epochs is not None else local_steps,
            epochs=local_epochs,
            batch_size=batch_size,
            prox_step=prox_step,
            grad_tol=grad_tol,
        )
        self.local_init = local_init
        self.context = context
        self.seed = int(seed)
        self.dp_seed = None if dp_seed is None else int(dp_seed)
        node_config = context.node_config if context is not None else {}
        self.partition_id = node_config.get(PARTITION_ID)
        self.client_key = client_key
        # what the node keeps between rounds (`flwr_admm.node.records`): its context's
        # state, else this object's own
        self.state = context.state if context is not None else RecordDict()
        self.uplink_payload: Parameters | None = None  # set by fit, sent by to_client()

    def to_client(self) -> Client:
        """Flower's NumPyClient wrapper, but sending packed payloads when compressing."""
        return UplinkClient(self, super().to_client())

    # -------------------------------------------------------------- NumPyClient
    def get_parameters(self, config: dict[str, Scalar]) -> NDArrays:
        """Return the model's initial parameters."""
        return self.model.init_params(getattr(self.model, "seed", 0))

    def fit(
        self, parameters: NDArrays, config: dict[str, Scalar]
    ) -> tuple[NDArrays, int, dict[str, Scalar]]:
        """Run the local loop for the algorithm the config implies.

        Returns what the server will rebuild from the reply (after local DP and
        compression, if the config asks for them).
        """
        self.uplink_payload = None
        plan = self._plan(config)
        uplink = ClientUplink.from_config(config)
        server_round = server_round_of(config)
        server_round = records.fit_count(self.state) + 1 if server_round is None else server_round
        names = [str(i) for i in range(len(self.model.shapes))]
        received, second = split(parameters, config, names)
        self.model.check_params(received, field="parameters")
        if PEER in config:  # SCAFFOLD or FedDyn
            if uplink.compressor is not None or uplink.local_dp is not None:
                raise ValueError(
                    f"{PEER}: uplink compression and local DP are not supported with "
                    f"{config[PEER]!r}; drop the uplink*/dp-* entries"
                )
            peer = PeerRound.open(self.state, received, second, config)
            result = self._solve(received, plan, server_round, received, peer.rho, peer.linear)
            reply = peer.close(result.params, result.steps, plan.learning_rate, server_round)
            metrics = {**_result_metrics(result), **reply.metrics, **self._key_metrics()}
            reply.commit(self.state)
            return reply.flat(), self.num_examples, metrics
        previous = records.legacy_previous(self.state, [t.shape for t in received])
        node = NodeRound.open(
            received,
            config,
            self.state,
            second=second,
            previous=previous,
            server_round=server_round,
        )
        if node.duals is not None:
            return self._fit_client_duals(node, config, plan, uplink)
        if node.form == "linearized":  # z, y_i: w <- w - lr (grad f_i(w) + y_i), K steps from z
            if uplink.compressor is not None or uplink.local_dp is not None:
                raise ValueError(
                    f"{FORM}: uplink compression and local DP are not supported with the "
                    "linearized form; drop the uplink*/dp-* entries"
                )
            result = self._solve(node.center, plan, server_round, linear=node.correction)
            reply = node.close(result.params, self.num_examples, step_budget=_budget(result, plan))
            metrics = {**_result_metrics(result), **reply.metrics, **self._key_metrics()}
            return reply.arrays, self.num_examples, metrics
        return self._fit_prox(node, config, plan, uplink)

    def _fit_prox(
        self, node: NodeRound, config: dict[str, Scalar], plan: LocalPlan, uplink: ClientUplink
    ) -> tuple[NDArrays, int, dict[str, Scalar]]:
        """Run FedADMM's w-step around v_i (FedProx's around w_t, FedAvg's plain steps).

        Starts where `local_init` says (this client asks for no z: "auto" is "previous");
        with uplink entries the reply is privatized and compressed (`ClientUplink`).
        """
        init = resolved_init(self.local_init, z_received=False)
        if init == "consensus" and node.admm and node.rho > 0:  # server-held duals send no z
            raise ValueError("local_init: 'consensus' needs z: FedADMMClientDuals only")
        server_round = int(node.server_round or 0)
        start, _ = node.start(init)
        residual = None
        if uplink.keeps_residual:
            residual = records.legacy_residual(self.state, [t.shape for t in node.center])
        result = self._solve(start, plan, server_round, node.center, node.rho)
        reply = node.close(result.params, self.num_examples)  # at_z: this client asks for none
        sent = uplink.reply(
            node.center,
            result.params,
            residual,
            self._noise_rng(server_round),
            np.random.default_rng([*self._stream(server_round), 1]),
        )
        grad_norm = float(result.grad_norm) if math.isfinite(result.grad_norm) else -1.0
        metrics = {**_result_metrics(result), GRAD_NORM: grad_norm, **self._key_metrics()}
        metrics.update({**sent.attestation, **reply.metrics})  # local DP attested; START_MARK
        keep = RHO in config and init == "previous"  # the warm start, written last
        records.keep_legacy(self.state, result.params if keep else None, server_round)
        records.keep_residual(self.state, sent.residual)
        self.uplink_payload = sent.parameters
        return list(sent.arrays), self.num_examples, metrics

    def _fit_client_duals(
        self, node: NodeRound, config: dict[str, Scalar], plan: LocalPlan, uplink: ClientUplink
    ) -> tuple[NDArrays, int, dict[str, Scalar]]:
        """Run one round of `FedADMMClientDuals` around z^k - u_i; reply with Delta_i.

        Compresses x = Delta_i + e_i; ``admm-rebuild = 1``: sigma_i' follows Delta_i;
        under SecAgg+ the reply is `secure_reply`'s.
        """
        check_uplink(uplink, secure=SECAGG_SCALE in config)
        secure = SecureRound.from_config(config)
        duals, server_round = node.duals, int(node.server_round or 0)
        assert duals is not None
        budget = None
        if node.form == "linearized":  # from z^k on f_i + <u_i / b_i, w>
            result = self._solve(node.center, plan, server_round, linear=node.correction)
            budget = _budget(result, plan)
        else:
            start, _ = node.start(resolved_init(self.local_init, z_received=True))
            result = self._solve(start, plan, server_round, node.center, node.rho)
        w = [np.asarray(t, dtype=np.float64) for t in result.params]
        n, steps = self.num_examples, {LOCAL_STEPS: int(result.steps)}
        if secure is not None:  # SecAgg+: the server sees sums only (flwr_admm.client.secagg)
            pending = duals.start.kept(w, n, server_round, None, budget)  # u_i = b_i' y_i
            sums = secure_reply(
                secure,
                duals.state,
                duals.start,
                pending,
                duals.change(pending),
                rebuild=duals.rebuild,
                resync=duals.resync,
                loss=float(result.loss),
            )
            pending.residual = sums.residual
            records.save_states(self.state, duals.kept(pending))  # last: after all can fail
            metrics = {**self._key_metrics(), **sums.metrics, **steps}
            metrics.update({} if budget is None else {STEP_BUDGET: budget})  # in the clear
            return sums.arrays, sums.num_examples, metrics
        rounding = np.random.default_rng([*self._stream(server_round), 1])
        reply = node.close(w, n, step_budget=budget, compressor=uplink.compressor, rng=rounding)
        metrics = {**self._key_metrics(), **reply.metrics, **_result_metrics(result)}
        reply.commit(self.state)  # last: after all can fail
        self.uplink_payload = reply.flat_payload()
        return reply.flat(), n, metrics

    @property
    def num_examples(self) -> int:
        """Return n_i, the number of local training rows."""
        return int(self.X.shape[0])

    def _stream(self, server_round: int) -> list[int]:
        """Return the seed of this round's minibatches: [seed, partition-id, round]."""
        return [self.seed, int(self.partition_id or 0), server_round]

    def _solve(
        self,
        start: Arrays,
        plan: LocalPlan,
        server_round: int,
        center: Arrays | None = None,
        rho: float = 0.0,
        linear: Arrays | None = None,
    ) -> LocalResult:
        """Run the local loop min f_i(w) + <linear, w> + rho/2 ||w - center||^2 from `start`."""
        rng = np.random.default_rng(self._stream(server_round))
        return penalized_local_solve(
            self.model, start, self.X, self.y, plan, center=center, rho=rho, rng=rng, linear=linear
        )

    def _key_metrics(self) -> dict[str, Scalar]:
        """``partition-id`` / ``client-key``: the key the server files this client under."""
        metrics: dict[str, Scalar] = {}
        if self.partition_id is not None:
            metrics[PARTITION_ID] = int(self.partition_id)
        if self.client_key is not None:
            metrics[CLIENT_KEY] = str(self.client_key)
        return metrics

    def evaluate(
        self, parameters: NDArrays, config: dict[str, Scalar]
    ) -> tuple[float, int, dict[str, Scalar]]:
        """Loss, accuracy (and AUC for binary tasks) on the validation data."""
        params = [np.asarray(p, dtype=np.float64) for p in parameters]
        self.model.check_params(params, field="parameters")
        return evaluate_model(self.model, params, self.X_val, self.y_val)

    # ----------------------------------------------------------------- helpers
    def _noise_rng(self, server_round: int) -> np.random.Generator:
        """Local-DP noise generator: OS entropy unless `dp_seed` (a known seed protects nothing)."""
        if self.dp_seed is None:
            return np.random.default_rng()
        return np.random.default_rng([self.dp_seed, int(self.partition_id or 0), server_round])

    def _plan(self, config: dict[str, Scalar]) -> LocalPlan:
        plan = self.plan
        lr = float(config.get(LEARNING_RATE, plan.learning_rate))
        epochs = config.get(LOCAL_EPOCHS, plan.epochs)
        steps = config.get(LOCAL_STEPS, plan.steps)
        if LOCAL_EPOCHS in config and LOCAL_STEPS not in config:
            steps = None
        elif LOCAL_STEPS in config and LOCAL_EPOCHS not in config:
            epochs = None
        batch = config.get(BATCH_SIZE, plan.batch_size)
        if isinstance(batch, int | float) and not isinstance(batch, bool) and batch <= 0:
            batch = None  # 0 in a run config means "full batch"
        return LocalPlan(
            learning_rate=lr,
            steps=None if steps is None else int(steps),  # type: ignore[arg-type]
            epochs=None if epochs is None else int(epochs),  # type: ignore[arg-type]
            batch_size=None if batch is None else int(batch),  # type: ignore[arg-type]
            prox_step=plan.prox_step,
            grad_tol=plan.grad_tol,
        )


def _result_metrics(result: LocalResult) -> dict[str, Scalar]:
    """Return f_i at the returned w_i and the steps taken."""
    return {LOSS: float(result.loss), LOCAL_STEPS: int(result.steps)}


def _budget(result: LocalResult, plan: LocalPlan) -> float:
    """Return b_i = K lr of a local loop; ValueError if it took no step."""
    if result.steps == 0:
        raise ValueError(
            "grad_tol: the local loop took no step from z, so there is no step budget "
            "K lr for rho_i = 1 / (K lr); lower grad_tol or drop it under the linearized form"
        )
    return step_budget(result.steps, plan.learning_rate)
