"""LeNet as in TensorFlow's MNIST tutorial: two 5x5 SAME convolutions each followed by 2x2 max-pooling, a dense
layer and the 10 logits. `default` is the tutorial's network (32 and 64 filters, dense 512); `tiny` keeps the shape
at 8 and 16 filters, dense 32, for smoke runs."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Literal

from runner.models import INPUT_SHAPE, MODELS, NUM_CLASSES, ModelOptions

Variant = Literal["tiny", "default"]
WIDTHS: dict[Variant, tuple[int, int, int]] = {"tiny": (8, 16, 32), "default": (32, 64, 512)}  # conv, conv, dense


@MODELS.register
@dataclass
class LeNet(ModelOptions):
    """conv 5x5 SAME, pool 2x2, conv 5x5 SAME, pool 2x2, dense, dense 10 (ReLU)."""

    name: str = "lenet"
    variant: Variant = "default"

    target_accuracy: ClassVar[float] = 0.99  # the test accuracy a run is timed to by default

    def build(self):
        """An uncompiled keras.Model mapping (batch, 28, 28, 1) images to (batch, 10) logits."""
        import keras

        conv1, conv2, dense = WIDTHS[self.variant]
        return keras.Sequential(
            [
                keras.Input(INPUT_SHAPE),
                keras.layers.Conv2D(conv1, 5, padding="same", activation="relu"),  # (b, 28, 28, conv1)
                keras.layers.MaxPooling2D(2),  # (b, 14, 14, conv1)
                keras.layers.Conv2D(conv2, 5, padding="same", activation="relu"),  # (b, 14, 14, conv2)
                keras.layers.MaxPooling2D(2),  # (b, 7, 7, conv2)
                keras.layers.Flatten(),  # (b, 49 * conv2)
                keras.layers.Dense(dense, activation="relu"),
                keras.layers.Dense(NUM_CLASSES),  # (b, 10) logits
            ],
            name=f"lenet_{self.variant}",
        )

    def activations_per_example(self) -> int:
        conv1, conv2, dense = WIDTHS[self.variant]
        return conv1 * (28 * 28 + 14 * 14) + conv2 * (14 * 14 + 7 * 7) + dense + NUM_CLASSES

    def layers_with_weights(self) -> int:
        return 4  # two convolutions, two Dense layers
