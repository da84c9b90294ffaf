"""Synthetic data: random uint8 images of any shape (MNIST's by default) and random labels; or, with
`data.task=next_token`, token sequences a language model can learn (`text.synthetic_stream`).

For throughput studies, smoke tests and pipeline checks without any download; imports only numpy.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

import numpy as np

from runner.data_pipelines import DATASETS, IMAGE_SHAPE, MNIST, DatasetOptions, Spec, language_model
from runner.data_pipelines.mnist_files import Splits
from runner.registry import Rule, positive

log = logging.getLogger(__name__)


def load(n_train: int = 60000, n_test: int = 10000, seed: int = 0,
         shape: tuple[int, ...] = MNIST.shape[:2], classes: int = MNIST.classes) -> Splits:
    """((x_train, y_train), (x_test, y_test)): random uint8 images (n, *shape) and labels below `classes` (uint8
    where they fit), the same for the same seed."""
    rng = np.random.default_rng(seed)

    def split(n: int) -> tuple[np.ndarray, np.ndarray]:
        x = rng.integers(0, 256, size=(n, *shape), dtype=np.uint8)
        y = rng.integers(0, classes, size=(n,), dtype=np.int32 if classes > 256 else np.uint8)
        return x, y

    # Train is drawn first so the train split for a seed does not depend on n_test.
    return split(n_train), split(n_test)


@DATASETS.register
@dataclass
class Synthetic(DatasetOptions):
    """Random images of `shape` with random labels (fixed by the seed): for pure throughput runs only.

    Accuracy on it means nothing; every log line and MLflow run says the data is synthetic. The images are held in
    memory: (train_limit + test_limit) x H x W x C bytes.
    """

    name: str = "synthetic"
    train_limit: int = 60000  # number of synthetic training examples
    test_limit: int = 10000  # number of synthetic test examples
    shape: list[int] = field(default_factory=lambda: list(MNIST.shape))  # [height, width, channels]
    classes: int = MNIST.classes
    # next_token: token sequences for a language model; regression: images, each with a value a model can learn (a
    # fixed random linear function of its pixels, scaled to mean 0 and variance 1)
    task: Literal["image", "next_token", "regression"] = "image"
    sequence_length: int = 64  # next_token: tokens per example (train_limit, test_limit: examples)
    vocabulary_size: int = 256  # next_token: ids from 0 to vocabulary_size - 1

    RULES: ClassVar[dict[str, Rule]] = {
        **DatasetOptions.RULES,
        "shape": IMAGE_SHAPE,
        "classes": (lambda v: v >= 2, "an integer of at least 2"),
        "sequence_length": (positive, "a positive integer"),
        "vocabulary_size": (lambda v: v >= 2, "an integer of at least 2"),
    }

    def spec(self) -> Spec:
        if self.task == "next_token":
            return language_model(self.sequence_length, self.vocabulary_size)
        if self.task == "regression":
            return Spec(tuple(self.shape), 1, target="regression")
        return Spec(tuple(self.shape), self.classes)

    def in_memory_bytes(self) -> int:
        """Bytes the generated examples take (validation refuses what this machine cannot hold)."""
        if self.task == "next_token":
            return (self.train_limit + self.test_limit + 1) * self.sequence_length
        return (self.train_limit + self.test_limit) * int(np.prod(self.shape))

    def load(self, seed: int) -> Any:
        """Random arrays of the configured sizes and shape, the same for the same seed."""
        from runner.data_pipelines.common import Arrays

        if self.task == "next_token":
            from runner.data_pipelines.text import Stream, synthetic_stream

            length = self.sequence_length
            train = synthetic_stream(self.train_limit + length, self.vocabulary_size, seed)
            test = synthetic_stream(self.test_limit * length + 1, self.vocabulary_size, seed, split=1)
            return Stream(train, test, self.spec(), seed, synthetic=True)

        spec = self.spec()
        # MNIST's shape keeps its (n, 28, 28) arrays, so the default run's examples are the ones it always had.
        shape = MNIST.shape[:2] if spec.shape == MNIST.shape else spec.shape
        (xtr, ytr), (xte, yte) = load(self.train_limit, self.test_limit, seed, shape, max(spec.classes, 2))
        if self.task == "regression":  # each image's value: the same linear function of every image's pixels
            w = np.random.default_rng(seed + 1).standard_normal(int(np.prod(shape)))
            ytr, yte = ((x.reshape(len(x), -1) / 255.0 - 0.5) @ w / np.sqrt(np.sum(w**2) / 12) for x in (xtr, xte))
            return Arrays(xtr, ytr.astype(np.float32), xte, yte.astype(np.float32), synthetic=True, spec=spec)
        log.warning("data=synthetic: random images and labels; accuracy figures mean nothing")
        return Arrays(xtr, ytr.astype(np.int32), xte, yte.astype(np.int32), synthetic=True, spec=spec)
