"""The Message-API records of FedADMM's linearized form (`flwr_admm.core.linearized`).

Down: z under ``arrays`` (the same record for every node), y_i under ``admm-dual``
(the model's tensor names and dtypes; zeros for a new client and for tensors outside
the consensus), and in the config ``admm-form = "linearized"``, ``proximal-mu = 0``
(no prox term: a stock FedProx handler runs FedAvg's steps) and ``server-round``.
Up: w_i under ``arrays`` and, in the MetricRecord, ``admm-step-budget`` b_i > 0
(rho_i = 1 / b_i). A reply without it did not run the form (a stock handler, or a
helper predating it): it is rejected, naming the key, never folded with a guessed rho_i.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, MetricRecord

from flwr_admm.core.consensus import ConsensusADMM
from flwr_admm.core.linearized import scale_of_budget
from flwr_admm.core.tensor_policy import TensorSplit
from flwr_admm.protocol import (
    DUAL_RECORD,
    FORM,
    FORM_LINEARIZED,
    MESSAGE_PROXIMAL_MU,
    MESSAGE_SERVER_ROUND,
    STEP_BUDGET,
)
from flwr_admm.serverapp.records import Layout

__all__ = ["budget_scale", "linearized_records"]

Records = dict[str, ArrayRecord | ConfigRecord | MetricRecord]


def linearized_records(
    admm: ConsensusADMM,
    split: TensorSplit,
    layout: Layout,
    key: str | None,
    z: ArrayRecord,
    user: Mapping[str, Any],
    server_round: int,
    keys: tuple[str, str],
) -> Records:
    """Return one node's train records: z, its dual y_i (zeros if new) and the config.

    `keys` are the strategy's (arrayrecord_key, configrecord_key).
    """
    record = admm.records.get(key) if key is not None else None
    y = [np.zeros_like(t) for t in admm.z] if record is None else record.y
    full = list(split.merge(y))
    for i in split.held:  # the tensors outside the consensus carry no dual
        full[i] = np.zeros(np.shape(full[i]))
    config = {**user, FORM: FORM_LINEARIZED, MESSAGE_PROXIMAL_MU: 0.0}
    config[MESSAGE_SERVER_ROUND] = server_round
    return {keys[0]: z, DUAL_RECORD: layout.record(full), keys[1]: ConfigRecord(config)}


def budget_scale(metrics: Mapping[str, Any]) -> tuple[float | None, str | None]:
    """Return (s_i = 1 / b_i, None) from a reply's ``admm-step-budget``, or (None, problem)."""
    if STEP_BUDGET not in metrics:
        return None, (
            f"no {STEP_BUDGET!r} in its metrics: the handler did not run FedADMM's "
            "linearized form (a stock FedProx/FedAvg handler, or a helper predating it); "
            "serve it with flwr_admm.clientapp.ADMMTrainStep or make_client_app, or use "
            "form='prox'"
        )
    try:
        return scale_of_budget(metrics[STEP_BUDGET], STEP_BUDGET), None
    except ValueError as error:
        return None, str(error)
