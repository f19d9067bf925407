"""The legacy-API translator: Flower's legacy `FedAvg` around a round layer (`RoundLayer`).

`RoundStrategy` keeps Flower's legacy FedAvg surface (its keywords, all keyword-only;
``evaluate``, ``configure_evaluate``) and hands every fit round to the strategy's
`flwr_admm.rounds.layer.RoundLayer`: ``configure_fit`` decodes z^k, lets the layer
sample and instruct the clients and turns each `Instruction` into a FitIns (the
blocks' tensors one after the other: the model block first; a start block announced
by ``admm-start = 1``); ``aggregate_fit`` cuts each FitRes into model-sized blocks
(`flwr_admm.rounds.exchange.Incoming`), lets the layer admit and fold them and returns
z' with the round metrics. Nothing of the round's math is here.

Flower's legacy ``Server.fit`` has no try/except around ``aggregate_fit``: a
`RunDivergedError` from the watchdog ends the run with its message. Before any
``configure_fit``, ``aggregate_fit`` raises ValueError naming ``configure_fit``.
"""

from __future__ import annotations

from collections.abc import Sequence
from logging import WARNING
from typing import Any

import numpy as np
from flwr.common import (
    FitIns,
    FitRes,
    Parameters,
    Scalar,
    bytes_to_ndarray,
    parameters_to_ndarrays,
)
from flwr.common.logger import log
from flwr.server.client_manager import ClientManager
from flwr.server.client_proxy import ClientProxy
from flwr.server.strategy import FedAvg

from flwr_admm.core.health import ADMM_ADVICE, DEFAULT_HEALTH, HealthCheck
from flwr_admm.core.types import Arrays
from flwr_admm.options import Checkpointing, ClientPolicy
from flwr_admm.protocol import NUM_EVICTED, NUM_FAILURES
from flwr_admm.rounds.checks import unconfigured
from flwr_admm.rounds.exchange import (
    AS_RECEIVED,
    Algorithm,
    Incoming,
    Instruction,
    Layout,
    Tally,
    without_reply_keys,
)
from flwr_admm.rounds.layer import RoundLayer
from flwr_admm.rounds.views import RoundViews
from flwr_admm.server.sampling import check_flower_fields, check_user_config, sample_clients
from flwr_admm.uplink.wire import NUMPY_TENSOR_TYPE, to_parameters

__all__ = ["Failures", "Results", "RoundStrategy"]

Results = list[tuple[ClientProxy, FitRes]]
Failures = list[tuple[ClientProxy, FitRes] | BaseException]


