"""``framework = "torch"``: the task's model as a PyTorch module, seen through the numpy contract.

`torch_module_factory` returns the module the clients train: the twins of the numpy
logistic and softmax models (same tensors, same objective) or, with ``model = "cnn"``,
`flwr_admm.torch.models.SmallCNN` (BatchNorm) for the image tasks. `TorchTaskModel` wraps a
module factory in the numpy `flwr_admm.models.Model` contract, so that the server's
`Evaluator`, its L-BFGS optimum and the initial parameters work unchanged: parameters
are the ``state_dict`` tensors in order (their own dtypes at init), and the loss and
gradient are computed in float64, in eval mode (BatchNorm uses its running statistics).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

import numpy as np
import torch
from numpy.typing import NDArray

from flwr_admm.data import Task
from flwr_admm.models import LogisticRegression, Model, SoftmaxRegression
from flwr_admm.models.base import Params, encode_class_labels
from flwr_admm.torch import load_arrays, state_arrays
from flwr_admm.torch.models import SmallCNN, TorchLogistic, TorchSoftmax

ModuleFactory = Callable[[], torch.nn.Module]
IMAGE_SHAPES = {"digits": ((1, 8, 8), False), "mnist": ((1, 28, 28), False)}
IMAGE_SHAPES["cifar10"] = ((3, 32, 32), True)  # flattened H x W x C


def torch_module_factory(task: Task, model: str, seed: int) -> tuple[ModuleFactory, int]:
    """Return (module factory seeded with `seed`, number of classes) for the task."""
    numpy_model = task.make_model()
    if model == "cnn":
        if task.name not in IMAGE_SHAPES:
            raise ValueError(
                f"run config 'model': 'cnn' needs an image task {sorted(IMAGE_SHAPES)}, "
                f"got task {task.name!r}"
            )
        shape, channels_last = IMAGE_SHAPES[task.name]
        n_classes = int(getattr(numpy_model, "n_classes", 10))
        return _seeded(lambda: SmallCNN(shape, n_classes, channels_last=channels_last), seed), (
            n_classes
        )
    if isinstance(numpy_model, LogisticRegression):
        d, l2, intercept = numpy_model.n_features, numpy_model.l2, numpy_model.fit_intercept
        return _seeded(lambda: TorchLogistic(d, l2=l2, fit_intercept=intercept), seed), 2
    if isinstance(numpy_model, SoftmaxRegression):
        d, k, l2 = numpy_model.n_features, numpy_model.n_classes, numpy_model.l2
        return _seeded(lambda: TorchSoftmax(d, k, l2=l2), seed), k
    raise ValueError(
        f"run config 'framework': torch runs the logistic and softmax models and 'cnn', "
        f"not {type(numpy_model).__name__} (task {task.name!r}, model {model!r})"
    )


def _seeded(build: ModuleFactory, seed: int) -> ModuleFactory:
    def factory() -> torch.nn.Module:
        torch.manual_seed(seed)  # the same initial weights in every process
        return build()

    return factory


class TorchTaskModel(Model):
    """The numpy `Model` contract over a torch module (server-side evaluation, init)."""

    def __init__(self, factory: ModuleFactory, n_features: int, n_classes: int, seed: int) -> None:
        self.factory, self.seed = factory, seed
        self._n_features, self.n_classes = n_features, n_classes
        self.module = factory().double().eval()
        self.tensor_names = list(self.module.state_dict())
        trainable = {n for n, p in self.module.named_parameters() if p.requires_grad}
        self._trainable = [n in trainable for n in self.tensor_names]
        super().__init__()

    @property
    def shapes(self) -> list[tuple[int, ...]]:
        """Shapes of the ``state_dict`` tensors."""
        return [tuple(t.shape) for t in self.module.state_dict().values()]

    @property
    def n_features(self) -> int:
        """Flattened input size."""
        return self._n_features

    def init_params(self, seed: int = 0) -> Params:
        """Return the seeded module's ``state_dict`` in its own dtypes (float32, int64)."""
        return list(state_arrays(self.factory()).values())

    def encode_labels(self, y: NDArray[np.generic]) -> NDArray[np.int64]:
        """Map labels to 0..K-1 ({-1, +1} -> {0, 1} for the binary task)."""
        labels = np.asarray(y)
        if self.n_classes == 2 and set(np.unique(labels).tolist()) <= {-1, 1}:
            labels = (labels > 0).astype(np.int64)
        return encode_class_labels(labels, self.n_classes)

    def _load(self, params: Params) -> None:
        load_arrays(self.module, dict(zip(self.tensor_names, params, strict=True)))

    def loss_and_grad(
        self, params: Params, X: NDArray[np.float64], y: NDArray[np.int64]
    ) -> tuple[float, Params]:
        """Return the module's loss (float64, eval mode) and its gradient (0 for buffers)."""
        self._load(params)
        module = self.module
        module.zero_grad()
        loss = module.loss(torch.as_tensor(X), torch.as_tensor(y))  # type: ignore[operator]
        loss.backward()
        named = dict(module.named_parameters())
        grads = []
        for name, shape, trainable in zip(
            self.tensor_names, self.shapes, self._trainable, strict=True
        ):
            grad = named[name].grad if trainable else None
            grads.append(np.zeros(shape) if grad is None else grad.numpy().copy())
        return float(loss.detach()), grads

    def predict_proba(self, params: Params, X: NDArray[np.float64]) -> NDArray[np.float64]:
        """Row-wise softmax of the module's logits."""
        self._load(params)
        with torch.no_grad():
            proba = torch.softmax(self.module(torch.as_tensor(X)), dim=1)
        out: NDArray[np.float64] = proba.numpy()
        return out


def torch_task(task: Task, model: str, seed: int) -> Task:
    """Return `task` with its model replaced by the torch module (`TorchTaskModel`)."""
    factory, n_classes = torch_module_factory(task, model, seed)
    n_features = int(task.data.X[0].shape[1])
    convex = task.convex and model != "cnn"
    built: dict[str, TorchTaskModel] = {}

    def make_model() -> Model:
        if "model" not in built:
            built["model"] = TorchTaskModel(factory, n_features, n_classes, seed)
        return built["model"]

    return replace(task, make_model=make_model, convex=convex)


def module_of(task: Task) -> Any:
    """Return the task's `TorchTaskModel` (what the torch clients train copies of)."""
    model = task.make_model()
    if not isinstance(model, TorchTaskModel):
        raise TypeError("module_of: not a torch task")
    return model
