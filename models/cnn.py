"""Convolutional network; `paper` is the network of the Keras multi-GPU MNIST example."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from runner.data_pipelines import MNIST, Spec
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

    def check(self, spec: Spec) -> None:
        """Each valid 3x3 convolution takes 2 off each side and the pool halves it: at least 1x1 must remain."""
        filters, pool_after, _ = LAYERS[self.variant]
        after_pool = len(filters) - pool_after - 1  # convolutions after the pool
        self.too_small(spec, 2 * (pool_after + 1) + 2 * (1 + 2 * after_pool))

    def activations_per_example(self, spec: Spec = MNIST) -> int:
        filters, pool_after, dense = LAYERS[self.variant]
        (h, w, _), total = spec.shape, 0
        for i, f in enumerate(filters):
            h, w = h - 2, w - 2  # valid 3x3
            total += f * h * w
            if i == pool_after:
                h, w = h // 2, w // 2
                total += f * h * w
        return total + dense + spec.classes

    def layers_with_weights(self) -> int:
        return len(LAYERS[self.variant][0]) + 2  # the convs and the two Dense layers
