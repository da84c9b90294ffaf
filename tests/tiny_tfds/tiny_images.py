"""`tiny_images`: random 20x24x3 images in 5 classes, generated, so preparing it needs no download."""

from __future__ import annotations

import numpy as np
import tensorflow_datasets as tfds

SHAPE, CLASSES, SIZES = (20, 24, 3), 5, {"train": 300, "test": 60}


class TinyImages(tfds.core.GeneratorBasedBuilder):
    """Random images and labels, the same for every preparation."""

    VERSION = tfds.core.Version("1.0.0")

    def _info(self) -> tfds.core.DatasetInfo:
        features = {"image": tfds.features.Image(shape=SHAPE), "label": tfds.features.ClassLabel(num_classes=CLASSES)}
        return self.dataset_info_from_configs(features=tfds.features.FeaturesDict(features),
                                              supervised_keys=("image", "label"))

    def _split_generators(self, dl_manager):
        return {split: self._generate_examples(seed, SIZES[split]) for seed, split in enumerate(SIZES)}

    def _generate_examples(self, seed: int, n: int):
        rng = np.random.default_rng(seed)
        for i in range(n):
            yield i, {"image": rng.integers(0, 256, SHAPE, dtype=np.uint8), "label": int(rng.integers(0, CLASSES))}
