"""tf_cnn_benchmarks' published models as presets (`experiment=tf_cnn_*`): each composes TensorFlow's 2017 benchmark
setting at 1 and 2 devices and trains here at a tiny batch; `model=alexnet` is tf_cnn_benchmarks' AlexNet, layer for
layer, and the FLOP counter counts it."""

from __future__ import annotations

import math

import pytest
from conftest import REPO, compose, markdown_rows, runs

from runner.config import validate
from runner.data_pipelines import MNIST, Spec

# preset -> (model, keras.applications constructor, image side, batch per GPU, strategy): the DGX-1 P100 tables of
# TensorFlow's benchmarks page (May 2017; tensorflow/docs, site/en/r1/guide/performance/benchmarks.md)
PRESETS = {
    "tf_cnn_resnet50": ("keras_app", "ResNet50", 224, 64, "parameter_server"),
    "tf_cnn_resnet152": ("keras_app", "ResNet152", 224, 64, "parameter_server"),
    "tf_cnn_inception3": ("keras_app", "InceptionV3", 299, 64, "parameter_server"),
    "tf_cnn_vgg16": ("keras_app", "VGG16", 224, 64, "replicated"),
    "tf_cnn_alexnet": ("alexnet", None, 227, 512, "replicated"),
}
# A training run of 2 steps at 2 images per device, evaluated on 4: the presets' shapes, not their batches
TINY = ("train.per_device_batch_size=2", "train.steps=2", "train.steps_per_call=1", "train.predict=false",
        "train.checkpoint_every=0", "data.train_limit=8", "data.test_limit=4")


@pytest.mark.parametrize("gpus", [1, 2])
@pytest.mark.parametrize("preset", PRESETS)
def test_each_preset_is_the_published_setting_with_a_global_batch_of_batch_per_gpu_times_gpus(preset, gpus):
    model, app, side, per_gpu, strategy = PRESETS[preset]
    cfg = validate(compose(f"experiment={preset}", f"gpus={gpus}")).cfg
    assert (cfg.model.name, cfg.model.get("app"), cfg.strategy.name) == (model, app, strategy)
    assert (cfg.data.name, list(cfg.data.shape), cfg.data.classes) == ("synthetic", [side, side, 3], 1000)
    assert cfg.train.optimizer == "sgd" and cfg.train.batch_scaling == "weak"
    assert (cfg.train.per_device_batch_size, cfg.train.global_batch_size) == (per_gpu, per_gpu * gpus)
    assert cfg.train.target_accuracy is None and cfg.mlflow.experiment == "tf_cnn"
    assert cfg.data.train_limit * side * side * 3 < 100 << 20  # the synthetic images held: under 100 MB


def test_the_modes_table_names_the_strategies_the_published_tables_are_predicted_with():
    """docs/pipelines-and-strategies.md says what differs between each tf_cnn_benchmarks mode and the strategy
    `runner.bench published` predicts it with: the same strategies as the registry's (each strategy's `tf_cnn`)."""
    from runner.strategies import tf_cnn_modes

    rows = markdown_rows((REPO / "docs" / "pipelines-and-strategies.md").read_text())
    named = {row["predicted with"].strip("`") for row in rows if row.get("predicted with", "none") != "none"}
    assert named == {" ".join(overrides) for overrides in tf_cnn_modes().values()}


@pytest.fixture(scope="module")
def alexnet(tf_devices):
    """tf_cnn_benchmarks' AlexNet built at its input, 227x227x3, for 1,000 classes (62M weights: built once)."""
    from runner.models.alexnet import IMAGENET, AlexNet

    return AlexNet().build(IMAGENET)


