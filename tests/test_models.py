"""Every model variant builds for the data's spec (MNIST's and others; token ids for the GPT) and maps its inputs
to one logit per class (per position); the named architectures are as documented."""

from __future__ import annotations

import numpy as np
import pytest

from runner.config import ConfigError
from runner.data_pipelines import MNIST, Feature, Spec
from runner.models import MODELS, Model, variants

CIFAR = Spec((32, 32, 3), 100)  # another shape, channel count and class count
TEXT = Spec((16,), 20, "int32", "next_token", 20)  # token ids, the next token at every position (model=gpt)
CLICKS = Spec((), 2, "features", "binary", features=(  # named features, a binary label (model=dlrm)
    Feature("dense", (13,), "float32"), Feature("categorical", (3,), "int32", (7, 11, 5))))


def every_variant() -> list:
    """One options object per model and variant (the models without variants once), from the registry."""
    cls = MODELS.get
    return [cls(n)(variant=v) if v is not None else cls(n)() for n in MODELS.names() for v in variants(n)]


def smallest_spec(model) -> Spec:
    """MNIST's spec where the model takes it, else CIFAR's (keras.applications need 32x32), else token ids, else
    named features."""
    for spec in (MNIST, CIFAR, TEXT):
        try:
            model.check(spec)
            return spec
        except ConfigError:
            pass
    model.check(CLICKS)
    return CLICKS


def zeros(spec: Spec, n: int):
    """n examples of `spec`'s inputs, all zeros: an array, or a dict of named features."""
    if spec.features:
        return {f.name: np.zeros((n, *f.shape), f.dtype) for f in spec.features}
    return np.zeros((n, *spec.shape), np.int32 if spec.dtype == "int32" else np.float32)


def counted() -> list:
    """The variants that say their layer counts and activations before they are built (the rest: None)."""
    return [m for m in every_variant() if m.layers_with_weights() is not None]


@pytest.mark.parametrize("model", every_variant(), ids=str)
def test_variant_builds_and_gives_logits(tf_devices, model):
    assert isinstance(model, Model)
    spec = smallest_spec(model)
    out = model.build(spec)(zeros(spec, 3), training=False)
    assert tuple(out.shape) == (3, *spec.outputs_shape)  # one logit per class (per position; one for a click)


@pytest.mark.parametrize("model", counted(), ids=str)
def test_layers_with_weights_and_dense_only_say_what_keras_builds(tf_devices, model):
    """Config validation (no TensorFlow) uses them to choose and check strategy=model_parallel's split."""
    import keras

    weighted = [layer for layer in model.build().layers if layer.trainable_weights]
    assert model.layers_with_weights() == len(weighted)
    assert model.dense_only == all(isinstance(layer, keras.layers.Dense) for layer in weighted)


def test_lenet_is_the_tensorflow_tutorial_network(tf_devices):
    from runner.models.lenet import LeNet

    model = LeNet(variant="default").build()
    convs = _layers(model, "Conv2D")
    assert [(c.filters, c.kernel_size, c.padding) for c in convs] == [(32, (5, 5), "same"), (64, (5, 5), "same")]
    assert [p.pool_size for p in _layers(model, "MaxPooling2D")] == [(2, 2), (2, 2)]
    assert [d.units for d in _layers(model, "Dense")] == [512, 10]


def _layers(model, kind):
    return [layer for layer in model.layers if type(layer).__name__ == kind]


def test_mlp_default_is_784_512_512_10(tf_devices):
    from runner.models.mlp import MLP

    dense = _layers(MLP("mlp", "default").build(), "Dense")
    assert [d.units for d in dense] == [512, 512, 10]
    assert dense[0].kernel.shape == (784, 512)


def test_cnn_paper_is_five_3x3_convs_of_128_one_pool_dense_128(tf_devices):
    from runner.models.cnn import CNN

    model = CNN(variant="paper").build()
    convs = _layers(model, "Conv2D")
    assert [(c.filters, c.kernel_size) for c in convs] == [(128, (3, 3))] * 5
    assert len(_layers(model, "MaxPooling2D")) == 1
    assert [d.units for d in _layers(model, "Dense")] == [128, 10]


