"""FedADMM on Flower's legacy strategy API: a drop-in for Flower's legacy ``FedProx``."""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from typing import Any

from flwr_admm.core import ConsensusADMM, HealthCheck, RhoSchedule
from flwr_admm.core.health import DEFAULT_HEALTH
from flwr_admm.core.linearized import FormSpec
from flwr_admm.core.regularizers import Regularizer
from flwr_admm.core.schedules import DualStep
from flwr_admm.core.settings import TEXTBOOK, ConsensusSettings
from flwr_admm.core.steps import ZAverage
from flwr_admm.options import Checkpointing, ClientPolicy, Convergence, Uplink, option
from flwr_admm.rounds.fedadmm import FedADMMRound
from flwr_admm.server.strategy import RoundStrategy

__all__ = ["FedADMM", "textbook"]


class FedADMM(RoundStrategy):
    """Federated inexact consensus ADMM (server-held duals), Flower's legacy strategy API.

    As `flwr_admm.serverapp.FedADMM` (the round, the defaults, the keywords) but for
    ``form``, "prox" by default: the linearized form appends y_i to the parameters,
    which a stock FedProx NumPyClient cannot read (None: the Message API's default
    form). The same replies give the same iterates. Takes Flower's legacy `FedAvg`
    keywords, that class's own and `tensor_names`, all keyword-only.

    Legacy wire: the parameters are v_i and the config holds ``rho`` = ``proximal_mu``
    = rho_i, the keys Flower's legacy FedProx client reads (a stock one, whose replies
    carry no ``admm-started-at-z``, has its dual held at 0 as in the Message API). For a
    client whose last reply said it starts at z (``admm-started-at-z`` = 1) and whose
    v_i is not z, z follows v_i as a second block (config ``admm-start`` = 1). In the
    linearized form the parameters are z followed by y_i, with ``admm-form`` =
    "linearized" and ``proximal_mu`` = 0.1.

    Parameters
    ----------
    tensor_names : sequence of str, optional
        The names the ``tensor_policy`` patterns match (e.g. ``list(model.state_dict())``);
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
        dual_step: DualStep | None = None,
        z_average: ZAverage = "cached",
        form: FormSpec | None = "prox",
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
        stopping = option("convergence", convergence, Convergence)
        self.algorithm = FedADMMRound.of(
            {"rho": rho, "proximal_mu": proximal_mu, "rho_schedule": rho_schedule},
            regularizer=regularizer,
            relaxation=relaxation,
            dual_step=dual_step,
            z_average=z_average,
            form=form,
            convergence=stopping,
            uplink=uplink,
            tensor_policy=tensor_policy,
            start="marked",
        )
        super().__init__(
            self.algorithm,
            fedavg_kwargs,
            sampling_seed=sampling_seed,
            clients=clients,
            checkpoint=checkpoint,
            health=health,
            stop_on_convergence=stopping.stop,
            tensor_names=tensor_names,
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
            f"form={self.algorithm.form!r})"
        )


#: As `flwr_admm.serverapp.fedadmm.textbook`, on the legacy API.
textbook = functools.partial(FedADMM, **TEXTBOOK)
