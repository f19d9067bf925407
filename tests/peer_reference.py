"""Independent numpy references for SCAFFOLD and FedDyn on ridge clients.

`Ridge` is a `flwr_admm` model for f_i(w) = 1/(2 n_i) ||X_i w - y_i||^2 + lam/2 ||w||^2
so that ADMMClient can run it; the reference loops below never call it: they compute
the gradient X^T (X w - y) / n + lam w themselves and follow the papers' algorithm
boxes with plain loops over clients and steps.
"""

from __future__ import annotations

import numpy as np
from flwr.common import Context, ndarrays_to_parameters
from flwr.server.client_manager import SimpleClientManager

from flwr_admm.client import ADMMClient
from flwr_admm.models.base import Model

LAM = 0.1


class Ridge(Model):
    """f(w) = 1/(2n) ||X w - y||^2 + lam/2 ||w||^2, one parameter vector (test double)."""

    def __init__(self, d: int, lam: float = LAM) -> None:
        self.d, self.lam = d, lam
        super().__init__()

    @property
    def shapes(self):
        return [(self.d,)]

    @property
    def n_features(self):
        return self.d

    def loss_and_grad(self, params, X, y):
        w = params[0]
        r = X @ w - y
        n = X.shape[0]
        loss = 0.5 * float(r @ r) / n + 0.5 * self.lam * float(w @ w)
        return loss, [X.T @ r / n + self.lam * w]

    def predict_proba(self, params, X):  # pragma: no cover - regression only
        raise NotImplementedError

    def encode_labels(self, y):
        return np.asarray(y, dtype=np.float64)


def gradient(X, y, w, lam: float = LAM):
    """Grad f_i(w) = X^T (X w - y) / n + lam w, computed here, not by the model."""
    return X.T @ (X @ w - y) / X.shape[0] + lam * w


def ridge_clients(sizes: list[int], d: int, seed: int):
    """Non-IID linear data: each client its own true weights and feature mean."""
    rng = np.random.default_rng(seed)
    base = rng.normal(size=d)
    data = []
    for n in sizes:
        X = rng.normal(loc=rng.normal(), size=(n, d))
        data.append((X, X @ (base + rng.normal(size=d)) + 0.1 * rng.normal(size=n)))
    return data


def pooled_optimum(data, lam: float = LAM):
    """Argmin of sum_i n_i f_i / n: the normal equations of the pooled ridge problem."""
    X = np.vstack([X for X, _ in data])
    y = np.concatenate([y for _, y in data])
    return np.linalg.solve(X.T @ X / len(y) + lam * np.eye(X.shape[1]), X.T @ y / len(y))


def client_fn_for(data, steps: int, lr: float, prox_step: str = "gradient"):
    """ADMMClient with the Ridge model on partition ``partition-id`` of `data`."""

    def client_fn(context: Context) -> ADMMClient:
        i = int(context.node_config["partition-id"])
        X, y = data[i]
        model = Ridge(X.shape[1])
        return ADMMClient(
            model,
            X,
            y,
            local_steps=steps,
            learning_rate=lr,
            prox_step=prox_step,  # type: ignore[arg-type]
            context=context,
        )

    return client_fn


def common_kwargs(d: int, fraction: float = 1.0, min_clients: int = 2) -> dict:
    """FedAvg keywords shared by the tests: x0 = 0, no evaluation round."""
    return {
        "fraction_fit": fraction,
        "min_fit_clients": min_clients,
        "min_available_clients": min_clients,
        "fraction_evaluate": 0.0,
        "initial_parameters": ndarrays_to_parameters([np.zeros(d)]),
    }


def next_round(strategy, proxies):
    """Run one round of the legacy loop from the strategy's own x; return the new x."""
    manager = SimpleClientManager()
    for proxy in proxies:
        manager.register(proxy)
    parameters = strategy.initial_parameters
    if strategy.current is not None:
        parameters = ndarrays_to_parameters(strategy.current)
    server_round = len(strategy.history) + 1
    instructions = strategy.configure_fit(server_round, parameters, manager)
    results = [(proxy, proxy.fit(ins, None, server_round)) for proxy, ins in instructions]
    aggregated, _ = strategy.aggregate_fit(server_round, results, [])
    return aggregated


def scaffold_reference(data, rounds: int, steps: int, lr: float, eta_g: float = 1.0):
    """SCAFFOLD option II, full participation, as in Karimireddy et al.'s Algorithm 1.

    Uniform weights: x += eta_g mean_i (y_i - x), c += (|S|/N) mean_i (c_i+ - c_i).
    """
    d, N = data[0][0].shape[1], len(data)
    x, c = np.zeros(d), np.zeros(d)
    c_i = [np.zeros(d) for _ in data]
    history = []
    for _ in range(rounds):
        dys, dcs = [], []
        for i, (X, y) in enumerate(data):
            yi = x.copy()
            for _ in range(steps):
                yi = yi - lr * (gradient(X, y, yi) - c_i[i] + c)
            c_plus = c_i[i] - c + (x - yi) / (steps * lr)
            dys.append(yi - x)
            dcs.append(c_plus - c_i[i])
            c_i[i] = c_plus
        x = x + eta_g * sum(dys) / N
        c = c + (N / N) * sum(dcs) / N
        history.append((x.copy(), c.copy()))
    return history


def feddyn_reference(data, rounds: int, steps: int, lr: float, alpha: float):
    """FedDyn (Acar et al.'s Algorithm 1), full participation, plain gradient steps.

    Client: w <- w - lr (grad f_i(w) - grad_i + alpha (w - x)) from w = x, then
    grad_i <- grad_i - alpha (w_i - x). Server: h <- h - alpha/m sum_i (w_i - x),
    x = mean_i w_i - h / alpha.
    """
    d, m = data[0][0].shape[1], len(data)
    x, h = np.zeros(d), np.zeros(d)
    grads = [np.zeros(d) for _ in data]
    history = []
    for _ in range(rounds):
        ws = []
        for i, (X, y) in enumerate(data):
            w = x.copy()
            for _ in range(steps):
                w = w - lr * (gradient(X, y, w) - grads[i] + alpha * (w - x))
            grads[i] = grads[i] - alpha * (w - x)
            ws.append(w)
        h = h - alpha / m * sum(w - x for w in ws)
        x = sum(ws) / m - h / alpha
        history.append((x.copy(), h.copy()))
    return history
