"""One 3x3 convolution and a linear classifier: the network of the data-parallel conv2d study (single-channel 100x100
images), whose whole cost is one convolution per example, so the first call's tracing and the devices' overhead show."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from runner.data_pipelines import MNIST, Spec
from runner.models import MODELS, ModelOptions
from runner.registry import Rule, positive


@MODELS.register
@dataclass
class Conv2D(ModelOptions):
    """conv 3x3 (valid, ReLU), global average pooling, dense to the classes."""

    name: str = "conv2d"
    filters: int = 32

    RULES: ClassVar[dict[str, Rule]] = {"filters": (positive, "a positive number of filters")}

    def build(self, spec: Spec = MNIST):
        """An uncompiled keras.Model mapping (batch, H, W, C) images to (batch, classes) logits."""
        import keras

        return keras.Sequential([
            keras.Input(spec.shape),
            keras.layers.Conv2D(self.filters, 3, activation="relu"),  # (b, H-2, W-2, filters)
            keras.layers.GlobalAveragePooling2D(),  # (b, filters)
            keras.layers.Dense(spec.classes),  # (b, classes) logits
        ], name=f"conv2d_{self.filters}")

    def check(self, spec: Spec) -> None:
        self.too_small(spec, 3)  # one valid 3x3 convolution

    def activations_per_example(self, spec: Spec = MNIST) -> int:
        h, w, _ = spec.shape
        return self.filters * (h - 2) * (w - 2) + self.filters + spec.classes

    def layers_with_weights(self) -> int:
        return 2  # the convolution and the dense layer
