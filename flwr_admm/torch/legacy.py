"""`TorchADMM` on the legacy API (``NumPyClient.fit``): reading its parameters, its state.

The legacy server sends the center v_i (then z, with ``admm-start = 1``) as a list in
``state_dict()`` order and keeps no record names, so the node's warm start w_i lives
in ``context.state`` under ``flwr_admm.w`` with the numpy client's round records.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch
from flwr.app import ArrayRecord, ConfigRecord, Context

from flwr_admm.protocol import (
    META_FITS,
    META_ROUND,
    PROXIMAL_MU,
    RHO,
    START_TENSORS,
    STATE_META,
    STATE_W,
)
from flwr_admm.torch.state import trainable_names

__all__ = ["check_trainable_only", "keep_legacy", "legacy_previous", "legacy_rho", "prox_blocks"]

Named = dict[str, np.ndarray[Any, Any]]


def prox_blocks(
    names: list[str], parameters: Sequence[np.ndarray[Any, Any]], config: Mapping[str, Any]
) -> tuple[Named, Named | None]:
    """Return (v_i, z or None) by name, float64: v_i, then z when ``admm-start = 1``."""
    with_z = config.get(START_TENSORS) == 1  # v_i, then z: where the solve starts
    if len(parameters) != len(names) * (2 if with_z else 1):
        raise ValueError(
            f"parameters: expected {len(names)} tensors {names}"
            f"{' twice (v_i, then z: admm-start = 1)' if with_z else ''}, "
            f"got {len(parameters)}"
        )
    v = parameters[: len(names)]
    received = {n: np.asarray(p, dtype=np.float64) for n, p in zip(names, v, strict=True)}
    if not with_z:
        return received, None
    z = parameters[len(names) :]
    return received, {n: np.asarray(t, dtype=np.float64) for n, t in zip(names, z, strict=True)}


def legacy_rho(config: Mapping[str, Any]) -> float:
    """Return ``rho``, else FedProx's ``proximal_mu``, else 0; ValueError unless finite >= 0."""
    value = config.get(RHO, config.get(PROXIMAL_MU, 0.0))
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not (math.isfinite(value) and value >= 0)
    ):
        raise ValueError(f"rho: must be a finite number >= 0, got {value!r}")
    return float(value)


def check_trainable_only(model: torch.nn.Module, names: Mapping[str, Any]) -> None:
    """Refuse client-held duals for a model with buffers (a dual on a statistic drifts).

    A dual on a BatchNorm statistic would only accumulate the clients' spread: every
    ``state_dict`` tensor must be a trainable parameter, else ValueError (use FedADMM).
    """
    others = sorted(set(names) - set(trainable_names(model)))
    if others:
        raise ValueError(
            f"model: client-held duals (admm-duals='client') need every state_dict tensor "
            f"to be a trainable parameter; buffers {others} found (use FedADMM)"
        )


def legacy_previous(context: Context | None, received: Named) -> Named | None:
    """Return the w_i kept by `fit_result` under ``flwr_admm.w``, if the shapes match."""
    if context is None or STATE_W not in context.state.array_records:
        return None
    kept = context.state.array_records[STATE_W].to_numpy_ndarrays()
    if [t.shape for t in kept] != [t.shape for t in received.values()]:
        return None
    return {n: np.asarray(t, dtype=np.float64) for n, t in zip(received, kept, strict=True)}


def keep_legacy(context: Context, arrays: Named, server_round: int | None) -> None:
    """Save w_i (float64) and its round, if finite (the numpy client's records)."""
    w = [np.asarray(t, dtype=np.float64) for t in arrays.values()]
    if not all(np.all(np.isfinite(t)) for t in w):
        return  # a NaN warm start would poison every later round
    context.state.array_records[STATE_W] = ArrayRecord(w)
    meta = context.state.config_records.get(STATE_META, ConfigRecord({META_FITS: 0}))
    previous = meta.get(META_FITS, 0)
    fits = (previous if isinstance(previous, int) else 0) + 1
    context.state.config_records[STATE_META] = ConfigRecord(
        {META_ROUND: int(server_round or fits), META_FITS: fits}
    )
