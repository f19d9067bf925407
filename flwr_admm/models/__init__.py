"""Numpy models with a functional ``loss_and_grad(params, X, y)`` over lists of arrays."""

from flwr_admm.models.base import Model
from flwr_admm.models.logistic import LogisticRegression
from flwr_admm.models.mlp import MLP
from flwr_admm.models.softmax import SoftmaxRegression

__all__ = ["MLP", "LogisticRegression", "Model", "SoftmaxRegression"]
