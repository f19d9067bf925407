"""Checks shared by the task-loader tests: two loads compared, label skew, task sanity."""

from __future__ import annotations

import numpy as np

from flwr_admm.data.base import FederatedData


def same(a: FederatedData, b: FederatedData) -> bool:
    pairs = [
        (a.X, b.X),
        (a.y, b.y),
        (a.X_test or [], b.X_test or []),
        (a.y_test or [], b.y_test or []),
    ]
    return all(
        len(u) == len(v) and all(np.array_equal(p, q) for p, q in zip(u, v, strict=True))
        for u, v in pairs
    )


def label_shares(data: FederatedData, n_classes: int) -> np.ndarray:
    counts = np.stack([np.bincount(y, minlength=n_classes) for y in data.y]).astype(float)
    return counts / counts.sum(axis=1, keepdims=True)


def skew(data: FederatedData, n_classes: int) -> float:
    """Mean total-variation distance between client and pooled label distributions."""
    shares = label_shares(data, n_classes)
    pooled = np.bincount(np.concatenate(data.y), minlength=n_classes) / sum(map(len, data.y))
    return float(np.mean(0.5 * np.abs(shares - pooled).sum(axis=1)))


def check_task(task, n_features: int, n_classes: int) -> None:
    data = task.data
    model = task.make_model()
    assert model.n_features == n_features == data.num_features
    for X, y, Xt, yt in zip(data.X, data.y, data.X_test, data.y_test, strict=True):
        assert X.dtype == np.float64 and X.shape == (y.shape[0], n_features)
        assert Xt.shape == (yt.shape[0], n_features) and yt.shape[0] >= 1
        assert np.all(np.isfinite(X)) and np.all(np.isfinite(Xt))
        assert y.min() >= 0 and max(y.max(), yt.max()) < n_classes
        model.encode_labels(y)  # raises if a label is invalid for the model
        loss, _ = model.loss_and_grad(model.init_params(0), X, model.encode_labels(y))
        assert np.isfinite(loss)
