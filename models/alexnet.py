"""AlexNet as tf_cnn_benchmarks builds it (`--model=alexnet`, one tower, no local response normalization): an 11x11
VALID convolution of stride 4, 3x3 max-pools of stride 2, then 5x5 and three 3x3 SAME convolutions, two dense layers
of 4096 with dropout 0.5 (tf_cnn's default keep probability), and the logits; ReLU and biases throughout.

tf_cnn_benchmarks feeds it 227x227 images; other sizes keep the layers, and images below the least its layers take
are zero-padded to it around the centre, so every image task, MNIST too, trains.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from runner.data_pipelines import Spec
from runner.models import MODELS, SequentialModel

Variant = Literal["tiny", "default"]
# variant -> (filters of the five convolutions, units of the two hidden dense layers)
WIDTHS: dict[Variant, tuple[tuple[int, int, int, int, int], int]] = {
    "tiny": ((8, 24, 48, 48, 32), 256),
    "default": ((64, 192, 384, 384, 256), 4096),
}
KERNELS = (11, 5, 3, 3, 3)  # of the five convolutions; the first VALID with stride 4, the others SAME
POOLED = (0, 1, 4)  # the convolutions a 3x3 max-pool of stride 2 (VALID) follows
SMALLEST = 67  # the least side the layers take: the first convolution and the three pools leave 1x1
DROPOUT = 0.5  # tf_cnn_benchmarks' ConvNetBuilder.dropout keeps half
IMAGENET = Spec((227, 227, 3), 1000)  # tf_cnn_benchmarks' input: 224 + 3 a side, ImageNet's classes


@MODELS.register
@dataclass
class AlexNet(SequentialModel):
    """tf_cnn_benchmarks' AlexNet: conv 11x11/4 VALID 64, pool, conv 5x5 192, pool, conv 3x3 384, 384, 256, pool,
    dense 4096, dropout, dense 4096, dropout, dense classes; tiny: an eighth of the filters, dense 256."""

    name: str = "alexnet"
    variant: Variant = "default"

    def layers(self, keras: Any, spec: Spec) -> list[Any]:
        """Its layers for `spec`'s images (shapes below: tf_cnn_benchmarks' 227x227 input's); a side below SMALLEST
        zero-padded to it around the centre."""
        filters, units = WIDTHS[self.variant]
        h, w = (max(SMALLEST - side, 0) for side in spec.shape[:2])
        layers = [keras.layers.ZeroPadding2D(((h // 2, h - h // 2), (w // 2, w - w // 2)))] if h or w else []
        for i, (f, k) in enumerate(zip(filters, KERNELS)):  # (b, 55, 55, 64), then 27x27 and 13x13
            first = i == 0
            layers.append(keras.layers.Conv2D(f, k, strides=4 if first else 1, padding="valid" if first else "same",
                                              activation="relu"))
            if i in POOLED:
                layers.append(keras.layers.MaxPooling2D(3, strides=2))  # VALID: 55 -> 27 -> 13 -> 6
        layers.append(keras.layers.Flatten())  # (b, 256 * 6 * 6)
        for _ in range(2):
            layers += [keras.layers.Dense(units, activation="relu"), keras.layers.Dropout(DROPOUT)]
        return layers + [keras.layers.Dense(spec.classes)]  # (b, classes) logits
