"""The model contract shared by the numpy models: parameters are a list of arrays."""

from __future__ import annotations

from abc import ABC, abstractmethod

import numpy as np
from numpy.typing import NDArray

Params = list[NDArray[np.float64]]


class Model(ABC):
    """A differentiable numpy model f(params; X, y) over a list of float64 arrays.

    Subclasses define `shapes`, `loss_and_grad` and `predict_proba`; the stored
    parameters (`get`/`set`) are a convenience for users, the math is functional.
    """

    def __init__(self) -> None:
        self._params: Params = self.init_params(seed=0)

    @property
    @abstractmethod
    def shapes(self) -> list[tuple[int, ...]]:
        """Shapes of the parameter arrays, in order."""

    @property
    @abstractmethod
    def n_features(self) -> int:
        """Number of input features the model expects."""

    @abstractmethod
    def loss_and_grad(
        self, params: Params, X: NDArray[np.float64], y: NDArray[np.int64]
    ) -> tuple[float, Params]:
        """Return the loss f(params) and its gradient (same shapes as params)."""

    @abstractmethod
    def predict_proba(self, params: Params, X: NDArray[np.float64]) -> NDArray[np.float64]:
        """Class probabilities, shape (n_samples, n_classes)."""

    @abstractmethod
    def encode_labels(self, y: NDArray[np.generic]) -> NDArray[np.int64]:
        """Map user labels to class indices 0..n_classes-1; raise ValueError if invalid."""

    def init_params(self, seed: int = 0) -> Params:
        """Zero parameters (convex models); non-convex models override with a seed."""
        return [np.zeros(shape) for shape in self.shapes]

    def loss(self, params: Params, X: NDArray[np.float64], y: NDArray[np.int64]) -> float:
        """Return the loss f(params) alone."""
        return self.loss_and_grad(params, X, y)[0]

    def get(self) -> Params:
        """Return a copy of the stored parameters."""
        return [p.copy() for p in self._params]

    def set(self, params: Params) -> None:
        """Store a copy of `params` after checking their shapes."""
        self.check_params(params)
        self._params = [np.array(p, dtype=np.float64) for p in params]

    def check_params(self, params: Params, *, field: str = "params") -> None:
        """Raise ValueError unless `params` match `shapes` in number and shape."""
        if len(params) != len(self.shapes):
            raise ValueError(
                f"{field}: expected {len(self.shapes)} arrays with shapes "
                f"{self.shapes}, got {len(params)}"
            )
        for i, (p, shape) in enumerate(zip(params, self.shapes, strict=True)):
            if np.shape(p) != shape:
                raise ValueError(f"{field}[{i}]: expected shape {shape}, got {np.shape(p)}")

    def check_data(self, X: NDArray[np.generic], *, field: str = "X") -> NDArray[np.float64]:
        """Return X as a finite float64 matrix with `n_features` columns."""
        data: NDArray[np.float64] = np.asarray(X, dtype=np.float64)
        if data.ndim != 2 or data.shape[1] != self.n_features:
            raise ValueError(
                f"{field}: expected shape (n_samples, {self.n_features}), got {data.shape}"
            )
        if data.shape[0] == 0:
            raise ValueError(f"{field}: must hold at least one sample")
        if not np.all(np.isfinite(data)):
            raise ValueError(f"{field}: contains NaN or inf")
        return data


def l2_penalty(l2: float, coef: NDArray[np.float64]) -> float:
    """Return l2/2 ||coef||^2."""
    return 0.5 * l2 * float(np.vdot(coef, coef))


def check_l2(l2: float) -> float:
    """Validate a ridge strength: finite and >= 0."""
    if not np.isfinite(l2) or l2 < 0:
        raise ValueError(f"l2: must be a finite number >= 0, got {l2!r}")
    return float(l2)


def check_positive_int(value: int, field: str, minimum: int = 1) -> int:
    """Validate an integer hyperparameter >= minimum."""
    if isinstance(value, bool) or int(value) != value or value < minimum:
        raise ValueError(f"{field}: must be an integer >= {minimum}, got {value!r}")
    return int(value)


def softmax_cross_entropy(
    logits: NDArray[np.float64], y: NDArray[np.int64]
) -> tuple[float, NDArray[np.float64]]:
    """Mean cross-entropy of integer labels and d(loss)/d(logits), overflow-free.

    loss = mean_j [ logsumexp(a_j) - a_{j, y_j} ],  dloss/da = (softmax(a) - onehot(y)) / n
    """
    n = logits.shape[0]
    shifted = logits - logits.max(axis=1, keepdims=True)
    log_norm = np.log(np.exp(shifted).sum(axis=1))
    loss = float(np.mean(log_norm - shifted[np.arange(n), y]))
    probs = np.exp(shifted - log_norm[:, None])
    probs[np.arange(n), y] -= 1.0
    probs /= n
    return loss, probs


def encode_class_labels(y: NDArray[np.generic], n_classes: int) -> NDArray[np.int64]:
    """Check integer labels lie in 0..n_classes-1 and return them as int64."""
    y = np.asarray(y)
    if y.ndim != 1:
        raise ValueError(f"y: expected a 1-d label vector, got shape {y.shape}")
    if y.size and (not np.all(np.equal(np.mod(y, 1), 0))):
        raise ValueError("y: labels must be integers 0..n_classes-1")
    labels = y.astype(np.int64)
    if labels.size and (labels.min() < 0 or labels.max() >= n_classes):
        bad = sorted(set(np.unique(labels).tolist()) - set(range(n_classes)))
        raise ValueError(f"y: labels must lie in 0..{n_classes - 1}, found {bad[:5]}")
    return labels
