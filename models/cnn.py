"""Convolutional network; `paper` is the network of the Keras multi-GPU MNIST example."""

from __future__ import annotations

from models import INPUT_SHAPE, NUM_CLASSES

# variant -> (filters of each 3x3 conv layer, index after which the single 2x2 max-pool sits, dense units)
VARIANTS = {
    "tiny": ((8, 16), 1, 32),
    "default": ((32, 64), 1, 128),
    "paper": ((128, 128, 128, 128, 128), 4, 128),
}


def build(variant: str = "default"):
    """Build the CNN.

    Args:
        variant: a key of VARIANTS.

    Returns:
        An uncompiled keras.Model mapping (batch, 28, 28, 1) images to (batch, 10) logits.
    """
    import keras

    filters, pool_after, dense = VARIANTS[variant]
    layers = [keras.Input(INPUT_SHAPE)]
    for i, f in enumerate(filters):
        layers.append(keras.layers.Conv2D(f, 3, activation="relu"))  # valid padding: side shrinks by 2
        if i == pool_after:
            layers.append(keras.layers.MaxPooling2D(2))  # side halves
    layers += [
        keras.layers.Dropout(0.25),
        keras.layers.Flatten(),
        keras.layers.Dense(dense, activation="relu"),
        keras.layers.Dropout(0.5),
        keras.layers.Dense(NUM_CLASSES),  # (b, 10) logits
    ]
    return keras.Sequential(layers, name=f"cnn_{variant}")


def weighted_layers(variant: str = "default") -> int:
    """Layers with weights (how many stages `strategy=model_parallel strategy.split=stages` can make); no Keras."""
    filters, _, _ = VARIANTS[variant]
    return len(filters) + 2  # the convs and the two Dense layers
