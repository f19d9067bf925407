"""`ADMMTrainStep`: a user's own ``@app.train()`` handler under the Message-API strategies.

The node's half of the round is `flwr_admm.node.step.NodeRound`; this class reads it
from a message and answers it::

    @app.train()
    def train(msg: Message, context: Context) -> Message:
        step = ADMMTrainStep.from_message(msg, context)
        w = step.start()                       # dict name -> float64 array (init=...)
        ...                                    # local steps on f_i + step.rho/2 ||w - center||^2
        return step.reply(w, num_examples=n, metrics={"loss": loss}, context=context)

The same handler serves Flower's FedProx and FedAvg (``rho`` is mu or 0) and
`FedADMMClientDuals` (pass `context`: the states live in ``context.state``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from flwr.app import Context, Message
from numpy.typing import NDArray

from flwr_admm.clientapp.records import (
    Named,
    build_reply,
    key_metrics,
    node_records,
    ordered,
    plain,
    received_arrays,
    received_block,
    reply_message,
)
from flwr_admm.core.linearized import step_budget
from flwr_admm.core.types import Arrays
from flwr_admm.node.blocks import companion
from flwr_admm.node.config import client_held, read_rho, server_round_of
from flwr_admm.node.duals import DualsRound
from flwr_admm.node.records import message_previous
from flwr_admm.node.start import LocalInit, start_of
from flwr_admm.node.step import NodeRound, start_mark
from flwr_admm.protocol import (
    DP_CLIP,
    DP_NOISE,
    NUM_EXAMPLES,
    SCAFFOLD_CONTROL_RECORD,
    START_RECORD,
    UPLINK,
)

__all__ = [
    "ADMMTrainStep",
    "build_reply",
    "read_rho",
    "received_arrays",
    "refuse_uplink",
    "step_budget",
    "warm_start",
]


def refuse_uplink(config: Mapping[str, Any]) -> None:
    """Raise ValueError if the server asks for uplink compression or local DP.

    A handler built on `ADMMTrainStep` or `flwr_admm.torch.TorchADMM` replies with
    plain tensors: it neither compresses nor clips and noises. The ready client
    (`flwr_admm.clientapp.make_client_app`, `flwr_admm.client.ADMMClient`) does both; a
    silent plain reply would let the server report a privacy it did not get.
    """
    for key in config:
        if key.startswith(UPLINK) or key in (DP_CLIP, DP_NOISE):
            raise ValueError(
                f"{key}: the strategy asks for uplink compression or local DP, which this "
                "handler does not apply (ADMMTrainStep / TorchADMM reply with plain "
                "tensors); drop uplink / local_dp from the strategy, or serve the model "
                "with the ready client (make_client_app, ADMMClient)"
            )


def warm_start(context: Context, like: Mapping[str, NDArray[Any]]) -> Named | None:
    """Return the w_i this node last replied with, if it has the names and shapes of `like`."""
    return message_previous(context.state, like)


@dataclass(frozen=True)
class ADMMTrainStep:
    """What a train handler needs for one local ADMM step, read from the message.

    The round's values are `flwr_admm.node.step.NodeRound`'s, by tensor name and in
    float64. Under the linearized form run K steps w <- w - lr (grad f_i(w) + y_i)
    from `start` with y_i = `correction`, and pass ``step_budget=step_budget(K, lr)``
    (``step_budget(K, lr, momentum)`` with momentum SGD) to `reply`.

    Attributes
    ----------
    message : Message
        The received message (the reply answers it).
    config : dict
        The received config (a copy).

    """

    message: Message
    center: Named
    rho: float
    admm: bool
    server_round: int | None
    config: dict[str, Any]
    previous: Named | None
    arrayrecord_key: str = "arrays"
    configrecord_key: str = "config"
    duals: DualsRound | None = None
    consensus: Named | None = None
    form: str = "prox"
    correction: Named | None = None
    started: dict[str, bool] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_message(
        cls,
        message: Message,
        context: Context,
        *,
        arrayrecord_key: str = "arrays",
        configrecord_key: str = "config",
    ) -> ADMMTrainStep:
        """Read the center, rho, the round and the warm start of one train message."""
        received = received_arrays(message, arrayrecord_key)
        center = {name: np.asarray(a, dtype=np.float64) for name, a in received.items()}
        record = message.content.config_records.get(configrecord_key)
        config = dict(record.items()) if record is not None else {}
        refuse_uplink(config)
        second = companion(config)
        if second is None and START_RECORD in message.content.array_records:
            second = None if client_held(config) else START_RECORD  # FedADMM: z next to v_i
        if second == SCAFFOLD_CONTROL_RECORD:  # c is `received_control`'s, not this step's
            second = None
        block = None if second is None else received_block(message, second, center)
        previous = warm_start(context, center)
        server_round = server_round_of(config)
        node = NodeRound.open(
            list(center.values()),
            config,
            context.state,
            second=None if block is None else [np.asarray(t, np.float64) for t in block.values()],
            previous=None if previous is None else list(previous.values()),
            server_round=server_round,
        )
        names = list(center)

        def by_name(arrays: Arrays | None) -> Named | None:
            return None if arrays is None else dict(zip(names, arrays, strict=True))

        return cls(
            message=message,
            center=dict(zip(names, node.center, strict=True)),
            rho=node.rho,
            admm=node.admm,
            server_round=server_round,
            config=config,
            previous=by_name(node.previous),
            arrayrecord_key=arrayrecord_key,
            configrecord_key=configrecord_key,
            duals=node.duals,
            consensus=by_name(node.consensus),
            form=node.form,
            correction=by_name(node.correction),
        )

    def start(self, *, init: LocalInit | None = None) -> Named:
        """Return where the local solve starts (copies), by `flwr_admm.node.start`'s rule.

        `init` is `ADMMClient`'s ``local_init`` ("consensus" without a received z:
        ValueError).
        """
        source, at_z = start_of(
            init,
            form=self.form,
            admm=self.admm,
            rho=self.rho,
            center=self.center,
            previous=self.previous,
            consensus=self.consensus,
        )
        if self.form != "linearized":
            self.started["at_z"] = at_z  # the reply's START_MARK
        return {name: a.copy() for name, a in source.items()}

    def mark(self, metrics: Mapping[str, Any] | None) -> dict[str, Any]:
        """Return `metrics` with `start_mark`'s entry under server-held FedADMM."""
        at_z = self.started.get("at_z", False)
        return {**(metrics or {}), **start_mark(self.admm and self.duals is None, at_z)}

    def reply(
        self,
        arrays: Mapping[str, NDArray[Any]] | Sequence[NDArray[Any]],
        num_examples: int,
        metrics: Mapping[str, Any] | None = None,
        context: Context | None = None,
        *,
        step_budget: float | None = None,
    ) -> Message:
        """Return the reply (`build_reply`); with `context`, keep w_i as the next warm start.

        The context also gives the reply its client key (``partition-id``, ``client-key``);
        under the linearized form, which starts at z, nothing is kept.

        Under the linearized form `step_budget` b_i is required (``admm-step-budget``).
        With client-held duals the reply carries Delta_i (and sigma_i' when asked) and
        the protocol metrics, and both dual states are kept in ``context.state``
        (required then).
        """
        if self.duals is not None and context is None:
            raise ValueError("context: required with client-held duals (states live there)")
        names = list(self.center)
        center = list(self.center.values())
        node = NodeRound(
            center, self.rho, self.admm, self.server_round, form=self.form, duals=self.duals
        )
        answer = node.close(
            ordered(arrays, names),
            int(num_examples),
            at_z=self.started.get("at_z", False),
            step_budget=step_budget,
        )
        if self.duals is None:
            # the context gives the client key; the linearized form starts at z: no warm start
            keep = None if self.form == "linearized" else context
            key = key_metrics(context) if context is not None and keep is None else {}
            return build_reply(
                self.message,
                arrays,
                num_examples,
                {**key, **(metrics or {}), **answer.metrics},
                keep,
                arrayrecord_key=self.arrayrecord_key,
                configrecord_key=self.configrecord_key,
            )
        assert context is not None
        reported = key_metrics(context)
        reported.update({name: plain(value, name) for name, value in (metrics or {}).items()})
        reported.update({**answer.metrics, NUM_EXAMPLES: int(num_examples)})
        reply = reply_message(
            self.message, node_records(names, answer, self.arrayrecord_key), reported
        )
        answer.commit(context.state)  # last: after all can fail
        return reply
