"""ADMMClient: one NumPyClient for FedADMM, FedProx and FedAvg.

The client reads the server's fit config:

- ``rho`` present: ADMM. The received parameters are the prox center v_i = z - u_i;
  run min f_i(w) + rho/2 ||w - v_i||^2 from the warm start (`local_init`).
- only ``proximal_mu``: FedProx. Start at the received w_t, penalty mu/2 ||w - w_t||^2.
- neither: FedAvg. Plain local gradient steps from the received parameters.
- ``admm-duals = "client"`` (`FedADMMClientDuals`): the dual u_i is kept here; receive z
  (and z_k under fast ADMM), update u_i, train around z - u_i, reply with the change of
  n_i (w_i + u_i), compressed with error feedback on ``uplink*`` entries (no local DP).
- ``peer-algorithm``: the baselines `SCAFFOLD` / `FedDyn` (`flwr_admm.client.peers`).
- ``admm-form = "linearized"``: FedADMM's linearized form (`flwr_admm.client.linearized`).

``local_steps``, ``local_epochs``, ``learning_rate`` and ``batch_size`` in the config
override the constructor values. ``uplink*`` and ``dp-*`` entries switch on update
compression and local differential privacy (`flwr_admm.uplink.channel`); use ``to_client()``
so that compressed replies go out as packed bytes.
"""

from __future__ import annotations

import math

import numpy as np
from flwr.client import Client, NumPyClient
from flwr.common import ArrayRecord, ConfigRecord, Context, NDArrays, Parameters, Scalar
from numpy.typing import NDArray