class RoundStrategy(RoundViews, FedAvg):
    """Flower's legacy `FedAvg` whose fit rounds are a `RoundLayer`'s.

    Clients are keyed by ``client-key`` or ``partition-id`` in their fit metrics, else
    by their cid; `tensor_names` as in `flwr_admm.server.FedADMM`. ``fedavg`` holds the
    keywords for Flower's `FedAvg` (the front-ends' ``**fedavg_kwargs``), apart from
    this class's own, so a front-end's user cannot reach ``stop_on_convergence`` or
    ``advice`` through them.
    """

    def __init__(
        self,
        algorithm: Algorithm,
        fedavg: dict[str, Any],
        *,
        sampling_seed: int | None = 0,
        clients: ClientPolicy | None = None,
        checkpoint: Checkpointing | None = None,
        health: HealthCheck | None = DEFAULT_HEALTH,
        stop_on_convergence: bool = False,
        tensor_names: Sequence[str] | None = None,
        advice: str = ADMM_ADVICE,
    ) -> None:
        super().__init__(**fedavg)
        check_flower_fields(self, sampling_seed)
        if isinstance(clients, ClientPolicy) and clients.identify:  # the legacy API: no query
            raise ValueError(
                "clients.identify: the legacy API cannot ask nodes for their key; must be False"
            )
        self.tensor_names = None if tensor_names is None else [str(n) for n in tensor_names]
        self.round = RoundLayer(
            algorithm,
            sampling_seed=sampling_seed,
            clients=clients,
            checkpoint=checkpoint,
            health=health,
            stop_on_convergence=stop_on_convergence,
            settings={
                "fraction_fit": float(self.fraction_fit),
                "min_fit_clients": int(self.min_fit_clients),
                "accept_failures": bool(self.accept_failures),
                **({} if tensor_names is None else {"tensor_names": self.tensor_names}),
            },
            advice=advice,
        )
        self._model_sent: Parameters | None = None  # this round's z^k, as received
        self._returned: Parameters | None = None  # the last z' we returned
        self.round.resume()

    def initialize_parameters(self, client_manager: ClientManager) -> Parameters | None:
        """Return the restored z after a resume, else Flower's `initial_parameters`."""
        initial = super().initialize_parameters(client_manager)
        layout = self.round.layout
        if not self.round.restored or layout is None:
            return initial
        if initial is not None:
            shapes = [np.shape(a) for a in parameters_to_ndarrays(initial)]
            if shapes != list(layout.shapes):
                raise ValueError(
                    f"initial_parameters: shapes {shapes} differ from the checkpoint's "
                    f"{list(layout.shapes)}"
                )
        return self._model_parameters()

    # ------------------------------------------------------------------- fit
    def configure_fit(
        self, server_round: int, parameters: Parameters, client_manager: ClientManager
    ) -> list[tuple[ClientProxy, FitIns]]:
        """Adopt z^k, evict stale keys, sample clients, send each its FitIns."""
        layer = self.round
        z, layout = None, layer.layout  # kept: z' as the algorithm holds it
        if parameters is not self._returned or not getattr(layer.algorithm, "keeps_model", False):
            received = parameters_to_ndarrays(parameters)
            layout = layer.layout or Layout.of(received, self.tensor_names)
            z = [np.asarray(t, dtype=np.float64) for t in received]
            if [t.shape for t in z] != list(layout.shapes):
                raise ValueError(
                    f"parameters: expected shapes {list(layout.shapes)}, got {[t.shape for t in z]}"
                )
        server_round = layer.configure(server_round, z, layout)
        self._model_sent = parameters
        if layer.stopped():
            return []
        user: dict[str, Scalar] = {}
        if self.on_fit_config_fn is not None:
            user = dict(self.on_fit_config_fn(server_round))
        check_user_config(user, [], server_round)
        clients = sample_clients(self, client_manager, server_round, layer)
        instructions = layer.instructions([c.cid for c in clients], server_round, user)
        cache: dict[int, list[bytes]] = {}
        fit = [
            (client, FitIns(self._parameters(ins, parameters, cache), dict(ins.config)))
            for client, ins in zip(clients, instructions, strict=True)
        ]
        check_user_config(user, fit, server_round)
        return fit

    def _parameters(
        self, instruction: Instruction, received: Parameters, cache: dict[int, list[bytes]]
    ) -> Parameters:
        """Return the blocks of `instruction` as one Parameters (a block sent twice: built once)."""
        dtypes = self.round.layout.dtypes if self.round.layout is not None else ()

        def tensors(block: Arrays) -> list[bytes]:
            if block is AS_RECEIVED:
                return list(received.tensors)
            if id(block) not in cache:
                cache[id(block)] = to_parameters(block, dtypes).tensors
            return cache[id(block)]

        blocks = [instruction.arrays, *instruction.blocks.values()]
        if len(blocks) == 1 and instruction.arrays is AS_RECEIVED:
            return received
        return Parameters([t for b in blocks for t in tensors(b)], received.tensor_type)

    def aggregate_fit(
        self, server_round: int, results: Results, failures: Failures
    ) -> tuple[Parameters | None, dict[str, Scalar]]:
        """Fold the usable replies in client-key order, then update z.

        Raises ValueError before any ``configure_fit`` (module docstring).
        """
        layer = self.round
        if not layer.configured or layer.layout is None:
            raise unconfigured(layer.label, "aggregate_fit", "configure_fit")
        sent, self._model_sent = self._model_sent, None  # this round only
        if not self.accept_failures and failures:
            # Flower's DefaultWorkflow drops replies that never came (Server.fit counted them)
            layer.idle(
                server_round, len(failures) + max(0, layer.num_sent - len(results) - len(failures))
            )
            idle = Tally(layer.label, layer.algorithm.counters)
            idle.counts.update({NUM_FAILURES: len(failures), NUM_EVICTED: layer.evicted})
            return None, dict(idle.counts)
        count = len(layer.layout.shapes)
        read = [self._incoming(proxy, res, count) for proxy, res in results]
        accepted, ours, tally = layer.aggregate(server_round, read, len(failures))
        if ours is None:
            return None, dict(tally.counts)
        metrics = dict(ours)
        if self.fit_metrics_aggregation_fn is not None:
            user = without_reply_keys(
                self.fit_metrics_aggregation_fn([reply.raw for reply in accepted])
            )
            clashes = sorted(set(user) & set(metrics))
            if clashes:
                log(
                    WARNING,
                    "%s: fit_metrics_aggregation_fn returned %s, which the strategy reports "
                    "itself; the strategy's values are kept",
                    layer.label,
                    clashes,
                )
            metrics = {**user, **metrics}
        z_new = self._model_parameters()
        before = None if sent is None else map(bytes_to_ndarray, sent.tensors)
        after = map(bytes_to_ndarray, z_new.tensors)  # z^k sent, z' returned: a tensor at a time
        layer.close(server_round, metrics, before, after, ours)
        return z_new, metrics

    def _incoming(self, proxy: ClientProxy, res: FitRes, count: int) -> Incoming:
        """Cut a FitRes into the model block and the further blocks (model-sized each)."""
        tensors, kind = res.parameters.tensors, res.parameters.tensor_type
        names = self.round.algorithm.reply_blocks
        raw = (res.num_examples, res.metrics)
        if len(tensors) % count or not 1 <= len(tensors) // count <= 1 + len(names):
            sizes = " or ".join(str(count * k) for k in range(1, len(names) + 2))
            problem = f"expected {sizes} tensors, got {len(tensors)}"
            return Incoming(proxy.cid, res.metrics, res.num_examples, raw=raw, problem=problem)
        blocks = {  # further blocks are numpy's; only the model block may be a payload
            name: Parameters(tensors[i : i + count], NUMPY_TENSOR_TYPE)
            for name, i in zip(names, range(count, len(tensors), count), strict=False)
        }
        model = Parameters(tensors[:count], kind)
        return Incoming(proxy.cid, res.metrics, res.num_examples, model, blocks, raw)

    def _model_parameters(self) -> Parameters:
        model, layout = self.round.algorithm.model(), self.round.layout
        assert model is not None and layout is not None
        self._returned = to_parameters(model, layout.dtypes)  # Flower's bytes, one copy
        return self._returned
