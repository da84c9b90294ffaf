"""Multilayer perceptron 784-n-n-10 with ReLU, as in the Keras and Chainer MNIST examples; any image shape is
flattened (H*W*C-n-n-classes)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Literal

from runner.data_pipelines import Spec
from runner.models import MODELS, SequentialModel

Variant = Literal["tiny", "default", "chainer"]
HIDDEN_UNITS: dict[Variant, int] = {"tiny": 64, "default": 512, "chainer": 1000}  # per hidden layer


@MODELS.register
@dataclass
class MLP(SequentialModel):
    """784-n-n-10: tiny (n=64), default (n=512, Keras' example), chainer (n=1000, Chainer's example)."""

    name: str = "mlp"
    variant: Variant = "default"

    target_accuracy: ClassVar[float | None] = 0.98  # Keras' MLP example ends at 98.4%, short of the convnets' 99%

    def layers(self, keras: Any, spec: Spec) -> list[Any]:
        units = HIDDEN_UNITS[self.variant]
        return [
            keras.layers.Flatten(),  # (b, H*W*C): 784 for MNIST
            keras.layers.Dense(units, activation="relu"),
            keras.layers.Dense(units, activation="relu"),
            keras.layers.Dense(spec.classes),  # (b, classes) logits
        ]
