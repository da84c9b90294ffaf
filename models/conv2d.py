"""One 3x3 convolution and a linear classifier: the network of the data-parallel conv2d study (single-channel 100x100
images), whose whole cost is one convolution per example, so the first call's tracing and the devices' overhead show."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from runner.data_pipelines import Spec
from runner.models import MODELS, SequentialModel
from runner.registry import Rule, positive


@MODELS.register
@dataclass
class Conv2D(SequentialModel):
    """conv 3x3 (valid, ReLU), global average pooling, dense to the classes."""

    name: str = "conv2d"
    filters: int = 32

    RULES: ClassVar[dict[str, Rule]] = {"filters": (positive, "a positive number of filters")}

    def layers(self, keras: Any, spec: Spec) -> list[Any]:
        return [
            keras.layers.Conv2D(self.filters, 3, activation="relu"),  # (b, H-2, W-2, filters)
            keras.layers.GlobalAveragePooling2D(),  # (b, filters)
            keras.layers.Dense(spec.classes),  # (b, classes) logits
        ]

    def keras_name(self) -> str:
        return f"conv2d_{self.filters}"
