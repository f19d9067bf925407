"""FedADMM on Flower's legacy strategy API (the round: `flwr_admm.FedADMM`).

A drop-in for Flower's legacy ``FedProx``: ``configure_fit`` sends client i its prox
center v_i = z - u_i as the parameters and ``rho`` (and ``proximal_mu`` = rho) in the
config, so an unmodified FedProx client (start at the received parameters, add
proximal_mu/2 ||w - received||^2) runs a valid inexact ADMM w-step. The round is
`flwr_admm.rounds.fedadmm.FedADMMRound`, the same the Message-API strategy runs: the
same replies give the same iterates.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from typing import Any

from flwr_admm.core import ConsensusADMM, HealthCheck, RhoSchedule
from flwr_admm.core.health import DEFAULT_HEALTH
from flwr_admm.core.linearized import FormSpec, check_form, strategy_settings
from flwr_admm.core.regularizers import Regularizer
from flwr_admm.core.settings import DEFAULT_ACCELERATION, FAST_CONVEX, TEXTBOOK, ConsensusSettings
from flwr_admm.core.steps import ZAverage
from flwr_admm.core.tensor_policy import check_rules
from flwr_admm.options import Checkpointing, ClientPolicy, Convergence, Uplink, option
from flwr_admm.rounds.fedadmm import FedADMMRound
from flwr_admm.server.strategy import RoundStrategy
from flwr_admm.uplink.channel import UplinkChannel

__all__ = ["FedADMM", "fast_convex", "textbook"]


class FedADMM(RoundStrategy):
    """Federated inexact consensus ADMM (server-held duals), Flower's legacy strategy API.

    The round, the defaults and every keyword below are those of the Message-API
    `flwr_admm.serverapp.FedADMM`, the reference; the same replies give the same
    iterates. Takes Flower's legacy `FedAvg` keywords plus these, all keyword-only as
    Flower's legacy FedAvg:

    Parameters
    ----------
    rho, proximal_mu, rho_schedule, regularizer, relaxation, dual_step, acceleration, \
    z_average, form, convergence, sampling_seed, clients, checkpoint, uplink, \
    tensor_policy, health :
        As in `flwr_admm.serverapp.FedADMM`. Clients are Flower's `ClientProxy`s (keyed
        by ``client-key`` or ``partition-id`` in the fit metrics, else the cid); the
        start point z follows the center as a second block of tensors (config
        ``admm-start = 1``) for clients whose replies say they start there
        (`flwr_admm.rounds.fedadmm.StartMarks`). Under ``form="linearized"`` the parameters
        are z followed by y_i, the config holds ``admm-form = "linearized"`` and
        ``proximal_mu = 0``, and a reply without ``admm-step-budget`` is rejected.
    tensor_names : sequence of str, optional
        The names the `tensor_policy` patterns match (e.g. ``list(model.state_dict())``);
        default ``"0"``, ``"1"``, ... (legacy parameters carry no names).

    """

    def __init__(
        self,
        *,
        rho: float | None = None,
        proximal_mu: float | None = None,
        rho_schedule: RhoSchedule | str | None = None,
        regularizer: Regularizer | None = None,
        relaxation: float | None = None,
        dual_step: float | None = None,
        acceleration: str | None = DEFAULT_ACCELERATION,
        z_average: ZAverage = "cached",
        form: FormSpec = "prox",
        convergence: Convergence = Convergence(),
        sampling_seed: int | None = 0,
        clients: ClientPolicy = ClientPolicy(),
        checkpoint: Checkpointing | None = None,
        uplink: Uplink | None = None,
        tensor_policy: Mapping[str, str] | None = None,
        health: HealthCheck | None = DEFAULT_HEALTH,
        tensor_names: Sequence[str] | None = None,
        **fedavg_kwargs: Any,
    ) -> None:
        form_name = check_form(form)
        rules = check_rules(tensor_policy)
        stopping = option("convergence", convergence, Convergence)
        link = Uplink() if uplink is None else option("uplink", uplink, Uplink)
        settings = strategy_settings(
            form,
            {"rho": rho, "proximal_mu": proximal_mu, "rho_schedule": rho_schedule},
            regularizer=regularizer,
            eps_abs=stopping.eps_abs,
            eps_rel=stopping.eps_rel,
            relaxation=relaxation,
            acceleration=acceleration,
            z_average=z_average,
            dual_step=dual_step,
            channel={"uplink": link.compressor, "local_dp": link.local_dp},
        )
        channel = UplinkChannel(link.compressor, link.local_dp, link.residual)
        self.algorithm = FedADMMRound(settings, form_name, channel, rules, start="marked")
        super().__init__(
            self.algorithm,
            sampling_seed=sampling_seed,
            clients=clients,
            checkpoint=checkpoint,
            health=health,
            stop_on_convergence=stopping.stop,
            tensor_names=tensor_names,
            **fedavg_kwargs,
        )

    @property
    def admm(self) -> ConsensusADMM | None:
        """The server state (built from the first z received; `algorithm` holds it)."""
        return self.algorithm.admm

    @property
    def admm_settings(self) -> ConsensusSettings:
        """The checked core settings (``rho``, ``relaxation``, ...)."""
        return self.algorithm.settings

    def __repr__(self) -> str:
        s = self.admm_settings
        return (
            f"FedADMM(rho={s.rho}, rho_schedule={type(s.rho_schedule).__name__}, "
            f"regularizer={s.regularizer!r}, relaxation={s.relaxation}, "
            f"acceleration={s.acceleration!r})"
        )


#: The seeds' textbook iteration: constant rho, alpha = 1, no acceleration, gamma = 1.
textbook = functools.partial(FedADMM, **TEXTBOOK)
#: Full-batch convex clients: fast ADMM, alpha = 1.6, gamma = 1 from rho = 1 (docs/options.md).
fast_convex = functools.partial(FedADMM, **FAST_CONVEX)
