"""The FedProx paper's Synthetic(alpha, beta) data (Li et al., MLSys 2020, Sec. 5.1).

For user k = 1..N (N = 30, d = 60 features, C = 10 classes):

    n_k = int(lognormal(4, 2)) + 50
    u_k ~ N(0, alpha),  B_k ~ N(0, beta)
    W_k ~ N(u_k, 1) of shape (d, C),  b_k ~ N(u_k, 1) of shape (C,)
    v_k ~ N(B_k, 1) of shape (d,)
    x ~ N(v_k, Sigma),  Sigma = diag(j^-1.2), j = 1..d
    y = argmax softmax(x W_k + b_k)

alpha controls how much the local models differ, beta how much the local inputs
differ. As in the reference generator (``data/synthetic_1_1/generate_synthetic.py``
of the FedProx repository) alpha and beta are passed as standard deviations, the
draws happen in the same order, and each user's rows are shuffled and split into
the first int(0.9 n_k) for training and the rest for testing. The stream is
``numpy.random.default_rng(seed)``, so the numbers differ from the published files.

u_k adds the same u_k (1 + sum_j x_j) to every class logit of a row, so no label
depends on u_k: with the other draws fixed, alpha changes nothing, and the local
models differ through the N(0, 1) parts of W_k and b_k alone. Features stay raw, as in
the paper. n_k is heavy-tailed: a few users hold most of the samples.
"""

from __future__ import annotations

import numpy as np

from flwr_admm.data.base import FederatedData

NUM_FEATURES = 60
NUM_CLASSES = 10


def synthetic_sizes(num_clients: int, rng: np.random.Generator) -> np.ndarray:
    """Return samples per user: int(lognormal(4, 2)) + 50 (the generator's first draw)."""
    return rng.lognormal(4, 2, num_clients).astype(np.int64) + 50


def fedprox_synthetic(
    alpha: float = 1.0, beta: float = 1.0, num_clients: int = 30, seed: int = 42
) -> FederatedData:
    """Generate Synthetic(alpha, beta); labels 0..9, per-user 90/10 train/test."""
    for field, value in (("alpha", alpha), ("beta", beta)):
        if not (np.isfinite(value) and value >= 0):
            raise ValueError(f"{field}: must be a finite number >= 0, got {value!r}")
    if isinstance(num_clients, bool) or int(num_clients) != num_clients or num_clients < 1:
        raise ValueError(f"num_clients: must be an integer >= 1, got {num_clients!r}")
    rng = np.random.default_rng(seed)
    sizes = synthetic_sizes(num_clients, rng)
    mean_w = rng.normal(0.0, alpha, num_clients)  # u_k, shared by W_k and b_k
    mean_b = mean_w
    big_b = rng.normal(0.0, beta, num_clients)  # B_k
    mean_x = np.stack([rng.normal(big_b[k], 1.0, NUM_FEATURES) for k in range(num_clients)])
    std_x = np.arange(1, NUM_FEATURES + 1, dtype=np.float64) ** -0.6  # sqrt(j^-1.2)

    X, y, X_test, y_test = [], [], [], []
    for k in range(num_clients):
        W = rng.normal(mean_w[k], 1.0, (NUM_FEATURES, NUM_CLASSES))
        b = rng.normal(mean_b[k], 1.0, NUM_CLASSES)
        xk = mean_x[k] + std_x * rng.standard_normal((int(sizes[k]), NUM_FEATURES))
        # argmax of the softmax is the argmax of the logits
        yk = np.argmax(xk @ W + b, axis=1).astype(np.int64)
        order = rng.permutation(int(sizes[k]))
        n_train = int(0.9 * sizes[k])
        train, test = order[:n_train], order[n_train:]
        X.append(xk[train])
        y.append(yk[train])
        X_test.append(xk[test])
        y_test.append(yk[test])
    return FederatedData(X=X, y=y, X_test=X_test, y_test=y_test)
