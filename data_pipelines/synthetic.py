"""Synthetic stand-in for MNIST: same shapes and dtypes, random content.

Useful for smoke tests and pipeline checks without any download; it imports
only numpy so it is safe to import before TensorFlow.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import numpy as np

from runner.data_pipelines import DATASETS, DatasetOptions

log = logging.getLogger(__name__)

IMAGE_SHAPE = (28, 28)
NUM_CLASSES = 10

Arrays = tuple[tuple[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]]


def load(n_train: int = 60000, n_test: int = 10000, seed: int = 0) -> Arrays:
    """Generate random MNIST-shaped data, deterministic for a given seed.

    Args:
        n_train: Number of training examples.
        n_test: Number of test examples.
        seed: Seed for ``numpy.random.default_rng``.

    Returns:
        ``((x_train, y_train), (x_test, y_test))``: uint8 images of shape
        (n, 28, 28) with values 0..255 and uint8 labels 0..9, like
        ``runner.data_pipelines.mnist_files.load``.

    Raises:
        ValueError: If a size is negative.
    """
    if n_train < 0 or n_test < 0:
        raise ValueError(f"n_train and n_test must be >= 0, got {n_train} and {n_test}")
    rng = np.random.default_rng(seed)

    def split(n: int) -> tuple[np.ndarray, np.ndarray]:
        x = rng.integers(0, 256, size=(n, *IMAGE_SHAPE), dtype=np.uint8)
        y = rng.integers(0, NUM_CLASSES, size=(n,), dtype=np.uint8)
        return x, y

    # Train is drawn first so the train split for a seed does not depend on n_test.
    return split(n_train), split(n_test)


@DATASETS.register
@dataclass
class Synthetic(DatasetOptions):
    """Random images of MNIST shape with random labels (fixed by the seed): for pure throughput runs only.

    Accuracy on it means nothing; every log line and MLflow run says the data is synthetic.
    """

    name: str = "synthetic"
    train_limit: int = 60000  # number of synthetic training examples
    test_limit: int = 10000  # number of synthetic test examples

    def load(self, seed: int) -> Any:
        """Random arrays of the configured sizes, the same for the same seed."""
        from runner.data_pipelines.common import Arrays

        (xtr, ytr), (xte, yte) = load(self.train_limit, self.test_limit, seed)
        log.warning("data=synthetic: random images and labels; accuracy figures mean nothing")
        return Arrays(xtr, ytr.astype(np.int32), xte, yte.astype(np.int32), synthetic=True)
