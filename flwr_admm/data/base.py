"""The federated data container and per-client standardization.

Per-client standardization, for institutions whose features live on different
scales: client i fits mean_i and scale_i on its own training rows once,

    x -> (x - mean_i) / scale_i,

and applies the same fixed statistics to its test rows and to any shared test set.
Nothing about the statistics leaves the client. A feature that is constant on a
client's training data gets scale 1 (it is only centered), never a division by zero.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

FloatArray = NDArray[np.float64]
LabelArray = NDArray[np.int64]


@dataclass(frozen=True)
class FederatedData:
    """Per-client training data, per-client test data and an optional shared test set.

    Attributes
    ----------
    X, y : list of arrays
        Client i's training features (n_i, d) and labels (n_i,).
    X_test, y_test : list of arrays, optional
        Client i's own held-out rows, already transformed like ``X[i]``.
    X_global_test, y_global_test : array, optional
        A test set shared by all clients, in raw (untransformed) feature units;
        ``client_view(i, X_global_test)`` maps it into client i's units.
    feature_mean, feature_scale : list of arrays, optional
        Client i's standardization statistics (None when features are not
        standardized per client).

    """

    X: list[FloatArray]
    y: list[LabelArray]
    X_test: list[FloatArray] | None = None
    y_test: list[LabelArray] | None = None
    X_global_test: FloatArray | None = None
    y_global_test: LabelArray | None = None
    feature_mean: list[FloatArray] | None = None
    feature_scale: list[FloatArray] | None = None

    @property
    def num_clients(self) -> int:
        """Number of clients."""
        return len(self.X)

    @property
    def num_features(self) -> int:
        """Number of feature columns (the same on every client)."""
        return int(self.X[0].shape[1])

    def client_view(self, client: int, X: FloatArray) -> FloatArray:
        """Map raw rows X into client `client`'s feature units (identity if unscaled)."""
        if self.feature_mean is None or self.feature_scale is None:
            return np.asarray(X, dtype=np.float64)
        return apply_standardizer(X, self.feature_mean[client], self.feature_scale[client])


def fit_standardizer(X: FloatArray) -> tuple[FloatArray, FloatArray]:
    """Column means and scales of X; scale = std, or 1 where the column is constant."""
    X = np.asarray(X, dtype=np.float64)
    if X.ndim != 2 or X.shape[0] == 0:
        raise ValueError(f"X: expected a non-empty 2-d array, got shape {X.shape}")
    mean = X.mean(axis=0)
    std = X.std(axis=0)
    # a constant column carries no information on this client: centre it, do not blow it up
    scale = np.where(std > 1e-12 * np.maximum(1.0, np.abs(mean)), std, 1.0)
    return mean, scale


def apply_standardizer(X: FloatArray, mean: FloatArray, scale: FloatArray) -> FloatArray:
    """Return (X - mean) / scale."""
    return (np.asarray(X, dtype=np.float64) - mean) / scale


def standardize_per_client(
    X: list[FloatArray], X_test: list[FloatArray]
) -> tuple[list[FloatArray], list[FloatArray], list[FloatArray], list[FloatArray]]:
    """Fit each client's statistics on its training rows; apply them to train and test.

    Returns ``(X_std, X_test_std, means, scales)``.
    """
    if len(X) != len(X_test):
        raise ValueError(
            f"X_test: expected one test array per client ({len(X)}), got {len(X_test)}"
        )
    stats = [fit_standardizer(Xi) for Xi in X]
    means = [m for m, _ in stats]
    scales = [s for _, s in stats]
    X_std = [apply_standardizer(Xi, m, s) for Xi, (m, s) in zip(X, stats, strict=True)]
    X_test_std = [apply_standardizer(Xi, m, s) for Xi, (m, s) in zip(X_test, stats, strict=True)]
    return X_std, X_test_std, means, scales


def split_client(
    X: FloatArray, y: LabelArray, test_fraction: float, rng: np.random.Generator
) -> tuple[FloatArray, LabelArray, FloatArray, LabelArray]:
    """Shuffle one client's rows and hold out round(test_fraction * n) of them (>= 1).

    At least one row stays for training; with fewer than 2 rows nothing is held out.
    """
    if not 0.0 < test_fraction < 1.0:
        raise ValueError(f"test_fraction: must lie in (0, 1), got {test_fraction!r}")
    n = X.shape[0]
    order = rng.permutation(n)
    n_test = min(max(1, round(test_fraction * n)), n - 1) if n >= 2 else 0
    test, train = order[:n_test], order[n_test:]
    return X[train], y[train], X[test], y[test]


def stratified_split(
    y: LabelArray, test_fraction: float, rng: np.random.Generator
) -> tuple[NDArray[np.int64], NDArray[np.int64]]:
    """Train and test row indices holding out round(test_fraction * n_c) of each class c.

    Both index arrays are sorted, so the row order does not depend on the class order.
    """
    if not 0.0 < test_fraction < 1.0:
        raise ValueError(f"test_fraction: must lie in (0, 1), got {test_fraction!r}")
    test_parts = []
    for label in np.unique(y):
        rows = np.flatnonzero(y == label)
        test_parts.append(rng.permutation(rows)[: round(test_fraction * rows.size)])
    test = np.sort(np.concatenate(test_parts)).astype(np.int64)
    train = np.setdiff1d(np.arange(y.shape[0]), test).astype(np.int64)
    return train, test


def assemble_clients(
    parts: list[tuple[FloatArray, LabelArray]],
    *,
    seed: int,
    test_fraction: float,
    standardize: bool,
    global_test: tuple[FloatArray, LabelArray] | None = None,
) -> FederatedData:
    """Hold out each client's own test rows, then standardize per client if asked.

    Client i's split uses ``default_rng([seed, i])``, so it does not depend on the
    other clients. `global_test` is stored raw (see `FederatedData.client_view`).
    """
    X, y, X_test, y_test = [], [], [], []
    for i, (Xi, yi) in enumerate(parts):
        if Xi.shape[0] < 2:
            raise ValueError(
                f"client {i}: holds {Xi.shape[0]} rows, needs >= 2 for a train/test split"
            )
        split = split_client(Xi, yi, test_fraction, np.random.default_rng([seed, i]))
        X.append(split[0])
        y.append(split[1])
        X_test.append(split[2])
        y_test.append(split[3])
    means = scales = None
    if standardize:
        X, X_test, means, scales = standardize_per_client(X, X_test)
    return FederatedData(
        X=X,
        y=y,
        X_test=X_test,
        y_test=y_test,
        X_global_test=None if global_test is None else global_test[0],
        y_global_test=None if global_test is None else global_test[1],
        feature_mean=means,
        feature_scale=scales,
    )


def missing_extra(package: str, task: str) -> ImportError:
    """Return the ImportError for a task whose optional `package` is absent: it names the extra."""
    return ImportError(
        f"{task} needs {package}, which is not installed: "
        'pip install -e ".[simulations]" in the flwr-admm checkout'
    )
