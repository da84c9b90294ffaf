"""LeNet as in TensorFlow's MNIST tutorial: two 5x5 SAME convolutions each followed by 2x2 max-pooling, a dense
layer and the 10 logits. `default` is the tutorial's network (32 and 64 filters, dense 512); `tiny` keeps the shape
at 8 and 16 filters, dense 32, for smoke runs."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Literal

from runner.data_pipelines import Spec
from runner.models import MODELS, SequentialModel

Variant = Literal["tiny", "default"]
WIDTHS: dict[Variant, tuple[int, int, int]] = {"tiny": (8, 16, 32), "default": (32, 64, 512)}  # conv, conv, dense


@MODELS.register
@dataclass
class LeNet(SequentialModel):
    """conv 5x5 SAME, pool 2x2, conv 5x5 SAME, pool 2x2, dense, dense classes (ReLU)."""

    name: str = "lenet"
    variant: Variant = "default"

    target_accuracy: ClassVar[float | None] = 0.99

    def layers(self, keras: Any, spec: Spec) -> list[Any]:
        conv1, conv2, dense = WIDTHS[self.variant]
        return [
            keras.layers.Conv2D(conv1, 5, padding="same", activation="relu"),  # (b, 28, 28, conv1)
            keras.layers.MaxPooling2D(2),  # (b, 14, 14, conv1)
            keras.layers.Conv2D(conv2, 5, padding="same", activation="relu"),  # (b, 14, 14, conv2)
            keras.layers.MaxPooling2D(2),  # (b, 7, 7, conv2)
            keras.layers.Flatten(),  # (b, 49 * conv2)
            keras.layers.Dense(dense, activation="relu"),
            keras.layers.Dense(spec.classes),  # (b, classes) logits
        ]
