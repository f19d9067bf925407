"""PyTorch clients for FedADMM (optional: ``pip install -e ".[torch]"`` in the flwr-admm checkout).

`TorchADMM` runs one node's ADMM w-step inside a user's own training loop, in both
Flower APIs; `state_arrays` / `load_arrays` move a module's ``state_dict`` to and from
named numpy arrays; `buffer_policy` names its buffers for a strategy's
``tensor_policy``; small models for the tests and benchmarks are in
`flwr_admm.torch.models`. Nothing else in `flwr_admm` imports torch.
"""

try:
    import torch  # noqa: F401
except ImportError as error:  # pragma: no cover - the base install has no torch
    raise ImportError(
        'flwr_admm.torch needs PyTorch: pip install -e ".[torch]" in the flwr-admm checkout '
        "(CPU build first: pip install torch --index-url https://download.pytorch.org/whl/cpu)"
    ) from error

from flwr_admm.torch.state import buffer_policy, load_arrays, state_arrays
from flwr_admm.torch.step import TorchADMM

__all__ = ["TorchADMM", "buffer_policy", "load_arrays", "state_arrays"]
