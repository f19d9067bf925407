"""A `torch.nn.Module`'s tensors as named numpy arrays, and back.

The wire order of a model is its ``state_dict()`` order: trainable parameters and
buffers (BatchNorm ``running_mean`` / ``running_var`` and the 0-d int64
``num_batches_tracked``) by name. `state_arrays` copies them out in their own dtypes
and shapes (0-d stays 0-d); `load_arrays` copies received arrays in, cast to each
tensor's dtype, and refuses other names or shapes. `buffer_policy` names the
non-parameter tensors for a server's ``tensor_policy``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np
import torch
from numpy.typing import NDArray

__all__ = [
    "buffer_policy",
    "check_trainable_only",
    "load_arrays",
    "state_arrays",
    "trainable_names",
]


def state_arrays(model: torch.nn.Module) -> dict[str, NDArray[Any]]:
    """Return ``state_dict()`` as numpy copies by name (dtypes and shapes kept)."""
    return {name: t.detach().cpu().numpy().copy() for name, t in model.state_dict().items()}


def trainable_names(model: torch.nn.Module) -> list[str]:
    """Return the names of the parameters with ``requires_grad``: the consensus variables."""
    names = set(model.state_dict())
    return [n for n, p in model.named_parameters() if p.requires_grad and n in names]


def check_trainable_only(model: torch.nn.Module, names: Iterable[str]) -> None:
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


def load_arrays(model: torch.nn.Module, arrays: Mapping[str, NDArray[Any]]) -> None:
    """Copy `arrays` into the model's tensors, cast to their dtypes.

    Raises
    ------
    ValueError
        Naming ``arrays`` when the names (in order) or a shape differ from ``state_dict()``.

    """
    state = model.state_dict()
    if list(arrays) != list(state):
        raise ValueError(f"arrays: expected tensors {list(state)}, got {list(arrays)}")
    with torch.no_grad():
        for name, tensor in state.items():
            value = np.asarray(arrays[name])
            if tuple(value.shape) != tuple(tensor.shape):
                raise ValueError(
                    f"arrays[{name!r}]: expected shape {tuple(tensor.shape)}, got {value.shape}"
                )
            tensor.copy_(torch.as_tensor(value).to(dtype=tensor.dtype))


def buffer_policy(model: torch.nn.Module) -> dict[str, str]:
    """Return ``{name: role}`` for every tensor that is not a trainable parameter.

    Floating buffers -> ``"average"`` (FedAvg), others (``num_batches_tracked``) ->
    ``"keep"``; pass it as a strategy's ``tensor_policy`` (the default rules give
    the same roles for BatchNorm; this names custom buffers too).
    """
    trainable = set(trainable_names(model))
    return {
        name: "average" if tensor.is_floating_point() else "keep"
        for name, tensor in model.state_dict().items()
        if name not in trainable
    }