from flwr_admm.client import client_duals, linearized, peers
from flwr_admm.client.evaluation import evaluate_model
from flwr_admm.client.local_init import LOCAL_INITS, LocalInit, resolved_init
from flwr_admm.client.secagg import SecureRound, secure_reply
from flwr_admm.core import client_duals as dual_math
from flwr_admm.core.local_solver import LocalPlan, ProxStep, penalized_local_solve
from flwr_admm.models.base import Model, Params
from flwr_admm.protocol import (
    BATCH_SIZE,
    CLIENT_KEY,
    FORM,
    FORM_LINEARIZED,
    GRAD_NORM,
    LEARNING_RATE,
    LOCAL_EPOCHS,
    LOCAL_STEPS,
    LOSS,
    META_FITS,
    META_ROUND,
    MODE_CLIENT,
    MODE_KEY,
    PARTITION_ID,
    PEER,
    PROXIMAL_MU,
    REBUILD,
    RHO,
    SECAGG_SCALE,
    SERVER_ROUND,
    START_MARK,
    STATE_META,
    STATE_RESIDUAL,
    STATE_W,
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
        Start: own last w_i (in ``context.state``), v_i, or the received z (as FedDyn;
        client-held duals only: this client asks server-held FedADMM for no z, its
        replies say it starts elsewhere). "auto" (default): z under client-held duals,
        else the own last w_i. With rho = 0 the loop starts at the received z.
    prox_step : {"exact", "gradient"}
        Proximal-gradient step (stable for any rho) or the seed's explicit step.
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
        self._w: Params | None = None  # used only without a context
        self._residual: Params | None = None  # used only without a context
        self._duals = client_duals.KeptDuals(None, None)  # used only without a context
        self._peers = peers.PeerState(context, {})  # SCAFFOLD's c_i / FedDyn's grad_i
        self._fits = 0
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
        received = [np.asarray(p, dtype=np.float64) for p in parameters]
        plan = self._plan(config)
        uplink = ClientUplink.from_config(config)
        server_round = int(config.get(SERVER_ROUND, self._fit_count() + 1))
        if PEER in config:  # SCAFFOLD or FedDyn: flwr_admm.client.peers
            return peers.client_fit(self, received, config, plan, server_round, uplink)
        server_held = config.get(MODE_KEY) != MODE_CLIENT
        if config.get(FORM) == FORM_LINEARIZED and server_held:  # z, y_i: client.linearized
            return linearized.client_fit(self, received, plan, server_round, uplink)
        received, z_k = client_duals.split_accelerated(received, config)  # fast ADMM: z_k
        self.model.check_params(received, field="parameters")
        if config.get(MODE_KEY) == MODE_CLIENT:
            client_duals.check_uplink(uplink, secure=SECAGG_SCALE in config)
            fast = client_duals.extrapolation(config, received, z_k, SECAGG_SCALE in config)
            return self._fit_client_duals(received, config, plan, server_round, uplink, fast)
        if RHO in config:
            rho = _nonnegative(config[RHO], RHO)
            # rho = 0: no penalty ties w to the center, so a warm start would ignore z;
            # FedAvg's step starts at the received z (v_i = z when y_i = 0).
            init = resolved_init(self.local_init, z_received=False)
            if init == "consensus" and rho > 0:  # server-held duals send no z
                raise ValueError("local_init: 'consensus' needs z: FedADMMClientDuals only")
            warm = init == "previous" and rho > 0
            start = self._previous(server_round) if warm else None
            start = received if start is None else start
        else:
            rho = _nonnegative(config.get(PROXIMAL_MU, 0.0), PROXIMAL_MU)
            start = received
        stream = [self.seed, int(self.partition_id or 0), server_round]
        residual = self._residual_kept(received) if uplink.keeps_residual else None
        center = uplink.center(received, residual)
        rng = np.random.default_rng(stream)
        result = penalized_local_solve(
            self.model, start, self.X, self.y, plan, center=center, rho=rho, rng=rng
        )
        reply = uplink.reply(
            received,
            result.params,
            residual,
            self._noise_rng(server_round),
            np.random.default_rng([*stream, 1]),
        )
        keep = RHO in config and resolved_init(self.local_init, False) == "previous"
        self._remember(result.params if keep else None, server_round, reply.residual)
        self.uplink_payload = reply.parameters
        metrics: dict[str, Scalar] = {
            LOSS: float(result.loss),
            LOCAL_STEPS: int(result.steps),
            GRAD_NORM: float(result.grad_norm) if math.isfinite(result.grad_norm) else -1.0,
        }
        metrics.update({**self._key_metrics(), **reply.attestation})  # local DP: attested
        metrics.update({START_MARK: 0} if RHO in config else {})  # solves FedADMM's step
        return list(reply.arrays), int(self.X.shape[0]), metrics

    def _fit_client_duals(
        self,
        z: Params,
        config: dict[str, Scalar],
        plan: LocalPlan,
        server_round: int,
        uplink: ClientUplink,
        fast: dual_math.Extrapolation | None = None,
    ) -> tuple[NDArrays, int, dict[str, Scalar]]:
        """Run one round of `FedADMMClientDuals`: dual update, local solve, change.

        Trains from the state ``admm-ack-round`` names (pending, committed or fresh);
        compresses x = Delta_i + e_i; ``admm-rebuild = 1``: sigma_i' follows Delta_i.
        """
        rho = _nonnegative(config.get(RHO, 0.0), RHO)
        if rho <= 0:
            raise ValueError(f"rho: must be > 0 with client-held duals, got {rho!r}")
        kept = self._kept_duals([t.shape for t in z])
        base = dual_math.opened(config, z, kept.committed, kept.pending)
        state = base.state
        gamma = dual_math.dual_step_of(config)
        begin = dual_math.start_round(state, z, fast, gamma)  # fast ADMM: extrapolates u_i too
        stream = [self.seed, int(self.partition_id or 0), server_round]
        rng = np.random.default_rng(stream)
        budget = None
        if config.get(FORM) == FORM_LINEARIZED:  # from z^k on f_i + <u_i / b_i, w>
            linear = dual_math.linear_term(state, begin)
            result = penalized_local_solve(
                self.model, z, self.X, self.y, plan, rng=rng, linear=linear
            )
            budget = linearized.budget_of(result.steps, plan)
        else:
            init = resolved_init(self.local_init, z_received=True)
            own = base.own  # a restored state has no w_i
            previous = own.w if own is not None and init == "previous" else None
            origin = z if init == "consensus" else begin.center  # z: FedDyn's start
            start = [t.copy() for t in previous] if previous is not None else origin
            result = penalized_local_solve(
                self.model, start, self.X, self.y, plan, center=begin.center, rho=rho, rng=rng
            )
        w = [np.asarray(t, dtype=np.float64) for t in result.params]
        n = int(self.X.shape[0])
        change = dual_math.contribution_change(state, w, begin.dual, n)
        secure = SecureRound.from_config(config)
        if secure is not None:  # SecAgg+: the server sees sums only (flwr_admm.client.secagg)
            rebuild, loss = _flag(config, REBUILD), float(result.loss)
            reply = secure_reply(
                secure, state, begin, w, n, change, rebuild=rebuild, resync=base.resync, loss=loss
            )
            pending = begin.kept(w, n, server_round, reply.residual, budget)
            self._keep_duals(client_duals.KeptDuals(state, pending))  # last: after all can fail
            self.uplink_payload = None
            metrics = {**self._key_metrics(), **reply.metrics, LOCAL_STEPS: int(result.steps)}
            metrics.update({} if budget is None else {STEP_BUDGET: budget})  # in the clear
            return reply.arrays, reply.num_examples, metrics
        residual = None if state is None else state.residual
        rounding = np.random.default_rng([*stream, 1])
        sent = client_duals.uplink_change(change, residual, uplink.compressor, rounding)
        pending = begin.kept(w, n, server_round, sent.residual, budget)
        if _flag(config, REBUILD):
            sent = client_duals.with_share(sent, pending.share)
        metrics = self._key_metrics()
        metrics.update(client_duals.reply_metrics(state, begin, w, n, base.resync, base.restored))
        metrics.update({LOSS: float(result.loss), LOCAL_STEPS: int(result.steps)})
        metrics.update({} if budget is None else {STEP_BUDGET: budget})
        self._keep_duals(client_duals.KeptDuals(base.own, pending))  # last; an offer is not kept
        self.uplink_payload = sent.payload
        return list(sent.arrays), n, metrics

    def _kept_duals(self, shapes: list[tuple[int, ...]]) -> client_duals.KeptDuals:
        """Return the committed and pending states (context.state, else this object)."""
        if self.context is None:
            return self._duals
        return client_duals.load_states(self.context.state, shapes)

    def _keep_duals(self, kept: client_duals.KeptDuals) -> None:
        """Store both states (a failed fit never gets here: it leaves them as they were)."""
        if self.context is None:
            self._duals = kept
        else:
            client_duals.save_states(self.context.state, kept)

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

    def _fit_count(self) -> int:
        if self.context is not None and STATE_META in self.context.state.config_records:
            return int(self.context.state.config_records[STATE_META][META_FITS])  # type: ignore[arg-type]
        return self._fits

    def _previous(self, server_round: int) -> Params | None:
        """Last local w_i, if any and if it matches the model's shapes."""
        if self.context is None:
            return None if self._w is None else [p.copy() for p in self._w]
        record = self.context.state.array_records.get(STATE_W)
        if record is None:
            return None
        previous = [np.asarray(a, dtype=np.float64) for a in record.to_numpy_ndarrays()]
        try:
            self.model.check_params(previous)
        except ValueError:
            return None
        return previous

    def _residual_kept(self, received: Params) -> Params | None:
        """Return the uplink residual kept from the last compressed reply, if shapes match."""
        if self.context is None:
            kept = self._residual
        else:
            record = self.context.state.array_records.get(STATE_RESIDUAL)
            kept = None if record is None else list(record.to_numpy_ndarrays())
        if kept is None or [np.shape(r) for r in kept] != [r.shape for r in received]:
            return None
        return [np.asarray(r, dtype=np.float64) for r in kept]

    def _remember(
        self, params: Params | None, server_round: int, residual: Params | None = None
    ) -> None:
        """Write state last, tagged with its round (a failed fit leaves it as it was)."""
        self._fits = self._fit_count() + 1
        if self.context is None:
            if params is not None:
                self._w = [p.copy() for p in params]
            self._residual = residual
            return
        if params is not None:
            self.context.state.array_records[STATE_W] = ArrayRecord([p.copy() for p in params])
        records = self.context.state.array_records
        if residual is not None:
            records[STATE_RESIDUAL] = ArrayRecord([np.asarray(r) for r in residual])
        elif STATE_RESIDUAL in records:
            del records[STATE_RESIDUAL]
        self.context.state.config_records[STATE_META] = ConfigRecord(
            {META_ROUND: int(server_round), META_FITS: int(self._fits)}
        )


def _flag(config: dict[str, Scalar], field: str) -> bool:
    """Return a 0/1 config flag (absent: 0); ValueError naming the field otherwise."""
    value = config.get(field, 0)
    if isinstance(value, bool) or value not in (0, 1):
        raise ValueError(f"{field}: must be 0 or 1, got {value!r}")
    return value == 1


def _nonnegative(value: Scalar, field: str) -> float:
    try:
        number = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError) as error:
        raise ValueError(f"{field}: must be a number >= 0, got {value!r}") from error
    if not math.isfinite(number) or number < 0:
        raise ValueError(f"{field}: must be a finite number >= 0, got {value!r}")
    return number
