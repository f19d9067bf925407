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

from flwr.app import ArrayRecord, ConfigRecord, MetricRecord

from flwr_admm.core.consensus import ConsensusADMM
from flwr_admm.core.linearized import dual_tensors
from flwr_admm.core.tensor_policy import TensorSplit
from flwr_admm.protocol import (
    DUAL_RECORD,
    FORM,
    FORM_LINEARIZED,
    MESSAGE_PROXIMAL_MU,
    MESSAGE_SERVER_ROUND,
)
from flwr_admm.serverapp.records import Layout

__all__ = ["linearized_records"]

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
    config = {**user, FORM: FORM_LINEARIZED, MESSAGE_PROXIMAL_MU: 0.0}
    config[MESSAGE_SERVER_ROUND] = server_round
    return {
        keys[0]: z,
        DUAL_RECORD: layout.record(dual_tensors(admm, split, key)),
        keys[1]: ConfigRecord(config),
    }
