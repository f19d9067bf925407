"""FedADMMClientDuals: consensus ADMM with client-held duals (server keeps z, S, N).

Uniform constant rho > 0, scaled dual u_i kept by client i in its ``context.state``.
The server stores the consensus z, S = sum_i n_i c_i and N = sum_i n_i, where
c_i = w_i + u_i is client i's last contribution, plus two small integers per client
key (n_i and the round it last took part in). Round k:

    server   broadcasts z^k (with each sampled client's acknowledgement, see below)
    client   if it took part before:  d2_i = ||w_i - z^k||^2,  u_i += gamma (w_i - z^k)
             w_i' ~ argmin f_i(w) + rho/2 ||w - (z^k - u_i)||^2    (inexact local solve)
             sends Delta_i = n_i' (w_i' + u_i) - n_i c_i, then keeps w_i', u_i, n_i'
    server   S += Delta_i, N += n_i' - n_i  (one pass per reply, like FedAvg)
             z^{k+1} = prox_{g/rho}(S / N)

With every client in every round this is exactly server-held FedADMM with constant
rho: the z-step of round k+1 averages w_i^{k+1} + u_i^k with u_i^k updated by z^k.
Under partial participation it is a delayed-dual variant: a client's dual update uses
the z it sees at its next participation, and absent clients count with their
pre-update dual (server-held FedADMM updates u_i with the z of the round it replied).

Fast ADMM with restart (``acceleration``; `flwr_admm.core.dual_momentum`):
the server extrapolates z^_{k+1} = z_k + g (z_k - z_{k-1}) and sends it with z_k (a
second block of tensors) and g (``admm-accel-gamma``); client i sets u_i = u^_i + w_i -
z_k, extrapolates its own dual u^_i' = u_i + g (u_i - u_i,prev), trains around z^_{k+1}
- u^_i' and sends Delta_i = n_i' (w_i' + u^_i') - n_i (w_i + u^_i): S stays exact. The
restart test is `FedADMM`'s, in time, while every client replies every round (from
the clients' ``admm-hat-sq-residual``); otherwise it lags a round.

Residuals. s = rho ||z^{k+1} - z^k|| as usual. The primal residual arrives one round
late: client i reports d2_i for its previous w_i, so the metric
``previous_primal_residual`` = sqrt(sum n_i d2_i / sum n_i) over the replying clients
that had taken part before is server-held FedADMM's primal residual of round k - 1
(with full participation). eps_pri = sqrt(P) eps_abs + eps_rel max(sqrt(sum p_i
||w_i'||^2), ||z^{k+1}||), eps_dual = sqrt(P) eps_abs + eps_rel rho sqrt(sum p_i
||u_i||^2), p_i = n_i / sum of the replies' n.

Acknowledgement. A reply the server does not use (lost after the client saved its
state, a duplicate, a replay, a NaN, a truncated payload, a round dropped with
``accept_failures=False``) must not leave the client a step ahead of S. So each
sampled client's fit config carries ``admm-ack-round`` = a, the round whose
contribution S holds for its key (0: none), and the client keeps its committed state
C (round a_c, what S held) next to its pending state P (round p, after its last
reply). It trains from P if p == a (the reply was used: C := P), from C if a_c == a
(it was not: P is dropped, and so is its compression residual), fresh if a == 0;
otherwise its state is gone (a SuperNode restart) and it resynchronizes: a full
contribution F_i = n_i' c_i' as a new client (previous round 0, ``admm-resync`` = 1).
A reply that reports a previous round other than the server's record (a replay, a
duplicate) is rejected (``num_state_mismatch``) without touching S; the next
acknowledgement brings the client back.

Rebuild sweep. A resync for a key S holds is accepted (N += n_i' - n_i, S += F_i,
``num_resynced``), but S still holds the client's old share, which the server cannot
subtract (it never had it). S without it is the sum of the current shares, so the
server sweeps (`flwr_admm.rounds.client_duals_sweep`): every sampled key not yet
rebuilt gets ``admm-rebuild`` = 1 and replies with its usual Delta_j and, as a second
block of tensors in full precision, its full share sigma_j' = n_j' c_j' - e_j'; S +=
Delta_j as usual and S_new += sigma_j' (rebuilt keys add Delta_j to S_new too; new and
resyncing keys count as rebuilt with their first contribution). Once every key the
server holds has rebuilt, S := S_new, exactly. Until then the stale shares keep their
weight N_stale in z = prox_{g/rho}(S / (N + N_stale)) and the round metric
``rebuilding`` is 1 (and ``converged`` 0). An evicted key's share leaves S the same way
(`_evict`). Cost: one extra model-sized upload per client per sweep, one extra model
copy (S_new) on the server while it runs; under full participation it ends one round
after it started. A key that never returns keeps the sweep open until it is evicted.
The server keeps a resync's F_i (while a sweep is on, or while the key keeps
resyncing): the key's next resync or eviction takes that share out of S exactly, so
a client that loses its state every round, or forges resyncs, adds its n to N_stale
at most once per sweep (known shares K, `flwr_admm.rounds.client_duals_sweep`).

Checkpoints (``checkpoint``) hold z, S, N, the per-key entries, the sweep (S_new,
the rebuilt keys, N_stale), fast ADMM's state, the round, the convergence flag and a
fingerprint of the configuration. The duals stay with the clients: a resumed run
continues exactly if they kept their ``context.state`` (persistent SuperNodes); a
client that lost it, or went on past the checkpoint's round, resynchronizes.

Uplink compression (``uplink=Uplink(compressor=...)``, with error feedback). Client i
keeps a residual e_i (zero at first) in its ``context.state`` next to its dual, compresses
x = Delta_i + e_i, sends the payload and keeps e_i' = x - decode(payload); the server
adds decode(payload) to S (no center: the payload is the contribution change itself).
By telescoping, S = sum_i n_i c_i - sum_i e_i exactly (up to float rounding): the
unsent part waits on the client and enters S with its next reply. ``uplink_bytes``
reports the payload bytes of each round as in `FedADMM`. Local DP is not supported.

Clients MUST follow the protocol above; `ADMMClient` does on ``admm-duals = "client"``.
The client side of the protocol lives in `flwr_admm.client.client_duals`; the round
(`flwr_admm.rounds.client_duals.ClientDualsRound`, the same the Message API runs) and
its state and checks in `flwr_admm.rounds.client_duals_state`; sampling, reply order,
duplicate keys and checkpoints in `flwr_admm.rounds.layer.RoundLayer`.
"""

