"""Every model variant builds and maps MNIST-shaped images to 10 logits; the named architectures are as documented."""

from __future__ import annotations

import importlib

import numpy as np
import pytest

from runner.config import model_variants

MODELS = ["mlp", "cnn", "nin"]


@pytest.mark.parametrize("name,variant", [(m, v) for m in MODELS for v in model_variants(m)])
def test_variant_builds_and_gives_logits(tf_devices, name, variant):
    model = importlib.import_module(f"models.{name}").build(variant)
    out = model(np.zeros((3, 28, 28, 1), np.float32), training=False)
    assert tuple(out.shape) == (3, 10)


def _layers(model, kind):
    return [layer for layer in model.layers if type(layer).__name__ == kind]


def test_mlp_default_is_784_512_512_10(tf_devices):
    from models import mlp

    dense = _layers(mlp.build("default"), "Dense")
    assert [d.units for d in dense] == [512, 512, 10]
    assert dense[0].kernel.shape == (784, 512)


def test_cnn_paper_is_five_3x3_convs_of_128_one_pool_dense_128(tf_devices):
    from models import cnn

    model = cnn.build("paper")
    convs = _layers(model, "Conv2D")
    assert [(c.filters, c.kernel_size) for c in convs] == [(128, (3, 3))] * 5
    assert len(_layers(model, "MaxPooling2D")) == 1
    assert [d.units for d in _layers(model, "Dense")] == [128, 10]


def test_nin_has_mlpconv_blocks_and_global_average_pooling(tf_devices):
    from models import nin

    model = nin.build("default")
    kernels = [c.kernel_size for c in _layers(model, "Conv2D")]
    assert kernels.count((1, 1)) == 6  # two 1x1 convs in each of three mlpconv blocks
    assert len(_layers(model, "Dense")) == 0
    assert len(_layers(model, "GlobalAveragePooling2D")) == 1
