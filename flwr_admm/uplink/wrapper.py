"""`UplinkWrapper`: the uplink channel (compression, local DP) for any legacy Strategy.

As Flower's ``DifferentialPrivacy*FixedClipping`` wrappers: the wrapped strategy gets
plain replies w_i = c_i + decode(payload), so baselines and `FedADMM` can be compared
at equal bytes and privacy with the same `ADMMClient`. Unusable payloads are dropped
and counted in ``num_rejected``. `FedADMM` takes the same options itself; do not wrap it.
"""

from __future__ import annotations

from functools import partial
from logging import WARNING

import numpy as np
from flwr.common import (
    EvaluateIns,
    EvaluateRes,
    FitIns,
    FitRes,
    NDArrays,
    Parameters,
    Scalar,
    ndarrays_to_parameters,
    parameters_to_ndarrays,
)
from flwr.common.logger import log
from flwr.server.client_manager import ClientManager
from flwr.server.client_proxy import ClientProxy
from flwr.server.strategy import Strategy

from flwr_admm.core.types import reply_problem
from flwr_admm.protocol import NUM_REJECTED
from flwr_admm.uplink.channel import UplinkChannel
from flwr_admm.uplink.compression import Compressor
from flwr_admm.uplink.privacy import LocalDP


class UplinkWrapper(Strategy):
    """Add uplink compression and/or local DP to a legacy Flower strategy.

    Parameters
    ----------
    strategy : Strategy
        The wrapped strategy (e.g. ``FedAvg(...)``, ``FedProx(...)``).
    uplink : Compressor, optional
        `StochasticQuantizer` or `TopK` (error feedback into the next update).
    local_dp : LocalDP, optional
        Client clipping and Gaussian noise; ``dp_epsilon`` is added to the metrics.

    """

    def __init__(
        self,
        strategy: Strategy,
        *,
        uplink: Compressor | None = None,
        local_dp: LocalDP | None = None,
    ) -> None:
        super().__init__()
        if not isinstance(strategy, Strategy):
            raise ValueError(f"strategy: must be a flwr Strategy, got {strategy!r}")
        self.strategy = strategy
        self.channel = UplinkChannel(uplink, local_dp)
        self._sent: dict[str, Parameters] = {}
        self._decoded: dict[int, NDArrays] = {}

    def __repr__(self) -> str:
        return (
            f"UplinkWrapper({self.strategy!r}, uplink={self.channel.compressor!r}, "
            f"local_dp={self.channel.local_dp!r})"
        )

    def initialize_parameters(self, client_manager: ClientManager) -> Parameters | None:
        """Return the wrapped strategy's initial parameters."""
        return self.strategy.initialize_parameters(client_manager)

    def configure_fit(
        self, server_round: int, parameters: Parameters, client_manager: ClientManager
    ) -> list[tuple[ClientProxy, FitIns]]:
        """Return the wrapped strategy's instructions, plus the channel's config entries."""
        instructions = self.strategy.configure_fit(server_round, parameters, client_manager)
        self.channel.sampled(len(instructions), client_manager.num_available())
        self._sent, self._decoded = {}, {}
        entries = self.channel.config()
        out = []
        for proxy, ins in instructions:
            self._sent[proxy.cid] = ins.parameters
            out.append((proxy, FitIns(ins.parameters, {**ins.config, **entries})))
        return out

    def _received_by(self, cid: str) -> NDArrays:
        parameters = self._sent[cid]  # KeyError: a reply from a client never sent a task
        key = id(parameters)  # FedAvg sends one Parameters object to every client
        if key not in self._decoded:
            self._decoded[key] = [
                np.asarray(a, dtype=np.float64) for a in parameters_to_ndarrays(parameters)
            ]
        return self._decoded[key]

    def aggregate_fit(
        self,
        server_round: int,
        results: list[tuple[ClientProxy, FitRes]],
        failures: list[tuple[ClientProxy, FitRes] | BaseException],
    ) -> tuple[Parameters | None, dict[str, Scalar]]:
        """Decode and validate every reply, then aggregate with the wrapped strategy."""
        decoded: list[tuple[ClientProxy, FitRes]] = []
        rejected = 0
        for proxy, res in results:
            try:
                shapes = [a.shape for a in self._received_by(proxy.cid)]
                arrays = self.channel.decode(res.parameters, partial(self._received_by, proxy.cid))
                problem = reply_problem(arrays, res.num_examples, shapes)
                problem = problem or self.channel.attestation_problem(res.metrics)
            except Exception as error:  # a malformed reply must not stop the server
                problem = f"unreadable reply ({error!r})"
            if problem is not None:
                log(WARNING, "UplinkWrapper: rejected reply of cid %s: %s", proxy.cid, problem)
                rejected += 1
                continue
            plain = ndarrays_to_parameters(arrays)
            decoded.append((proxy, FitRes(res.status, plain, res.num_examples, res.metrics)))
        parameters, metrics = self.strategy.aggregate_fit(server_round, decoded, failures)
        extra = self.channel.round_metrics(aggregated=parameters is not None)
        return parameters, {**metrics, **extra, NUM_REJECTED: rejected}

    def configure_evaluate(
        self, server_round: int, parameters: Parameters, client_manager: ClientManager
    ) -> list[tuple[ClientProxy, EvaluateIns]]:
        """Return the wrapped strategy's evaluation instructions."""
        return self.strategy.configure_evaluate(server_round, parameters, client_manager)

    def aggregate_evaluate(
        self,
        server_round: int,
        results: list[tuple[ClientProxy, EvaluateRes]],
        failures: list[tuple[ClientProxy, EvaluateRes] | BaseException],
    ) -> tuple[float | None, dict[str, Scalar]]:
        """Return the wrapped strategy's evaluation aggregate."""
        return self.strategy.aggregate_evaluate(server_round, results, failures)

    def evaluate(
        self, server_round: int, parameters: Parameters
    ) -> tuple[float, dict[str, Scalar]] | None:
        """Return the wrapped strategy's centralized evaluation."""
        return self.strategy.evaluate(server_round, parameters)
