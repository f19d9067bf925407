"""flwr_admm.torch.state: `buffer_policy` as a strategy's ``tensor_policy``."""

from __future__ import annotations

import numpy as np
import torch

from flwr_admm.core.tensor_policy import check_rules, roles_of
from flwr_admm.torch import buffer_policy, state_arrays


class WithBuffers(torch.nn.Module):
    """A linear layer, a BatchNorm and a custom floating buffer named like a weight."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(3, 2)
        self.bn = torch.nn.BatchNorm1d(2)
        self.register_buffer("scale", torch.ones(2))  # no default rule names it


def roles(model: torch.nn.Module, policy: dict[str, str] | None) -> dict[str, str]:
    arrays = state_arrays(model)
    names = list(arrays)
    dtypes = [np.asarray(a).dtype for a in arrays.values()]
    return dict(zip(names, roles_of(check_rules(policy), names, dtypes), strict=True))


def test_buffer_policy_names_every_buffer_and_no_parameter() -> None:
    model = WithBuffers()
    assert buffer_policy(model) == {
        "bn.running_mean": "average",
        "bn.running_var": "average",
        "bn.num_batches_tracked": "keep",
        "scale": "average",
    }


def test_as_tensor_policy_it_keeps_batchnorm_defaults_and_averages_a_custom_buffer() -> None:
    model = WithBuffers()
    default, explicit = roles(model, None), roles(model, buffer_policy(model))
    for name in ("fc.weight", "fc.bias", "bn.weight", "bn.bias"):
        assert default[name] == explicit[name] == "consensus"
    for name in ("bn.running_mean", "bn.running_var", "bn.num_batches_tracked"):
        assert explicit[name] == default[name]
    assert default["scale"] == "consensus"  # the defaults would run ADMM on it
    assert explicit["scale"] == "average"
