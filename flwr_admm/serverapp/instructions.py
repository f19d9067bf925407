"""What each sampled node receives from the Message-API `FedADMM`, per form.

Prox form (`prox_records`, the default): the center v_i = z - y_i / rho_i under
``arrays`` (z itself for a new client), z again under ``admm-start`` (where our client
helpers start the local solve; not sent when rho_i = 0), and in the config ``rho``,
``proximal-mu`` (both rho_i: what a stock FedProx handler reads) and ``server-round``.

Both forms: the model's tensor names, dtypes and shapes, the given config copied.

Linearized form (`linearized_records`, `flwr_admm.core.linearized`). Down: the start
under ``arrays``, the same record for every node (z, or the momentum start
x = z + beta (z - z_prev) of `flwr_admm.core.start_momentum`), y_i under ``admm-dual`` (the model's
tensor names and dtypes; zeros for a new client and for tensors outside the
consensus), and in the config ``admm-form = "linearized"``, ``proximal-mu = 0`` (no
prox term: a stock FedProx handler runs FedAvg's steps) and ``server-round``. Up: w_i
under ``arrays`` and, in the MetricRecord, ``admm-step-budget`` b_i > 0 (rho_i =
1 / b_i). A reply without it did not run the form (a stock handler, or a helper
predating it): it is rejected, naming the key, never folded with a guessed rho_i.

`train_message` wraps either in a TRAIN message (group_id: the round, so SuperNodes
log "[RUN r, ROUND k]" as on the legacy API).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from flwr.app import ArrayRecord, ConfigRecord, Message, MessageType, MetricRecord, RecordDict

from flwr_admm.core.consensus import ConsensusADMM
from flwr_admm.core.linearized import dual_tensors
from flwr_admm.core.tensor_policy import TensorSplit
from flwr_admm.protocol import (
    DUAL_RECORD,
    FORM,
    FORM_LINEARIZED,
    MESSAGE_PROXIMAL_MU,
    MESSAGE_SERVER_ROUND,
    RHO,
    START_RECORD,
)
from flwr_admm.serverapp.records_old import Layout

__all__ = ["linearized_records", "prox_records", "train_message"]

Records = dict[str, ArrayRecord | ConfigRecord | MetricRecord]


def linearized_records(
    admm: ConsensusADMM,
    split: TensorSplit,
    layout: Layout,
    key: str | None,
    start: ArrayRecord,
    user: Mapping[str, Any],
    server_round: int,
    keys: tuple[str, str],
) -> Records:
    """Return one node's train records: the start, its dual y_i (zeros if new) and the config.

    `keys` are the strategy's (arrayrecord_key, configrecord_key).
    """
    config = {**user, FORM: FORM_LINEARIZED, MESSAGE_PROXIMAL_MU: 0.0}
    config[MESSAGE_SERVER_ROUND] = server_round
    return {
        keys[0]: start,
        DUAL_RECORD: layout.record(dual_tensors(admm, split, key)),
        keys[1]: ConfigRecord(config),
    }


def prox_records(
    center: ArrayRecord,
    z: ArrayRecord,
    rho_i: float,
    user: Mapping[str, Any],
    server_round: int,
    keys: tuple[str, str],
) -> Records:
    """Return one node's train records in the prox form: v_i, z (if rho_i > 0), the config.

    `keys` are the strategy's (arrayrecord_key, configrecord_key).
    """
    config = {**user, RHO: rho_i, MESSAGE_PROXIMAL_MU: rho_i, MESSAGE_SERVER_ROUND: server_round}
    records: Records = {keys[0]: center, keys[1]: ConfigRecord(config)}
    if rho_i > 0:  # x = z: where our client helpers start the local solve
        records[START_RECORD] = z
    return records


def train_message(records: Records, node_id: int, server_round: int) -> Message:
    """Return the TRAIN message carrying `records` to `node_id`."""
    return Message(
        RecordDict(dict(records)),
        dst_node_id=node_id,
        message_type=MessageType.TRAIN,
        group_id=str(server_round),
    )
