"""scikit-learn's bundled 8x8 handwritten digits (1,797 images, 10 classes), federated.

Pipeline, every step seeded:

1. pixels 0..16 -> x = pixel / 16 in [0, 1] (64 features, labels 0..9);
2. a stratified `global_test_fraction` of all images is held out as the shared test
   set (``X_global_test``);
3. the rest is partitioned among the clients by a Flower Datasets partitioner
   (`flwr_admm.data.partition`) running on an in-memory `datasets.Dataset`;
4. each client holds out `client_test_fraction` of its own rows (``X_test[i]``),
   which follow the client's skewed label distribution.

Pixels share one known range, so the default keeps the fixed [0, 1] scaling for all
clients; ``standardize=True`` switches to per-client standardization
(`flwr_admm.data.base`), which under label skew centres each client differently.
"""

from __future__ import annotations

import numpy as np

from flwr_admm.data.base import (
    FederatedData,
    assemble_clients,
    missing_extra,
    stratified_split,
)
from flwr_admm.data.partition import PartitionSpec, partition_rows

NUM_FEATURES = 64
NUM_CLASSES = 10


def digits_federated(
    spec: PartitionSpec,
    *,
    seed: int = 42,
    global_test_fraction: float = 0.2,
    client_test_fraction: float = 0.2,
    standardize: bool = False,
) -> FederatedData:
    """Federated digits: partitioned training pool, per-client and shared test sets."""
    try:
        from sklearn.datasets import load_digits
    except ImportError as error:
        raise missing_extra("scikit-learn", "the digits task") from error
    bunch = load_digits()
    X = np.asarray(bunch.data, dtype=np.float64) / 16.0
    y = np.asarray(bunch.target, dtype=np.int64)
    pool, held_out = stratified_split(y, global_test_fraction, np.random.default_rng(seed))
    X_pool, y_pool = X[pool], y[pool]
    rows = partition_rows(y_pool, spec, seed)
    return assemble_clients(
        [(X_pool[r], y_pool[r]) for r in rows],
        seed=seed,
        test_fraction=client_test_fraction,
        standardize=standardize,
        global_test=(X[held_out], y[held_out]),
    )
