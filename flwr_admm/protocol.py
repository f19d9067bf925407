"""Every key that crosses the wire or lands in a node's ``context.state``, defined once.

Fit config (server -> client), reply metrics (client -> server), the round metrics
the strategies return and record, and the ``context.state`` records a client keeps
between rounds. Flower's own names are kept where Flower defines one
(``proximal_mu`` for its legacy FedProx, ``partition-id`` for its node config).
"""

from __future__ import annotations

# ---------------------------------------------------------------- fit config
RHO = "rho"  # rho_i of this client: the received parameters are its center v_i
PROXIMAL_MU = "proximal_mu"  # Flower's legacy FedProx key; FedADMM sends rho_i here too
SERVER_ROUND = "server_round"
LOCAL_STEPS = "local_steps"
LOCAL_EPOCHS = "local_epochs"
LEARNING_RATE = "learning_rate"
BATCH_SIZE = "batch_size"
MODE_KEY = "admm-duals"  # "client" switches ADMMClient to the client-held-dual protocol
MODE_CLIENT = "client"
UPLINK = "uplink"  # compressor name; uplink-* keys configure it (flwr_admm.uplink)
UPLINK_BITS = "uplink-bits"
UPLINK_BLOCK = "uplink-block"
UPLINK_FRACTION = "uplink-fraction"
UPLINK_ERROR_FEEDBACK = "uplink-error-feedback"
DP_CLIP = "dp-clip"
DP_NOISE = "dp-noise"
# Reply (local DP attestation): 1 = the client clipped to C and noised with sigma, the
# two values it used following; a strategy with local DP rejects a reply without them.
DP_APPLIED = "admm-dp-applied"
DP_APPLIED_CLIP = "admm-dp-applied-clip"
DP_APPLIED_NOISE = "admm-dp-applied-noise"
START_TENSORS = "admm-start"  # legacy FedADMM: 1 = the parameters are v_i, then z (the start)
# FedADMM's linearized form (flwr_admm.core.linearized): the config's "admm-form" is
# "linearized"; the parameters are z, then y_i (legacy), or z under ``arrays`` and y_i
# under DUAL_RECORD (Message API); the client runs its steps on grad f_i + y_i from z
FORM = "admm-form"
FORM_LINEARIZED = "linearized"
DUAL_RECORD = "admm-dual"

# ------------------------------------------------------------- reply metrics
CLIENT_KEY = "client-key"  # stable key of the client's server state (preferred)
PARTITION_ID = "partition-id"  # else its partition (Flower's node-config name)
IDENTITY_QUERY = "admm-identity"  # query message and reply record: the node's key metrics
LOSS = "loss"  # f_i(w_i) at the returned w_i
GRAD_NORM = "grad_norm"
PREVIOUS_ROUND = "admm-previous-round"  # client-held duals: round of its last reply (0: none)
EXAMPLES_CHANGE = "admm-examples-change"  # n_i' - n_i
DELAYED_SQ_RESIDUAL = "admm-delayed-sq-residual"  # d2_i = ||w_i - z^k||^2
W_SQ_NORM = "admm-w-sq-norm"  # ||w_i'||^2
U_SQ_NORM = "admm-u-sq-norm"  # ||u_i||^2
# Client-held duals under AdaptiveDualStep (fit config ALIGN = 1): the terms of the
# alignment c_k of the dual step the node just took, s_i = 1 / b_i (linearized) or 1
ALIGN_ALONG = "admm-align-along"  # s_i^2 <w_i - z^k, u_i>, u_i before the step
ALIGN_RESIDUAL = "admm-align-residual"  # s_i^2 ||w_i - z^k||^2
ALIGN_DUAL = "admm-align-dual"  # s_i^2 ||u_i||^2, u_i before the step
# FedADMM reply of our client helpers: 1 = the solve started at the received z, 0 =
# elsewhere. A reply without it is a stock FedProx handler's: its dual is held at 0
# (flwr_admm.rounds.fedadmm.StartMarks).
START_MARK = "admm-started-at-z"
# FedADMM's linearized form: the reply's step budget b_i = K_i lr_i (lr_i / (1 - momentum)
# with momentum SGD), so rho_i = 1 / b_i; a reply without it did not run the form: rejected
STEP_BUDGET = "admm-step-budget"

# ------------------------------------------------------------- round metrics
NUM_FAILURES = "num_failures"
NUM_REJECTED = "num_rejected"
NUM_RESYNCED = "num_resynced"
NUM_STOCK_REPLIES = "num_stock_replies"  # FedADMM: replies without START_MARK (dual held at 0)
NUM_STATE_MISMATCH = "num_state_mismatch"
UPLINK_BYTES = "uplink_bytes"
DP_EPSILON = "dp_epsilon"

