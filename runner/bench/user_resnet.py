"""A user's ResNet-20 for CIFAR-10, written as a user writes one (a plain Keras function the bench brings with
`_target_`): the network tf_cnn_benchmarks builds as `resnet20` (He et al. 2016, section 4.2: a 3x3 stem of 16
filters, three stages of three basic blocks of 16, 32 and 64 filters, the first block of stages 2 and 3 striding by
2 with a parameter-free shortcut: 1x1 average pooling and zero channels), convolutions without bias, each followed by
Keras' BatchNormalization (tf_cnn_benchmarks' epsilon 1e-5 and decay 0.9)."""

from __future__ import annotations

from typing import Any


def resnet20(input_shape: tuple[int, ...] = (32, 32, 3), classes: int = 10) -> Any:
    """ResNet-20 v1 mapping (b, 32, 32, 3) images to (b, classes) logits."""
    import keras
    from keras import layers

    def conv_bn(x: Any, filters: int, stride: int = 1) -> Any:
        x = layers.Conv2D(filters, 3, strides=stride, padding="same", use_bias=False)(x)
        return layers.BatchNormalization(momentum=0.9, epsilon=1e-5)(x)

    def block(x: Any, filters: int, stride: int) -> Any:
        shortcut = x
        if stride != 1 or x.shape[-1] != filters:  # option A: subsample, then zero channels on both sides
            pad = (filters - x.shape[-1]) // 2
            shortcut = layers.AveragePooling2D(1, strides=stride)(x)
            shortcut = layers.Lambda(lambda t: keras.ops.pad(t, [[0, 0], [0, 0], [0, 0], [pad, pad]]))(shortcut)
        y = layers.ReLU()(conv_bn(x, filters, stride))
        return layers.ReLU()(layers.Add()([shortcut, conv_bn(y, filters)]))

    x = inputs = keras.Input(input_shape)
    x = layers.ReLU()(conv_bn(x, 16))  # (b, 32, 32, 16)
    for stage, filters in enumerate((16, 32, 64)):
        for i in range(3):
            x = block(x, filters, 2 if stage and i == 0 else 1)  # (b, 32 / 2**stage, ..., filters)
    x = layers.GlobalAveragePooling2D()(x)  # (b, 64)
    return keras.Model(inputs, layers.Dense(classes)(x), name="resnet20")  # (b, classes) logits
