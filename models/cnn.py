"""Convolutional network; `paper` is the network of the Keras multi-GPU MNIST example."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Literal

from runner.data_pipelines import Spec
from runner.models import MODELS, SequentialModel

Variant = Literal["tiny", "default", "paper"]
# variant -> (filters of each 3x3 conv layer, index after which the single 2x2 max-pool sits, dense units)
LAYERS: dict[Variant, tuple[tuple[int, ...], int, int]] = {
    "tiny": ((8, 16), 1, 32),
    "default": ((32, 64), 1, 128),
    "paper": ((128, 128, 128, 128, 128), 4, 128),
}


@MODELS.register
@dataclass
class CNN(SequentialModel):
    """3x3 convolutions, one max-pool, dense: tiny, default (trains in minutes on a CPU), paper (5 convs of 128)."""

    name: str = "cnn"
    variant: Variant = "default"

    target_accuracy: ClassVar[float | None] = 0.99

    def layers(self, keras: Any, spec: Spec) -> list[Any]:
        filters, pool_after, dense = LAYERS[self.variant]
        layers = []
        for i, f in enumerate(filters):
            layers.append(keras.layers.Conv2D(f, 3, activation="relu"))  # valid padding: side shrinks by 2
            if i == pool_after:
                layers.append(keras.layers.MaxPooling2D(2))  # side halves
        return layers + [
            keras.layers.Dropout(0.25),
            keras.layers.Flatten(),
            keras.layers.Dense(dense, activation="relu"),
            keras.layers.Dropout(0.5),
            keras.layers.Dense(spec.classes),  # (b, classes) logits
        ]
