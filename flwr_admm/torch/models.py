"""Small PyTorch models: the numpy models' twins and a CNN with BatchNorm.

`TorchLogistic` and `TorchSoftmax` hold the same tensors as
`flwr_admm.models.LogisticRegression` / `SoftmaxRegression` (same names' order, shapes
and loss), so a numpy and a torch client compute the same objective on the convex
tasks. `SmallCNN` takes flattened images (the tasks' rows) and has BatchNorm: running
statistics and ``num_batches_tracked`` travel in its ``state_dict``. Every model's
`loss` is the mean training loss f_i (with its ridge term).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F  # noqa: N812
from torch import nn

__all__ = ["SmallCNN", "TorchLogistic", "TorchSoftmax"]


class TorchLogistic(nn.Module):
    """f(w) = 1/n sum_j log(1 + exp(-s_j (x_j^T coef + b))) + l2/2 ||coef||^2, labels {0, 1}.

    Tensors ``coef`` (d,) and, with `fit_intercept`, ``intercept`` (1,); zero at start.
    """

    def __init__(self, n_features: int, l2: float = 0.0, fit_intercept: bool = True) -> None:
        super().__init__()
        self.l2 = float(l2)
        self.coef = nn.Parameter(torch.zeros(n_features))
        self.intercept = nn.Parameter(torch.zeros(1)) if fit_intercept else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Return the logits of class 1 and class 0 as columns ``[0, a]``, a = x coef + b."""
        a = x @ self.coef
        if self.intercept is not None:
            a = a + self.intercept
        return torch.stack([torch.zeros_like(a), a], dim=1)

    def loss(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """Return mean log-loss + l2/2 ||coef||^2 (labels {0, 1} or {-1, +1})."""
        a = self.forward(x)[:, 1]
        data = F.binary_cross_entropy_with_logits(a, (y == 1).to(a.dtype))
        return data + 0.5 * self.l2 * torch.sum(self.coef**2)


class TorchSoftmax(nn.Module):
    """f(W, b) = mean cross-entropy(softmax(x W + b), y) + l2/2 ||W||^2; zero at start."""

    def __init__(self, n_features: int, n_classes: int, l2: float = 0.0) -> None:
        super().__init__()
        self.l2 = float(l2)
        self.W = nn.Parameter(torch.zeros(n_features, n_classes))
        self.b = nn.Parameter(torch.zeros(n_classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Return the logits x W + b."""
        return x @ self.W + self.b

    def loss(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """Return mean cross-entropy + l2/2 ||W||^2."""
        return F.cross_entropy(self.forward(x), y) + 0.5 * self.l2 * torch.sum(self.W**2)


class SmallCNN(nn.Module):
    """Two conv-BatchNorm-ReLU-maxpool blocks, a 2x2 average pool and a linear layer.

    Parameters
    ----------
    image_shape : (channels, height, width)
        Shape of one image; rows arrive flattened (channel last when `channels_last`,
        as the CIFAR-10 task flattens H x W x C).
    n_classes : int
        Number of classes.
    width : int
        Channels of the first block (the second has twice as many).

    """

    def __init__(
        self,
        image_shape: tuple[int, int, int],
        n_classes: int,
        *,
        width: int = 16,
        channels_last: bool = False,
    ) -> None:
        super().__init__()
        self.image_shape = image_shape
        self.channels_last = channels_last
        channels = image_shape[0]
        self.features = nn.Sequential(
            nn.Conv2d(channels, width, 3, padding=1, bias=False),
            nn.BatchNorm2d(width),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(width, 2 * width, 3, padding=1, bias=False),
            nn.BatchNorm2d(2 * width),
            nn.ReLU(),
            nn.AdaptiveAvgPool2d(2),
        )
        self.head = nn.Linear(8 * width, n_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Return the logits of flattened images `x` (n, C*H*W)."""
        c, h, w = self.image_shape
        if self.channels_last:
            images = x.reshape(-1, h, w, c).permute(0, 3, 1, 2)
        else:
            images = x.reshape(-1, c, h, w)
        logits: torch.Tensor = self.head(torch.flatten(self.features(images), 1))
        return logits

    def loss(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """Return the mean cross-entropy."""
        return F.cross_entropy(self.forward(x), y)
