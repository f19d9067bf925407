"""The uplink channel: what a client does to its reply (`ClientUplink`), and how a server undoes it.

`UplinkChannel` puts the scheme into every fit config, decodes each reply against what
that client was sent (w_i = c_i + decode(payload)), counts the bytes and keeps the
privacy ledger. A client, from the fit config and its kept residual r_i:

    delta_i = w_i - c_i                        c_i = the parameters received
    delta_i = LocalDP.privatize(delta_i)       if dp-clip is configured
    delta_i = delta_i + r_i                    error feedback
    payload = encode(delta_i);  d_i = decode(payload);  r_i = delta_i - d_i

and replies with the payload; the server rebuilds c_i + d_i.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

import numpy as np
from flwr.client import Client, NumPyClient
from flwr.common import (
    EvaluateIns,
    EvaluateRes,
    FitIns,
    FitRes,
    GetParametersIns,
    GetParametersRes,
    GetPropertiesIns,
    GetPropertiesRes,
    Parameters,
    Scalar,
)
from numpy.typing import NDArray

from flwr_admm.protocol import UPLINK_BYTES
from flwr_admm.uplink.compression import Compressor, compressor_from_config
from flwr_admm.uplink.privacy import LocalDP, PrivacyLedger
from flwr_admm.uplink.wire import NUMPY_TENSOR_TYPE, parameters_to_views

Arrays = list[NDArray[np.float64]]


@dataclass(frozen=True)
class UplinkReply:
    """What a client sends, and what it keeps.

    `arrays` = c + d (what the server will rebuild), the encoded `parameters` (None:
    send `arrays` as plain numpy), the residual to keep (None: keep none) and the
    reply metrics attesting local DP (`LocalDP.attestation`; empty without it).
    """

    arrays: Arrays
    parameters: Parameters | None
    residual: Arrays | None
    attestation: dict[str, Scalar] = field(default_factory=dict)


@dataclass(frozen=True)
class ClientUplink:
    """The client's reading of the uplink entries of a fit config."""

    compressor: Compressor | None
    local_dp: LocalDP | None

    @classmethod
    def from_config(cls, config: dict[str, Scalar]) -> ClientUplink:
        """Parse ``uplink*`` and ``dp-*`` entries; ValueError naming the bad one."""
        return cls(compressor_from_config(config), LocalDP.from_config(config))

    @property
    def keeps_residual(self) -> bool:
        """Whether the client keeps a residual for the next round."""
        return self.compressor is not None and self.compressor.error_feedback

    def reply(
        self,
        received: Arrays,
        w: Sequence[NDArray[np.float64]],
        residual: Arrays | None,
        rng_noise: np.random.Generator,
        rng_rounding: np.random.Generator,
    ) -> UplinkReply:
        """Privatize, add the kept residual, compress; see the module docstring."""
        delta = [np.asarray(a, dtype=np.float64) - c for a, c in zip(w, received, strict=True)]
        attestation: dict[str, Scalar] = {}
        if self.local_dp is not None:
            delta = self.local_dp.privatize(delta, rng_noise)
            attestation = self.local_dp.attestation()
        if self.compressor is None:
            arrays = [c + d for c, d in zip(received, delta, strict=True)]
            return UplinkReply(arrays, None, None, attestation)
        if self.keeps_residual and residual is not None:
            delta = [d + r for d, r in zip(delta, residual, strict=True)]
        payload = self.compressor.encode(delta, rng_rounding)
        sent = self.compressor.decode(payload, [d.shape for d in delta])
        new_residual = None
        if self.keeps_residual:
            new_residual = [d - s for d, s in zip(delta, sent, strict=True)]
        arrays = [c + s for c, s in zip(received, sent, strict=True)]
        return UplinkReply(arrays, payload, new_residual, attestation)


