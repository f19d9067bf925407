"""Small in-memory stand-ins for hub data sets (no download at test time)."""

from __future__ import annotations

import numpy as np
import pytest


def image_standin(shape: tuple[int, ...], column: str, n_train: int = 300, seed: int = 0):
    """A small MNIST/CIFAR-like DatasetDict of PIL images, as the hub version stores them."""
    datasets = pytest.importorskip("datasets")
    from PIL import Image

    rng = np.random.default_rng(seed)
    prototypes = rng.integers(0, 256, (10, *shape))

    def split(n: int):
        y = np.arange(n) % 10
        pixels = np.clip(prototypes[y] + rng.normal(0, 40, (n, *shape)), 0, 255).astype(np.uint8)
        features = datasets.Features(
            {column: datasets.Image(), "label": datasets.ClassLabel(num_classes=10)}
        )
        return datasets.Dataset.from_dict(
            {column: [Image.fromarray(p) for p in pixels], "label": y.tolist()}, features=features
        )

    return datasets.DatasetDict({"train": split(n_train), "test": split(n_train // 5)})
