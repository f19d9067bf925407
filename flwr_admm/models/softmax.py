"""Multinomial (softmax) logistic regression."""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

from flwr_admm.models.base import (
    Model,
    Params,
    check_l2,
    check_positive_int,
    encode_class_labels,
    l2_penalty,
    softmax_cross_entropy,
)


class SoftmaxRegression(Model):
    """Softmax regression: f(W, b) = mean cross-entropy(softmax(X W + b), y) + l2/2 ||W||^2.

    Parameters are ``[W (n_features, n_classes), b (n_classes,)]``; labels are 0..K-1.
    """

    def __init__(self, n_features: int, n_classes: int, l2: float = 0.0) -> None:
        self._n_features = check_positive_int(n_features, "n_features")
        self.n_classes = check_positive_int(n_classes, "n_classes", minimum=2)
        self.l2 = check_l2(l2)
        super().__init__()

    @property
    def shapes(self) -> list[tuple[int, ...]]:
        """``[(d, K), (K,)]``."""
        return [(self._n_features, self.n_classes), (self.n_classes,)]

    @property
    def n_features(self) -> int:
        """Number of input features."""
        return self._n_features

    def encode_labels(self, y: NDArray[np.generic]) -> NDArray[np.int64]:
        """Labels must be integers 0..n_classes-1."""
        return encode_class_labels(y, self.n_classes)

    def loss_and_grad(
        self, params: Params, X: NDArray[np.float64], y: NDArray[np.int64]
    ) -> tuple[float, Params]:
        """Cross-entropy plus ridge and the gradient ``[X^T D + l2 W, sum_j D_j]``."""
        W, b = params
        loss, d_logits = softmax_cross_entropy(X @ W + b, y)
        return loss + l2_penalty(self.l2, W), [X.T @ d_logits + self.l2 * W, d_logits.sum(0)]

    def predict_proba(self, params: Params, X: NDArray[np.float64]) -> NDArray[np.float64]:
        """Row-wise softmax of ``X W + b``."""
        logits = X @ params[0] + params[1]
        logits -= logits.max(axis=1, keepdims=True)
        e = np.exp(logits)
        proba: NDArray[np.float64] = e / e.sum(axis=1, keepdims=True)
        return proba