def test_alexnet_has_tf_cnn_benchmarks_layers_shapes_and_parameter_count(alexnet):
    """tf_cnn_benchmarks' models/alexnet_model.py at 227x227x3: its reshape is to 256 * 6 * 6 = 9,216 values."""
    shapes = [(type(layer).__name__, tuple(layer.output.shape[1:])) for layer in alexnet.layers]
    assert shapes == [
        ("Conv2D", (55, 55, 64)), ("MaxPooling2D", (27, 27, 64)),  # 11x11 stride 4 VALID: (227 - 11) / 4 + 1 = 55
        ("Conv2D", (27, 27, 192)), ("MaxPooling2D", (13, 13, 192)),
        ("Conv2D", (13, 13, 384)), ("Conv2D", (13, 13, 384)), ("Conv2D", (13, 13, 256)), ("MaxPooling2D", (6, 6, 256)),
        ("Flatten", (9216,)), ("Dense", (4096,)), ("Dropout", (4096,)), ("Dense", (4096,)), ("Dropout", (4096,)),
        ("Dense", (1000,)),
    ]
    convs = [layer for layer in alexnet.layers if type(layer).__name__ == "Conv2D"]
    assert [(c.kernel_size, c.strides, c.padding) for c in convs] == [
        ((11, 11), (4, 4), "valid"), *[((k, k), (1, 1), "same") for k in (5, 3, 3, 3)]]
    assert all(layer.activation.__name__ == "relu" for layer in alexnet.layers[:-1] if hasattr(layer, "activation"))
    assert [d.rate for d in alexnet.layers if type(d).__name__ == "Dropout"] == [0.5, 0.5]  # tf_cnn keeps half
    # weights + biases: conv 11*11*3*64 + 64 = 23,296; 5*5*64*192 + 192 = 307,392; 3*3*192*384 + 384 = 663,936;
    # 3*3*384*384 + 384 = 1,327,488; 3*3*384*256 + 256 = 884,992; dense 9216*4096 + 4096 = 37,752,832;
    # 4096*4096 + 4096 = 16,781,312; 4096*1000 + 1000 = 4,097,000: 61,838,248 in all
    assert alexnet.count_params() == 61_838_248


def test_the_flop_counter_counts_alexnet_by_its_layers(alexnet):
    """Forward, 2 FLOPs per multiply-accumulate: 2 x kernel x output positions per layer; 2 x 23,232 x 55^2 =
    140,553,600 (conv1) + 2 x 307,200 x 27^2 = 447,897,600 + 2 x 169 x (663,552 + 1,327,104 + 884,736) =
    971,882,496 + 2 x (37,748,736 + 16,777,216 + 4,096,000) = 117,243,904: 1,677,577,600. Training: 3x forward less
    the first layer's input gradient: 3 x 1,677,577,600 - 140,553,600 = 4,892,179,200."""
    from runner.measure.flops import Count, count_training_flops, forward_flops_per_example

    assert forward_flops_per_example(alexnet) == 1_677_577_600
    assert count_training_flops(alexnet) == Count(4_892_179_200, "layer formulas")


@pytest.mark.parametrize("spec,padded", [(MNIST, (67, 67, 1)), (Spec((66, 70, 3), 5), (67, 70, 3)),
                                         (Spec((67, 67, 3), 5), None)], ids=str)
def test_alexnet_zero_pads_images_below_its_smallest_size_and_no_others(tf_devices, spec, padded):
    """67x67 is the least its VALID convolution and pools take (they leave 1x1): smaller sides are padded to it."""
    from runner.models.alexnet import AlexNet

    model = AlexNet(variant="tiny").build(spec)
    first = model.layers[0]
    if padded is None:
        flatten = next(layer for layer in model.layers if type(layer).__name__ == "Flatten")
        assert type(first).__name__ == "Conv2D" and tuple(flatten.input.shape[1:]) == (1, 1, 32)  # tiny: 32 filters
    else:
        assert type(first).__name__ == "ZeroPadding2D" and tuple(first.output.shape[1:]) == padded
    assert tuple(model.output_shape[1:]) == (spec.classes,)


def _smoke(preset: str, store: str, *extra: str) -> None:
    """Train `preset` here for 2 steps at 2 images on each of 2 devices (`extra`: more overrides); check what the
    run logged."""
    from runner.experiment import run

    model, app, side, _, strategy = PRESETS[preset]
    result = run(compose(f"experiment={preset}", "gpus=2", *TINY, *extra, f"mlflow.tracking_uri={store}"))
    row = runs(store, "tf_cnn").iloc[0]
    assert row["status"] == "FINISHED" and row["tags.model"] == model and row["params.strategy.name"] == strategy
    assert row.get("params.model.app") == app  # keras.applications' constructor; none for model=alexnet
    assert row["params.data.shape"] == f"[{side}, {side}, 3]" and row["params.train.global_batch_size"] == "4"
    assert result["images_per_sec"] > 0 and math.isfinite(result["test_loss"]) and result["flops_per_example"] > 0


def test_the_alexnet_preset_trains_here_at_a_tiny_batch_and_width(tf_devices, store):
    _smoke("tf_cnn_alexnet", store, "model.variant=tiny")  # 1 s; at full width (62M weights a copy): below, slow


LONG = ("tf_cnn_resnet152", "tf_cnn_inception3")  # 35 s and 15 s on the 2-core Zen 4; the others 2-15 s


@pytest.mark.slow  # each network at full size and 224-299 pixels, built per device, traced and counted
@pytest.mark.parametrize("preset", [pytest.param(p, marks=[pytest.mark.long] if p in LONG else []) for p in PRESETS])
def test_each_preset_trains_here_at_a_tiny_batch(tf_devices, store, preset):
    _smoke(preset, store)