class UplinkChannel:
    """Server side: fit-config entries, reply decoding, byte counts, privacy ledger.

    Parameters
    ----------
    compressor : Compressor, optional
        The uplink scheme clients must use; None = full precision.
    local_dp : LocalDP, optional
        Local clipping and noise clients must apply; epsilon is reported when its
        noise multiplier is > 0.

    """

    def __init__(
        self, compressor: Compressor | None = None, local_dp: LocalDP | None = None
    ) -> None:
        if compressor is not None and not isinstance(compressor, Compressor):
            raise ValueError(f"uplink: must be a Compressor or None, got {compressor!r}")
        if local_dp is not None and not isinstance(local_dp, LocalDP):
            raise ValueError(f"local_dp: must be a LocalDP or None, got {local_dp!r}")
        self.compressor, self.local_dp = compressor, local_dp
        noisy = local_dp is not None and local_dp.noise_multiplier > 0
        self.ledger = PrivacyLedger(local_dp.noise_multiplier, local_dp.delta) if noisy else None  # type: ignore[union-attr]
        self._bytes = 0
        self._sampled = (0, 0)

    @property
    def active(self) -> bool:
        """Whether the channel changes anything at all."""
        return self.compressor is not None or self.local_dp is not None

    def config(self) -> dict[str, Scalar]:
        """Entries to merge into every fit config."""
        entries: dict[str, Scalar] = {}
        if self.compressor is not None:
            entries.update(self.compressor.config())
        if self.local_dp is not None:
            entries.update(self.local_dp.config())
        return entries

    def describe(self) -> dict[str, Any]:
        """Return the uplink compressor and local DP as JSON (fingerprinted).

        ``uplink_residual`` stays "update" (error feedback, the only rule since
        residual "dual" was deleted) so that checkpoints written before keep their
        fingerprint, and one of a "dual" run does not resume.
        """
        dp = self.local_dp
        return {
            "uplink": None if self.compressor is None else self.compressor.config(),
            "uplink_residual": "update",
            "local_dp": None
            if dp is None
            else {"clip": dp.clip, "noise_multiplier": dp.noise_multiplier, "delta": dp.delta},
        }

    def attestation_problem(self, metrics: Mapping[str, Any]) -> str | None:
        """Why a reply may not be folded under the configured local DP (None: it may).

        Without `local_dp`, None. With it, a reply must attest the same clip and noise
        (`LocalDP.attestation_problem`): the ledger accounts only for such replies, so
        an unprotected update is rejected rather than folded under a reported epsilon.
        """
        return None if self.local_dp is None else self.local_dp.attestation_problem(metrics)

    def sampled(self, sample_size: int, population: int) -> None:
        """Remember this round's sample for the ledger; reset the byte count."""
        self._sampled = (sample_size, population)
        self._bytes = 0

    def decode(
        self, parameters: Parameters, sent: Callable[[], Arrays], *, add_center: bool = True
    ) -> Arrays:
        """Rebuild a reply: w_i = c_i + the decoded payload; plain numpy replies as they are.

        `sent()` returns what that client received (called only when needed).
        ``add_center=False`` returns the decoded payload itself (`sent()` gives the
        shapes): `FedADMMClientDuals`' payload is a change of a sum, not an offset.
        Raises ValueError (or what numpy raises) for an unusable payload.
        """
        self._bytes += sum(len(t) for t in parameters.tensors)
        if parameters.tensor_type == NUMPY_TENSOR_TYPE or self.compressor is None:
            # Read-only views, any real dtype: check_reply and the ADMM state cope.
            return cast(Arrays, parameters_to_views(parameters, check_type=False))
        center = sent()
        delta = self.compressor.decode(parameters, [c.shape for c in center])
        if not add_center:
            return delta
        return [c + d for c, d in zip(center, delta, strict=True)]

    def round_metrics(self, aggregated: bool) -> dict[str, Scalar]:
        """``uplink_bytes`` of this round's payloads and, after a release, the ledger."""
        metrics: dict[str, Scalar] = {}
        if self.compressor is not None:
            metrics[UPLINK_BYTES] = int(self._bytes)
        if self.ledger is not None:
            if aggregated:
                self.ledger.record(*self._sampled)
            metrics.update(self.ledger.metrics())
        return metrics


class UplinkClient(Client):
    """A `Client` that sends an `ADMMClient`'s encoded payload when there is one.

    Flower's NumPyClient wrapper, except that `fit` swaps in the packed `Parameters`,
    which a NumPyClient cannot return. The arrays `fit` returned are then not sent: a
    subclass that edits them after ``super().fit`` must not expect the edit on the wire.
    """

    def __init__(self, numpy_client: NumPyClient, standard: Client) -> None:
        self.numpy_client, self.standard = numpy_client, standard

    def get_properties(self, ins: GetPropertiesIns) -> GetPropertiesRes:
        """Forward to Flower's wrapper."""
        return self.standard.get_properties(ins)

    def get_parameters(self, ins: GetParametersIns) -> GetParametersRes:
        """Forward to Flower's wrapper."""
        return self.standard.get_parameters(ins)

    def fit(self, ins: FitIns) -> FitRes:
        """Flower's NumPyClient fit, with the encoded payload in place of the arrays."""
        res = self.standard.fit(ins)
        payload = getattr(self.numpy_client, "uplink_payload", None)
        if payload is not None:
            res.parameters = payload
        return res

    def evaluate(self, ins: EvaluateIns) -> EvaluateRes:
        """Forward to Flower's wrapper."""
        return self.standard.evaluate(ins)
