"""ADMMClient as a Flower NumPyClient: field-named errors, evaluation metrics, the
warm start kept in ``context.state``, and config overrides.

References: the seed's gradient formula (tests/seed_reference.py) and sklearn's
metrics, never flwr_admm itself.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from flower_run import C, D, seed_data, seed_model
from flwr.common import Context, RecordDict, Scalar
from scipy.special import expit
from seed_reference import logistic_grad
from sklearn.metrics import accuracy_score, log_loss, roc_auc_score

from flwr_admm.client import ADMMClient
from flwr_admm.models import LogisticRegression, SoftmaxRegression

RHO, L, LR = 0.1, 5, 0.02


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"local_init": "random"}, "local_init"),
        ({"prox_step": "newton"}, "prox_step"),
    ],
)
def test_client_rejects_unknown_variants(kwargs: dict[str, Any], field: str) -> None:
    data = seed_data()
    with pytest.raises(ValueError, match=field):
        ADMMClient(seed_model(), data.X[0], data.y[0], **kwargs)


def test_client_rejects_data_that_does_not_fit_the_model() -> None:
    data = seed_data()
    with pytest.raises(ValueError, match="X"):
        ADMMClient(seed_model(), data.X[0][:, :-1], data.y[0])
    with pytest.raises(ValueError, match="y"):
        ADMMClient(seed_model(), data.X[0], data.y[0][:-1])
    with pytest.raises(ValueError, match="y"):
        ADMMClient(seed_model(), data.X[0], np.where(data.y[0] > 0, 2, 0))
    with pytest.raises(ValueError, match="y"):
        ADMMClient(SoftmaxRegression(D, 3), data.X[0], np.arange(500) % 4)


def test_client_rejects_bad_messages() -> None:
    data = seed_data()
    client = ADMMClient(seed_model(), data.X[0], data.y[0])
    with pytest.raises(ValueError, match="rho"):
        client.fit([np.zeros(D)], {"rho": -1.0})
    with pytest.raises(ValueError, match="parameters"):
        client.fit([np.zeros(D + 1)], {"rho": 0.1})
    with pytest.raises(ValueError, match="parameters"):
        client.evaluate([np.zeros(D), np.zeros(1)], {})


# ------------------------------------------------------------ evaluation, state
def test_evaluate_reports_loss_accuracy_and_auc() -> None:
    data = seed_data()
    w = np.random.default_rng(0).standard_normal(D)
    X_val, y_val = data.X[1], data.y[1]
    client = ADMMClient(seed_model(), data.X[0], data.y[0], X_val=X_val, y_val=y_val)
    loss, n, metrics = client.evaluate([w], {})
    p = expit(X_val @ w)
    assert n == 500
    assert metrics["accuracy"] == pytest.approx(accuracy_score(y_val > 0, p > 0.5), abs=1e-12)
    assert metrics["auc"] == pytest.approx(roc_auc_score(y_val, p), abs=1e-12)
    assert loss == pytest.approx(log_loss(y_val > 0, p) + 0.5 * C * w @ w, rel=1e-10)
    # Without validation data: the training data.
    _, n_train, train_metrics = ADMMClient(seed_model(), data.X[0], data.y[0]).evaluate([w], {})
    p0 = expit(data.X[0] @ w)
    assert n_train == 500
    assert train_metrics["auc"] == pytest.approx(roc_auc_score(data.y[0], p0), abs=1e-12)


def gradient_loop(
    start: np.ndarray, center: np.ndarray, X: np.ndarray, y: np.ndarray, steps: int
) -> np.ndarray:
    w, ys = start.copy(), np.where(y > 0, 1.0, -1.0)
    for _ in range(steps):
        w = w - LR * (logistic_grad(w, X, ys, C) + RHO * (w - center))
    return w


def test_context_state_keeps_w_across_rebuilt_clients() -> None:
    data = seed_data()
    X, y = data.X[2], data.y[2]
    context = Context(
        run_id=0, node_id=5, node_config={"partition-id": 2}, state=RecordDict(), run_config={}
    )
    config: dict[str, Scalar] = {"rho": RHO}

    def build(ctx: Context) -> ADMMClient:
        return ADMMClient(
            seed_model(),
            X,
            y,
            local_steps=L,
            learning_rate=LR,
            prox_step="gradient",
            local_init="previous",
            context=ctx,
        )

    v1, v2 = np.full(D, 0.1), np.full(D, -0.2)
    (w1,), _, metrics = build(context).fit([v1], {**config, "server_round": 1})
    assert metrics["partition-id"] == 2
    np.testing.assert_allclose(w1, gradient_loop(v1, v1, X, y, L), rtol=1e-12)
    (w2,), _, _ = build(context).fit([v2], {**config, "server_round": 2})  # a new object
    np.testing.assert_allclose(w2, gradient_loop(w1, v2, X, y, L), rtol=1e-12)
    # A fresh context has no memory: it starts at the center.
    fresh = Context(
        run_id=0, node_id=6, node_config={"partition-id": 2}, state=RecordDict(), run_config={}
    )
    (w_fresh,), _, _ = build(fresh).fit([v2], {**config, "server_round": 2})
    np.testing.assert_allclose(w_fresh, gradient_loop(v2, v2, X, y, L), rtol=1e-12)
    assert np.linalg.norm(w_fresh - w2) > 1e-3


def test_client_config_overrides_local_steps_and_learning_rate() -> None:
    data = seed_data()
    X, y = data.X[0], data.y[0]
    client = ADMMClient(
        LogisticRegression(D, l2=C, fit_intercept=False),
        X,
        y,
        local_steps=50,
        learning_rate=0.5,
        prox_step="gradient",
        local_init="center",
    )
    v = np.full(D, 0.05)
    (w,), _, metrics = client.fit([v], {"rho": RHO, "local_steps": L, "learning_rate": LR})
    assert metrics["local_steps"] == L
    np.testing.assert_allclose(w, gradient_loop(v, v, X, y, L), rtol=1e-12)
