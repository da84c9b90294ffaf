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
from runner.models import MODELS, ModelOptions

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


def padded(side: int) -> int:
    """An image side as the first convolution sees it: zero-padded up to SMALLEST."""
    return max(side, SMALLEST)


def sides(height: int, width: int) -> list[tuple[int, int]]:
    """The (height, width) after each convolution and each pool, in order, for a padded image of that size."""
    h, w = (height - KERNELS[0]) // 4 + 1, (width - KERNELS[0]) // 4 + 1  # VALID, stride 4
    out = []
    for i in range(len(KERNELS)):
        out.append((h, w))  # the convolutions after the first are SAME: the size stays
        if i in POOLED:
            h, w = (h - 3) // 2 + 1, (w - 3) // 2 + 1  # 3x3 VALID, stride 2
            out.append((h, w))
    return out


@MODELS.register
@dataclass
class AlexNet(ModelOptions):
    """tf_cnn_benchmarks' AlexNet: conv 11x11/4 VALID 64, pool, conv 5x5 192, pool, conv 3x3 384, 384, 256, pool,
    dense 4096, dropout, dense 4096, dropout, dense classes; tiny: an eighth of the filters, dense 256."""

    name: str = "alexnet"
    variant: Variant = "default"

    def build(self, spec: Spec = IMAGENET):
        """An uncompiled keras.Model mapping images to logits (shapes below: tf_cnn_benchmarks' 227x227 input's)."""
        import keras

        filters, units = WIDTHS[self.variant]
        layers = [keras.Input(spec.shape), *self._padding(keras, spec)]
        for i, (f, k) in enumerate(zip(filters, KERNELS)):  # (b, 55, 55, 64), then 27x27 and 13x13
            first = i == 0
            layers.append(keras.layers.Conv2D(f, k, strides=4 if first else 1, padding="valid" if first else "same",
                                              activation="relu"))
            if i in POOLED:
                layers.append(keras.layers.MaxPooling2D(3, strides=2))  # VALID: 55 -> 27 -> 13 -> 6
        layers.append(keras.layers.Flatten())  # (b, 256 * 6 * 6)
        for _ in range(2):
            layers += [keras.layers.Dense(units, activation="relu"), keras.layers.Dropout(DROPOUT)]
        layers.append(keras.layers.Dense(spec.classes))  # (b, classes) logits
        return keras.Sequential(layers, name=f"alexnet_{self.variant}")

    @staticmethod
    def _padding(keras: Any, spec: Spec) -> list[Any]:
        """A ZeroPadding2D layer that centres images smaller than SMALLEST on a SMALLEST side, or none."""
        h, w, _ = spec.shape
        if min(h, w) >= SMALLEST:
            return []
        pad_h, pad_w = padded(h) - h, padded(w) - w
        return [keras.layers.ZeroPadding2D(((pad_h // 2, pad_h - pad_h // 2), (pad_w // 2, pad_w - pad_w // 2)))]

    def activations_per_example(self, spec: Spec = IMAGENET) -> int:
        """Every layer's outputs per example, the padding's too (validation's memory estimate)."""
        filters, units = WIDTHS[self.variant]
        h, w, c = spec.shape
        padding = padded(h) * padded(w) * c if min(h, w) < SMALLEST else 0
        channels = [f for i, f in enumerate(filters) for _ in range(2 if i in POOLED else 1)]  # a pool keeps them
        maps = sum(ch * ph * pw for ch, (ph, pw) in zip(channels, sides(padded(h), padded(w))))
        return padding + maps + 2 * units + spec.classes

    def layers_with_weights(self) -> int:
        """The most stages strategy=model_parallel can cut it into."""
        return len(KERNELS) + 3  # five convolutions, two hidden Dense layers and the logits