# ------------------------------------------------------------ context.state
STATE_W = "flwr_admm.w"  # ADMMClient: last local w_i (warm start)
STATE_META = "flwr_admm.meta"  # ADMMClient: round and fit count
STATE_RESIDUAL = "flwr_admm.uplink_residual"  # ADMMClient: compression residual
DUALS_STATE_W = "flwr_admm.duals.w"  # client-held duals: w_i
DUALS_STATE_U = "flwr_admm.duals.u"  # client-held duals: u_i
DUALS_STATE_META = "flwr_admm.duals.meta"  # client-held duals: n_i and round
DUALS_STATE_RESIDUAL = "flwr_admm.duals.uplink_residual"  # client-held duals: e_i

# ------------------------------------------- round metrics (strategy results)
# (``rho`` is reported under RHO, the key it is sent under.)
ROUND = "round"  # server round of a `history` entry
NUM_REPLIES = "num_replies"
NUM_CLIENTS_CACHED = "num_clients_cached"  # client keys the server holds state for
CONVERGED = "converged"  # 1 once r <= eps_pri and s <= eps_dual, else 0
NEXT_RHO = "next_rho"
GAMMA = "dual_step"  # gamma of the round's dual step, when AdaptiveDualStep sets it
START_MOMENTUM = "start_momentum"  # beta the round's start used (0: at z); with a momentum start
PRIMAL_RESIDUAL = "primal_residual"
PREVIOUS_PRIMAL_RESIDUAL = "previous_primal_residual"  # client-held duals: r of round k-1
# client-held duals: sqrt(sum n_i ||Delta_i / n_i||^2 / sum n_i), from what the server folds
CHECKED_PRIMAL_RESIDUAL = "checked_primal_residual"
NUM_DELAYED_RESIDUALS = "num_delayed_residuals"
DUAL_RESIDUAL = "dual_residual"
EPS_PRIMAL = "eps_primal"
EPS_DUAL = "eps_dual"
OBJECTIVE = "objective"
TAU_EFF = "tau_eff"  # FedNova: sum_i p_i tau_i

# --------------------------------------- node config, evaluate metrics, ledger
NUM_PARTITIONS = "num-partitions"  # Flower's node-config name, next to PARTITION_ID
ACCURACY = "accuracy"  # evaluate reply: share of correct argmax predictions
AUC = "auc"  # evaluate reply: ROC AUC (binary tasks, both classes present)
DP_EPSILON_UNAMPLIFIED = "dp_epsilon_unamplified"  # PrivacyLedger: epsilon with q = 1
DP_DELTA = "dp_delta"
DP_SAMPLING_RATE = "dp_sampling_rate"
DP_ROUNDS = "dp_rounds"

# ------------------------------------ fields of the context.state meta records
META_ROUND = "round"  # STATE_META, DUALS_STATE_META: server round of the last fit
META_FITS = "fits"  # STATE_META: fits so far (the round when the config has none)
META_NUM_EXAMPLES = "num_examples"  # DUALS_STATE_META: n_i
META_BUDGET = "step_budget"  # DUALS_STATE_META: b_i under the linearized form

# ------------------------- client-held duals: acknowledgement and rebuild sweep
ACK_ROUND = "admm-ack-round"  # fit config: round whose contribution S holds (0: none)
REBUILD = "admm-rebuild"  # fit config: 1 = also send the full share n_i c_i - e_i
DUAL_STEP = "admm-dual-step"  # fit config: gamma, u_i += gamma (w_i - z) (absent: 1)
ALIGN = "admm-align"  # fit config: 1 = report ALIGN_* (the server's gamma is adaptive)
RESYNC = "admm-resync"  # reply: 1 = its state is gone; a full contribution, as if new
# A key whose share the server kept (a resync's, K in rounds.client_duals_sweep) is
# offered it back: c_i = sigma_i / n_i of the acknowledged round, so a node that lost
# its state trains from it instead of from scratch (prox form, gamma 1).
RESTORE = "admm-restore"  # fit config: c_i as .npy bytes (float64, flat)
RESTORE_EXAMPLES = "admm-restore-examples"  # fit config: the n_i of that share
RESTORED = "admm-restored"  # reply: 1 = trained from the offered c_i (no d2_i)
REBUILDING = "rebuilding"  # round metric: 1 while S still holds a stale share
DUALS_PENDING_W = "flwr_admm.duals.pending.w"  # client-held duals: w_i' (not yet acked)
DUALS_PENDING_U = "flwr_admm.duals.pending.u"  # u_i of the pending reply
DUALS_PENDING_META = "flwr_admm.duals.pending.meta"  # n_i' and the reply's round
DUALS_PENDING_RESIDUAL = "flwr_admm.duals.pending.uplink_residual"  # e_i' of it

# ------------------------------------------------- client identity and eviction
NUM_KEY_CONFLICTS = "num_key_conflicts"  # replies claiming a key bound to another node
NUM_EVICTED = "num_evicted"  # client keys whose server state was dropped this round
# Fit-config keys the strategies set themselves: a user's on_fit_config_fn may not
# return them (ValueError naming the key); keys with these prefixes are reserved too.
RESERVED_CONFIG_KEYS = (RHO, PROXIMAL_MU, SERVER_ROUND, MODE_KEY)
RESERVED_CONFIG_PREFIXES = ("admm-", "uplink", "dp-")

