"""binary_auc (numpy) against scikit-learn's roc_auc_score, ties included."""

from __future__ import annotations

import numpy as np
import pytest
from sklearn.metrics import roc_auc_score

from flwr_admm.client.evaluation import binary_auc


@pytest.mark.parametrize("seed", range(20))
def test_binary_auc_matches_sklearn_with_ties(seed: int) -> None:
    rng = np.random.default_rng(seed)
    y = np.r_[0, 1, rng.integers(0, 2, 50)]
    score = np.round(rng.normal(size=y.size), 1)  # rounding creates ties
    assert binary_auc(y, score) == pytest.approx(roc_auc_score(y, score), abs=1e-12)


def test_binary_auc_hand_case_and_one_class_error() -> None:
    # positives score 0.9 and 0.5, negatives 0.5 and 0.1: pairs won 1 + 1 + 0.5 + 1 of 4
    assert binary_auc(np.array([1, 1, 0, 0]), np.array([0.9, 0.5, 0.5, 0.1])) == 0.875
    with pytest.raises(ValueError, match="both classes"):
        binary_auc(np.array([1, 1]), np.array([0.2, 0.3]))
