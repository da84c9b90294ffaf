"""Network-in-Network (Lin et al. 2013), sized for 28x28x1 MNIST; it takes any image size (SAME padding throughout).

Three mlpconv blocks, each a spatial convolution followed by two 1x1 convolutions (the "micro network"), with
max-pooling and dropout between blocks; the last block ends in one channel per class that global average pooling turns
into the logits, so there is no dense layer at all.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Literal

from runner.data_pipelines import Spec
from runner.models import MODELS, SequentialModel

Variant = Literal["tiny", "default", "paper"]
CHANNELS: dict[Variant, tuple[int, int, int]] = {"tiny": (16, 16, 16), "default": (64, 96, 96),
                                                 "paper": (192, 192, 192)}
_KERNELS = (5, 5, 3)  # spatial kernel of each block's first convolution


def mlpconv(keras, channels: int, kernel: int, out: int | None = None) -> list:
    """One mlpconv block: kxk conv, then two 1x1 convs (the last with `out` channels if given)."""
    last = out or channels
    return [
        keras.layers.Conv2D(channels, kernel, padding="same", activation="relu"),
        keras.layers.Conv2D(channels, 1, activation="relu"),
        keras.layers.Conv2D(last, 1, activation="relu" if out is None else None),
    ]


@MODELS.register
@dataclass
class NIN(SequentialModel):
    """Channels of the three mlpconv blocks: tiny 16/16/16, default 64/96/96, paper 192 each."""

    name: str = "nin"
    variant: Variant = "default"

    target_accuracy: ClassVar[float | None] = 0.99

    def layers(self, keras: Any, spec: Spec) -> list[Any]:
        c1, c2, c3 = CHANNELS[self.variant]
        layers = []
        for channels, kernel in zip((c1, c2), _KERNELS):  # (b, 28, 28, c1) pooled to 14x14; (b, 14, 14, c2) to 7x7
            layers += [*mlpconv(keras, channels, kernel), keras.layers.MaxPooling2D(3, strides=2, padding="same"),
                       keras.layers.Dropout(0.5)]
        layers += mlpconv(keras, c3, _KERNELS[2], out=spec.classes)  # (b, 7, 7, classes)
        return layers + [keras.layers.GlobalAveragePooling2D()]  # (b, classes) logits