# ------------------------------- Message API (flwr_admm.serverapp, flwr_admm.clientapp)
# Flower's Message API spells its keys with hyphens; FedADMM sends rho_i under RHO and
# MESSAGE_PROXIMAL_MU, so a FedProx-style @app.train() handler runs the ADMM w-step.
MESSAGE_PROXIMAL_MU = "proximal-mu"  # Flower's Message-API FedProx key
MESSAGE_SERVER_ROUND = "server-round"  # Flower's Message-API round key
NUM_EXAMPLES = "num-examples"  # Flower's Message-API weight key (`weighted_by_key`)
MESSAGE_STATE_W = "flwr_admm.message.w"  # clientapp helpers: last local w_i, named tensors
MESSAGE_STATE_META = "flwr_admm.message.meta"  # clientapp helpers: its round (META_ROUND)
# Train-config keys the Message-API strategies set: a given ConfigRecord may not hold them.
MESSAGE_RESERVED_CONFIG_KEYS = (
    RHO,
    MESSAGE_PROXIMAL_MU,
    MESSAGE_SERVER_ROUND,
    PROXIMAL_MU,
    SERVER_ROUND,
    MODE_KEY,
)
# Message-API FedADMM (server-held duals): the ArrayRecord of z, the start of the local
# solve (flwr_admm.node.start), next to the center v_i = z - u_i under ``arrays``
START_RECORD = "admm-start"
# Message-API client-held duals: the reply's ArrayRecord of the full share sigma_i'
# (sent with ``admm-rebuild = 1``), next to Delta_i under ``arrays`` (arrayrecord_key).
SHARE_RECORD = "admm-share"
# ... and, with uplink compression, the compressed Delta_i instead of ``arrays``: one
# uint8 tensor of payload bytes per model tensor, under the model's names.
PAYLOAD_RECORD = "admm-payload"

# ------------------------------------------------ client-held duals under SecAgg+
# Fit config: the SecureGrid of flwr_admm.core.secure_sum. Their presence switches the
# client to replies SecAgg+ sums exactly; see flwr_admm.server.client_duals_secagg.
SECAGG_SCALE = "admm-secagg-scale"  # s: the client sends Delta_i / s on the grid
SECAGG_CLIP = "admm-secagg-clip"  # c: SecAgg+'s clipping range
SECAGG_LEVELS = "admm-secagg-levels"  # T: SecAgg+'s quantization range
SECAGG_WEIGHT = "admm-secagg-weight"  # SecAgg+'s max_weight: the num_examples to report
SECAGG_SWEEP = "admm-secagg-sweep"  # 1: also send the S_new block (a rebuild sweep is on)
SECAGG_EXAMPLES = "admm-num-examples"  # reply metric: n_i (num_examples is the weight)
SECURE_DROPPED = "num_secure_dropped"  # round metric: 1 if the round's aggregate was dropped

# -------------------------------------------------- peer baselines: SCAFFOLD and FedDyn
PEER = "peer-algorithm"  # fit config: "scaffold" or "feddyn" switches ADMMClient to it
PEER_SCAFFOLD = "scaffold"  # parameters: x then c; reply: y_i then c_i+ - c_i
PEER_FEDDYN = "feddyn"  # parameters: x; reply: w_i; alpha under FEDDYN_ALPHA
FEDDYN_ALPHA = "feddyn-alpha"  # fit config: FedDyn's alpha > 0
SCAFFOLD_STATE_C = "flwr_admm.scaffold.c"  # ADMMClient: SCAFFOLD's control variate c_i
FEDDYN_STATE_GRAD = "flwr_admm.feddyn.grad"  # ADMMClient: FedDyn's linear term grad_i
PEER_STATE_META = "flwr_admm.peer.meta"  # ADMMClient: round of the state above (META_ROUND)
# ADMMClient: the state before the one above, kept until the server acknowledges that
# one (``admm-ack-round``); the reply reports the round it trained from (PREVIOUS_ROUND)
SCAFFOLD_COMMITTED_C = "flwr_admm.scaffold.c.committed"
FEDDYN_COMMITTED_GRAD = "flwr_admm.feddyn.grad.committed"
PEER_COMMITTED_META = "flwr_admm.peer.committed-meta"  # its round (META_ROUND)
SERVER_STEP = "server_step"  # round metric: SCAFFOLD's eta_g
# Message API (flwr_admm.serverapp.SCAFFOLD): the ArrayRecord carrying c down and
# c_i+ - c_i up, under the model's tensor names, next to x / y_i under ``arrays``.
SCAFFOLD_CONTROL_RECORD = "scaffold-control"

# --------------------------------------- reply metrics kept out of the round metrics
# A reply's identity and protocol entries are no metric (a weighted mean of partition
# ids is noise): `flwr_admm.rounds.exchange.without_reply_keys` drops them, and every key
# starting with REPLY_ONLY_PREFIX, from what a metrics-aggregation function returns.
REPLY_ONLY_METRICS = (CLIENT_KEY, PARTITION_ID, NUM_EXAMPLES)
REPLY_ONLY_PREFIX = "admm-"