def test_nin_has_mlpconv_blocks_and_global_average_pooling(tf_devices):
    from runner.models.nin import NIN

    model = NIN(variant="default").build()
    kernels = [c.kernel_size for c in _layers(model, "Conv2D")]
    assert kernels.count((1, 1)) == 6  # two 1x1 convs in each of three mlpconv blocks
    assert len(_layers(model, "Dense")) == 0
    assert len(_layers(model, "GlobalAveragePooling2D")) == 1


@pytest.mark.parametrize("spec", [MNIST, CIFAR, Spec((45, 37, 2), 3)], ids=str)
@pytest.mark.parametrize("model", counted(), ids=str)
def test_activations_per_example_counts_every_layer_output(tf_devices, model, spec):
    """The memory estimate of validation (no TensorFlow) counts what the built model's layers output per example of
    the data's spec (odd sizes too: SAME pools round up, valid convolutions shrink)."""
    import math

    model.check(spec)
    built = model.build(spec)
    outputs = sum(math.prod(layer.output.shape[1:]) for layer in built.layers
                  if type(layer).__name__ not in ("Flatten", "Dropout"))
    assert model.activations_per_example(spec) == outputs
    assert tuple(built.input_shape[1:]) == spec.shape and tuple(built.output_shape[1:]) == (spec.classes,)


@pytest.mark.parametrize("model", counted(), ids=str)
def test_check_refuses_exactly_the_sizes_keras_cannot_build(tf_devices, model):
    """Validation (no TensorFlow) refuses a spec in one line naming the model and the data exactly when Keras would
    fail to build the model for it (the CNN's valid convolutions need room; SAME-padded models take any size)."""
    for side in range(1, 12):
        spec = Spec((side, side + 1, 1), 10)
        try:
            model.build(spec)
            builds = True
        except ValueError:
            builds = False
        if builds:
            model.check(spec)
        else:
            with pytest.raises(ConfigError, match=f"model={model.name} takes images of at least .* the data gives"):
                model.check(spec)


class _Mine:
    """A user's stack of layers (`SequentialModel`): Keras' other spellings of sizes and padding, batch
    normalization, a regularizer built from the `keras` given in; `odd` adds a layer the walk does not follow."""

    @staticmethod
    def make(odd: bool):
        from dataclasses import dataclass

        from runner.models import SequentialModel

        @dataclass
        class Mine(SequentialModel):
            name: str = "mine"

            def layers(self, keras, spec):
                first = [keras.layers.Rescaling(0.5)] if odd else []
                return first + [
                    keras.layers.ZeroPadding2D((1, 2)),
                    keras.layers.Conv2D(4, (3, 5), strides=(1, 2), padding="valid",
                                        kernel_regularizer=keras.regularizers.l2(1e-4)),
                    keras.layers.BatchNormalization(),
                    keras.layers.Activation("relu"),
                    keras.layers.MaxPooling2D((2, 3), padding="same"),
                    keras.layers.Conv2D(6, 3, padding="same"),
                    keras.layers.ZeroPadding2D(1),
                    keras.layers.Dense(5),  # on the last axis
                    keras.layers.Flatten(),
                    keras.layers.Dense(spec.classes),
                ]

        return Mine()


def test_a_users_stack_of_layers_is_walked_as_keras_builds_it(tf_devices):
    """A user's SequentialModel gets the derived facts for Keras' other spellings (size pairs, int and pair padding,
    a Dense on a feature map), and none (unknown: None, any size taken) for a layer the walk does
    not follow, which still builds."""
    import math

    model = _Mine.make(odd=False)
    for side in range(1, 9):
        spec = Spec((side, side + 2, 2), 3)
        try:
            built = model.build(spec)
        except ValueError:
            with pytest.raises(ConfigError, match="model=mine takes images of at least"):
                model.check(spec)
            continue
        model.check(spec)
        outputs = sum(math.prod(layer.output.shape[1:]) for layer in built.layers
                      if type(layer).__name__ not in ("Flatten", "Dropout"))
        assert model.activations_per_example(spec) == outputs
    assert model.layers_with_weights() == sum(bool(layer.trainable_weights) for layer in model.build().layers) == 5
    assert not model.dense_only
    odd = _Mine.make(odd=True)
    assert odd.activations_per_example(MNIST) is None and odd.layers_with_weights() is None and not odd.dense_only
    odd.check(Spec((1, 1, 1), 3))  # not walked: Keras says what it cannot build
    assert odd.build(MNIST).output_shape == (None, 10)
