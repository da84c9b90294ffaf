"""MNIST multilayer perceptron 784-n-n-10 with ReLU, as in the Keras and Chainer MNIST examples."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Literal

from runner.models import INPUT_SHAPE, MODELS, NUM_CLASSES, ModelOptions

Variant = Literal["tiny", "default", "chainer"]
HIDDEN_UNITS: dict[Variant, int] = {"tiny": 64, "default": 512, "chainer": 1000}  # per hidden layer


@MODELS.register
@dataclass
class MLP(ModelOptions):
    """784-n-n-10: tiny (n=64), default (n=512, Keras' example), chainer (n=1000, Chainer's example)."""

    name: str = "mlp"
    variant: Variant = "default"

    target_accuracy: ClassVar[float] = 0.98  # the test accuracy a run is timed to by default

    def build(self):
        """An uncompiled keras.Model mapping (batch, 28, 28, 1) images to (batch, 10) logits."""
        import keras

        units = HIDDEN_UNITS[self.variant]
        return keras.Sequential(
            [
                keras.Input(INPUT_SHAPE),
                keras.layers.Flatten(),  # (b, 784)
                keras.layers.Dense(units, activation="relu"),
                keras.layers.Dense(units, activation="relu"),
                keras.layers.Dense(NUM_CLASSES),  # (b, 10) logits
            ],
            name=f"mlp_{self.variant}",
        )

    def activations_per_example(self) -> int:
        return 2 * HIDDEN_UNITS[self.variant] + NUM_CLASSES

    def layers_with_weights(self) -> int:
        return 3  # the three Dense layers, whatever the variant

    @property
    def dense_only(self) -> bool:
        return True
