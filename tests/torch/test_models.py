"""flwr_admm.torch models: the numpy models' objective and gradient; the CNN's inputs."""

from __future__ import annotations

import numpy as np
import torch

from flwr_admm.data import load_task
from flwr_admm.models import LogisticRegression, SoftmaxRegression
from flwr_admm.torch import load_arrays
from flwr_admm.torch.models import SmallCNN, TorchLogistic, TorchSoftmax


def torch_loss_and_grad(
    model: torch.nn.Module, params: list[np.ndarray], X: np.ndarray, y: np.ndarray
):  # type: ignore[no-untyped-def]
    model = model.double()
    load_arrays(model, dict(zip(model.state_dict(), params, strict=True)))
    loss = model.loss(torch.as_tensor(X), torch.as_tensor(y))  # type: ignore[operator]
    loss.backward()
    return float(loss.detach()), [p.grad.numpy() for p in model.parameters()]  # type: ignore[union-attr]


def test_logistic_and_softmax_twins_have_the_numpy_objective_and_gradient() -> None:
    rng = np.random.default_rng(1)
    seed = load_task("seed-logreg", seed=42).data
    X, y = seed.X[2], seed.y[2]  # labels {-1, +1}
    params = [rng.standard_normal(20), rng.standard_normal(1)]
    expected = LogisticRegression(20, l2=0.01).loss_and_grad(params, X, y)
    got = torch_loss_and_grad(TorchLogistic(20, l2=0.01), params, X, y)
    assert abs(got[0] - expected[0]) <= 1e-13
    for g, e in zip(got[1], expected[1], strict=True):
        np.testing.assert_allclose(g, e, atol=1e-13)
    digits = load_task("digits", seed=42).data
    X, y = digits.X[0], digits.y[0]
    params = [0.1 * rng.standard_normal((64, 10)), rng.standard_normal(10)]
    expected = SoftmaxRegression(64, 10, l2=1e-3).loss_and_grad(params, X, y)
    got = torch_loss_and_grad(TorchSoftmax(64, 10, l2=1e-3), params, X, y)
    assert abs(got[0] - expected[0]) <= 1e-13
    for g, e in zip(got[1], expected[1], strict=True):
        np.testing.assert_allclose(g, e, atol=1e-13)


def test_cnn_reads_channel_last_rows_as_the_cifar_task_flattens_them() -> None:
    torch.manual_seed(0)
    chw = SmallCNN((3, 32, 32), 10, width=4).eval()
    hwc = SmallCNN((3, 32, 32), 10, width=4, channels_last=True).eval()
    hwc.load_state_dict(chw.state_dict())
    images = torch.randn(5, 3, 32, 32)
    rows_hwc = images.permute(0, 2, 3, 1).reshape(5, -1)  # H x W x C, as images.py flattens
    with torch.no_grad():
        torch.testing.assert_close(hwc(rows_hwc), chw(images.reshape(5, -1)))
    assert SmallCNN((1, 28, 28), 10)(torch.zeros(2, 784)).shape == (2, 10)