from __future__ import annotations

from typing import Any

from flwr_admm.core.health import DEFAULT_HEALTH, HealthCheck
from flwr_admm.core.linearized import FormSpec
from flwr_admm.core.regularizers import Regularizer
from flwr_admm.core.types import Arrays
from flwr_admm.options import Checkpointing, ClientPolicy, Convergence, Uplink
from flwr_admm.rounds.client_duals import ClientDualsRound
from flwr_admm.rounds.client_duals_state import ClientDualsState
from flwr_admm.server.strategy import RoundStrategy

__all__ = ["FedADMMClientDuals"]


class FedADMMClientDuals(RoundStrategy):
    """Federated consensus ADMM with client-held duals (see the module docstring).

    Takes Flower's `FedAvg` keywords plus these; all keyword-only, as Flower's legacy FedAvg.

    Parameters
    ----------
    rho, proximal_mu : float
        Constant penalty rho > 0 (default 1). ``proximal_mu`` is FedProx's name for
        it: give either (both: equal, else ValueError; `given_rho`). A changing or
        per-client rho or over-relaxation would need every client's dual, which the
        server does not hold: use `FedADMM` for them.
    regularizer : Regularizer, optional
        Server regularizer g (`L1`, `L2`); the z-step is prox_{g/rho}(S / N).
    dual_step : float in (0, 1]
        The clients' dual step gamma: u_i += gamma (w_i - z^k), sent as
        ``admm-dual-step`` when it is not 1 (as `FedADMM`'s ``dual_step``; the same
        fixed point).
    acceleration : {None, "nesterov"}
        Fast ADMM with restart (module docstring); refused under SecAgg+
        (`FedADMMClientDualsSecAgg`).
    form : {"prox", "linearized"} or Linearized
        The linearized form with client-held duals, as in
        `flwr_admm.serverapp.FedADMMClientDuals` (config ``admm-form``; a reply without
        ``admm-step-budget`` is rejected); under SecAgg+ b_i travels in the clear.
    convergence : Convergence
        Tolerances of Boyd's stopping thresholds eps_pri / eps_dual; with ``stop``,
        sample no clients once r_prev <= eps_pri and s <= eps_dual.
    sampling_seed : int or None
        Seeded client sampling as in `FedADMM`; None uses Flower's unseeded sampling.
    clients : ClientPolicy
        Client identity and eviction, as in `FedADMM`: under ``key_binding="node"``
        (default) a key is accepted only from its node; an evicted key's share leaves
        S through the rebuild sweep.
    checkpoint : Checkpointing, optional
        Write the server state (z, S, N, per-key n_i and last round, round, converged,
        config fingerprint) to ``directory`` after every ``every`` aggregations. If it
        already holds a checkpoint and ``resume`` is true, start from it; round numbers
        continue (a mismatched or damaged checkpoint is an error, never a silent fresh
        start). The clients' duals are not in it: they must keep their state.
    uplink : Uplink, optional
        Uplink compression of the clients' contribution changes (``compressor``:
        `StochasticQuantizer`, `TopK`), with error feedback (required:
        ``error_feedback=False`` is refused, since S would keep every compression
        error). Each client keeps its residual e_i in its ``context.state``; S = sum_i
        n_i c_i - sum_i e_i. The round metric ``uplink_bytes`` counts the payload
        bytes. ``local_dp`` and ``residual="dual"`` are `FedADMM`'s only (ValueError).
    health : HealthCheck or None
        Divergence watchdog, as in `FedADMM` (`flwr_admm.core.health`); None: off.

    """

    def __init__(
        self,
        *,
        rho: float | None = None,
        proximal_mu: float | None = None,
        regularizer: Regularizer | None = None,
        dual_step: float = 1.0,
        acceleration: str | None = None,
        form: FormSpec = "prox",
        convergence: Convergence = Convergence(),
        sampling_seed: int | None = 0,
        clients: ClientPolicy = ClientPolicy(),
        checkpoint: Checkpointing | None = None,
        uplink: Uplink | None = None,
        health: HealthCheck | None = DEFAULT_HEALTH,
        **fedavg_kwargs: Any,
    ) -> None:
        self.algorithm = self._round(
            rho=rho,
            proximal_mu=proximal_mu,
            regularizer=regularizer,
            convergence=convergence,
            dual_step=dual_step,
            acceleration=acceleration,
            uplink=uplink,
            form=form,
        )
        super().__init__(
            self.algorithm,
            sampling_seed=sampling_seed,
            clients=clients,
            checkpoint=checkpoint,
            health=health,
            stop_on_convergence=convergence.stop,
            **fedavg_kwargs,
        )

    def _round(self, **settings: Any) -> ClientDualsRound:
        """Return the round this strategy runs (SecAgg+: `SecureClientDualsRound`)."""
        return ClientDualsRound(**settings)

    @property
    def state(self) -> ClientDualsState:
        """The server state: z, S, N, the per-key entries and the sweep (`algorithm` holds it)."""
        return self.algorithm.state

    @property
    def z(self) -> Arrays | None:
        """The consensus the next round sends (z^_{k+1} with fast ADMM)."""
        return self.algorithm.state.z

    def __repr__(self) -> str:
        state = self.algorithm.state
        return f"FedADMMClientDuals(rho={state.rho}, regularizer={state.regularizer!r})"
