"""MNIST multilayer perceptron 784-n-n-10 with ReLU, as in the Keras and Chainer MNIST examples."""

from __future__ import annotations

from models import INPUT_SHAPE, NUM_CLASSES

# variant -> hidden units per layer
VARIANTS = {"tiny": 64, "default": 512, "chainer": 1000}


def build(variant: str = "default"):
    """Build the MLP.

    Args:
        variant: a key of VARIANTS.

    Returns:
        An uncompiled keras.Model mapping (batch, 28, 28, 1) images to (batch, 10) logits.
    """
    import keras

    units = VARIANTS[variant]
    return keras.Sequential(
        [
            keras.Input(INPUT_SHAPE),
            keras.layers.Flatten(),  # (b, 784)
            keras.layers.Dense(units, activation="relu"),
            keras.layers.Dense(units, activation="relu"),
            keras.layers.Dense(NUM_CLASSES),  # (b, 10) logits
        ],
        name=f"mlp_{variant}",
    )


def weighted_layers(variant: str = "default") -> int:
    """Layers with weights (how many stages `strategy=model_parallel strategy.split=stages` can make); no Keras."""
    return 3  # the three Dense layers, whatever the variant
