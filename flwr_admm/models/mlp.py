"""A one-hidden-layer perceptron (tanh) for the non-convex case."""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

from flwr_admm.models.base import (
    Model,
    Params,
    check_l2,
    check_positive_int,
    encode_class_labels,
    softmax_cross_entropy,
)


class MLP(Model):
    """MLP: logits = tanh(X W1 + b1) W2 + b2, loss = cross-entropy + l2/2 (||W1||^2 + ||W2||^2).

    Parameters are ``[W1 (d, h), b1 (h,), W2 (h, K), b2 (K,)]``. Weights start from a
    seeded Glorot-uniform draw (`seed`; all-zero weights are a saddle point), biases at zero.
    """

    def __init__(
        self,
        n_features: int,
        n_classes: int,
        n_hidden: int = 32,
        l2: float = 0.0,
        seed: int = 0,
    ) -> None:
        self._n_features = check_positive_int(n_features, "n_features")
        self.n_classes = check_positive_int(n_classes, "n_classes", minimum=2)
        self.n_hidden = check_positive_int(n_hidden, "n_hidden")
        self.l2 = check_l2(l2)
        self.seed = int(seed)
        super().__init__()
        self._params = self.init_params(self.seed)

    @property
    def shapes(self) -> list[tuple[int, ...]]:
        """``[(d, h), (h,), (h, K), (K,)]``."""
        d, h, k = self._n_features, self.n_hidden, self.n_classes
        return [(d, h), (h,), (h, k), (k,)]

    @property
    def n_features(self) -> int:
        """Number of input features."""
        return self._n_features

    def init_params(self, seed: int = 0) -> Params:
        """Glorot-uniform weights from ``default_rng(seed)``, zero biases."""
        rng = np.random.default_rng(seed)
        params: Params = []
        for shape in self.shapes:
            if len(shape) == 2:
                limit = np.sqrt(6.0 / (shape[0] + shape[1]))
                params.append(rng.uniform(-limit, limit, size=shape))
            else:
                params.append(np.zeros(shape))
        return params

    def encode_labels(self, y: NDArray[np.generic]) -> NDArray[np.int64]:
        """Labels must be integers 0..n_classes-1."""
        return encode_class_labels(y, self.n_classes)

    def loss_and_grad(
        self, params: Params, X: NDArray[np.float64], y: NDArray[np.int64]
    ) -> tuple[float, Params]:
        """Cross-entropy plus ridge on the weights, gradient by backpropagation."""
        W1, b1, W2, b2 = params
        hidden = np.tanh(X @ W1 + b1)
        loss, d_logits = softmax_cross_entropy(hidden @ W2 + b2, y)
        d_hidden = (d_logits @ W2.T) * (1.0 - hidden**2)
        loss += 0.5 * self.l2 * (float(np.vdot(W1, W1)) + float(np.vdot(W2, W2)))
        grads = [
            X.T @ d_hidden + self.l2 * W1,
            d_hidden.sum(0),
            hidden.T @ d_logits + self.l2 * W2,
            d_logits.sum(0),
        ]
        return loss, grads

    def predict_proba(self, params: Params, X: NDArray[np.float64]) -> NDArray[np.float64]:
        """Row-wise softmax of the logits."""
        W1, b1, W2, b2 = params
        logits = np.tanh(X @ W1 + b1) @ W2 + b2
        logits -= logits.max(axis=1, keepdims=True)
        e = np.exp(logits)
        proba: NDArray[np.float64] = e / e.sum(axis=1, keepdims=True)
        return proba
