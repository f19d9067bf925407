"""Evaluation of a numpy model on a client's data: loss, accuracy and ROC AUC."""

from __future__ import annotations

import numpy as np
from flwr.common import Scalar
from numpy.typing import NDArray

from flwr_admm.models.base import Model, Params
from flwr_admm.protocol import ACCURACY, AUC

__all__ = ["binary_auc", "evaluate_model"]


def evaluate_model(
    model: Model, params: Params, X: NDArray[np.float64], y: NDArray[np.int64]
) -> tuple[float, int, dict[str, Scalar]]:
    """Loss, n and {accuracy, auc (binary, both classes present)} of `params` on (X, y)."""
    loss = model.loss(params, X, y)
    proba = model.predict_proba(params, X)
    metrics: dict[str, Scalar] = {ACCURACY: float(np.mean(proba.argmax(axis=1) == y))}
    if proba.shape[1] == 2 and np.unique(y).size == 2:
        metrics[AUC] = binary_auc(y, proba[:, 1])
    return float(loss), int(X.shape[0]), metrics


def binary_auc(y: NDArray[np.int64], score: NDArray[np.float64]) -> float:
    """ROC AUC by the Mann-Whitney statistic, ties counted one half.

    AUC = (sum of the positives' mid-ranks - n_pos (n_pos + 1) / 2) / (n_pos n_neg).
    numpy only: importing scikit-learn would slow every fresh ClientApp process.
    """
    positive = np.asarray(y) == 1
    n_pos = int(positive.sum())
    n_neg = positive.size - n_pos
    if n_pos == 0 or n_neg == 0:
        raise ValueError("y: AUC needs both classes")
    _, inverse, counts = np.unique(score, return_inverse=True, return_counts=True)
    ends = np.cumsum(counts)
    mid_ranks = ends - (counts - 1) / 2.0  # 1-based average rank of each distinct value
    rank_sum = float(mid_ranks[inverse][positive].sum())
    return float((rank_sum - n_pos * (n_pos + 1) / 2.0) / (n_pos * n_neg))
