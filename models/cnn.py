"""Convolutional network; `paper` is the network of the Keras multi-GPU MNIST example."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Literal

from runner.models import INPUT_SHAPE, MODELS, NUM_CLASSES, ModelOptions

Variant = Literal["tiny", "default", "paper"]
# variant -> (filters of each 3x3 conv layer, index after which the single 2x2 max-pool sits, dense units)
LAYERS: dict[Variant, tuple[tuple[int, ...], int, int]] = {
    "tiny": ((8, 16), 1, 32),
    "default": ((32, 64), 1, 128),
    "paper": ((128, 128, 128, 128, 128), 4, 128),
}


@MODELS.register
@dataclass
class CNN(ModelOptions):
    """3x3 convolutions, one max-pool, dense: tiny, default (trains in minutes on a CPU), paper (5 convs of 128)."""

    name: str = "cnn"
    variant: Variant = "default"

    target_accuracy: ClassVar[float] = 0.99  # the test accuracy a run is timed to by default

    def build(self):
        """An uncompiled keras.Model mapping (batch, 28, 28, 1) images to (batch, 10) logits."""
        import keras

        filters, pool_after, dense = LAYERS[self.variant]
        layers = [keras.Input(INPUT_SHAPE)]
        for i, f in enumerate(filters):
            layers.append(keras.layers.Conv2D(f, 3, activation="relu"))  # valid padding: side shrinks by 2
            if i == pool_after:
                layers.append(keras.layers.MaxPooling2D(2))  # side halves
        layers += [
            keras.layers.Dropout(0.25),
            keras.layers.Flatten(),
            keras.layers.Dense(dense, activation="relu"),
            keras.layers.Dropout(0.5),
            keras.layers.Dense(NUM_CLASSES),  # (b, 10) logits
        ]
        return keras.Sequential(layers, name=f"cnn_{self.variant}")

    def activations_per_example(self) -> int:
        filters, pool_after, dense = LAYERS[self.variant]
        side, total = 28, 0
        for i, f in enumerate(filters):
            side -= 2  # valid 3x3
            total += f * side * side
            if i == pool_after:
                side //= 2
                total += f * side * side
        return total + dense + NUM_CLASSES

    def layers_with_weights(self) -> int:
        return len(LAYERS[self.variant][0]) + 2  # the convs and the two Dense layers
