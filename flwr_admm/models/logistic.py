"""Binary logistic regression with an optional intercept and ridge penalty."""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray
from scipy.special import expit

from flwr_admm.models.base import Model, Params, check_l2, check_positive_int, l2_penalty


class LogisticRegression(Model):
    """Binary logistic regression.

    f(w) = 1/n sum_j log(1 + exp(-s_j (x_j^T coef + b))) + l2/2 ||coef||^2,
    with s_j in {-1, +1}; labels may be given as {0, 1} or {-1, +1}.
    Parameters are ``[coef]`` (shape (n_features,)) without intercept, else
    ``[coef, intercept]`` with intercept of shape (1,). The intercept is not penalized.
    """

    def __init__(self, n_features: int, l2: float = 0.0, fit_intercept: bool = True) -> None:
        self._n_features = check_positive_int(n_features, "n_features")
        self.l2 = check_l2(l2)
        self.fit_intercept = bool(fit_intercept)
        super().__init__()

    @property
    def shapes(self) -> list[tuple[int, ...]]:
        """``[(d,)]`` or ``[(d,), (1,)]``."""
        return [(self._n_features,), (1,)] if self.fit_intercept else [(self._n_features,)]

    @property
    def n_features(self) -> int:
        """Number of input features."""
        return self._n_features

    def encode_labels(self, y: NDArray[np.generic]) -> NDArray[np.int64]:
        """Map {0,1} or {-1,+1} labels to {0,1}; anything else is a ValueError."""
        labels: NDArray[np.int64] = np.asarray(y).astype(np.int64)
        y = np.asarray(y)
        if y.ndim != 1:
            raise ValueError(f"y: expected a 1-d label vector, got shape {y.shape}")
        values = set(np.unique(y).tolist())
        if values <= {0, 1}:
            return labels
        if values <= {-1, 1}:
            return (labels > 0).astype(np.int64)
        raise ValueError(
            f"y: binary labels must be {{0, 1}} or {{-1, +1}}, found {sorted(values)[:5]}"
        )

    def _margin(self, params: Params, X: NDArray[np.float64]) -> NDArray[np.float64]:
        a = X @ params[0]
        if self.fit_intercept:
            a = a + params[1][0]
        return a

    def loss_and_grad(
        self, params: Params, X: NDArray[np.float64], y: NDArray[np.int64]
    ) -> tuple[float, Params]:
        """Mean log-loss plus ridge, and its gradient ``X^T (sigma(a) - t) / n + l2 coef``.

        t_j = 1 for label 1 and 0 otherwise, so {0, 1} and {-1, +1} labels both work.
        """
        a = self._margin(params, X)
        positive = y == 1
        # log(1 + exp(-m)) without overflow for large |m|
        loss = float(np.mean(np.logaddexp(0.0, np.where(positive, -a, a))))
        loss += l2_penalty(self.l2, params[0])
        residual = (expit(a) - positive) / X.shape[0]
        grads = [X.T @ residual + self.l2 * params[0]]
        if self.fit_intercept:
            grads.append(np.array([residual.sum()]))
        return loss, grads

    def predict_proba(self, params: Params, X: NDArray[np.float64]) -> NDArray[np.float64]:
        """Columns P(y=0), P(y=1)."""
        p1 = expit(self._margin(params, X))
        return np.column_stack([1.0 - p1, p1])
