"""Config composition through Hydra's compose API, and validation errors (no TensorFlow is imported here)."""

from __future__ import annotations

import pytest
from conftest import compose
from hydra.errors import HydraException

from runner.cli.overrides import explain as one_line
from runner.config import CONF_DIR, COMPONENTS, GROUPS, ConfigError, group_options, validate


@pytest.mark.parametrize(
    "group,option", [(g, o) for g in GROUPS for o in group_options(g)], ids=lambda v: str(v)
)
def test_every_group_option_composes_and_validates(group, option, tmp_path):
    overrides = [f"{group}={option}"]
    if (group, option) == ("data", "files"):  # the user's folder: no default
        from test_files_data import write_npy

        overrides.append(f"data.path={write_npy(tmp_path / 'ds', sizes=(8, 4))}")
    if (group, option) == ("data", "tfds"):  # a dataset prepared in a local data_dir (never downloaded)
        from test_tfds import describe_prepared

        overrides += ["data.dataset=tiny_images", f"data.data_dir={describe_prepared(tmp_path)}"]
    if group == "strategy" and option != "single":
        overrides.append("gpus=2")
    # A language model and its text, a recommender and its click logs: each needs the other
    partners = {("model", "gpt"): "data=shakespeare", ("data", "shakespeare"): "model=gpt",
                ("model", "dlrm"): "data=clicks", ("data", "clicks"): "model=dlrm"}
    if (group, option) in partners:
        overrides.append(partners[group, option])
    elif group == "model":  # 32x32x3: images every image model takes (keras.applications: 32x32)
        overrides += ["data=synthetic", "data.shape=[32,32,3]"]
    if option == "multi_worker":  # its cluster: two workers, this process the first
        overrides.append("strategy.workers=[127.0.0.1:2222,127.0.0.1:2223]")
    cfg = validate(compose(*overrides), priced=group == "hardware").cfg  # a spec sheet: for `runner predict`
    if group in COMPONENTS:
        assert cfg[group].name == option


def test_every_group_has_options():
    for group in GROUPS:
        assert group_options(group), f"conf/{group}/ is empty"


def test_smoke_preset_is_small():
    cfg = validate(compose("debug=smoke")).cfg
    assert cfg.model.variant == "tiny"
    assert cfg.train.steps <= 100
    assert cfg.data.train_limit <= 10000


def test_default_is_full_mnist_mlp_on_one_device():
    cfg = validate(compose()).cfg
    assert (cfg.model.name, cfg.model.variant, cfg.data.name, cfg.data.train_limit) == ("mlp", "default", "mnist", None)
    assert cfg.gpus == 1 and cfg.strategy.name == "single"


def test_every_registered_component_has_its_yaml_and_the_other_way_round():
    for kind, registry in COMPONENTS.items():
        if kind == "hardware":  # `this` is registered; the spec sheets are one class's values, each its own YAML
            sheets = [n for n in group_options(kind) if n not in registry.names()]
            assert set(registry.names()) <= set(group_options(kind)) and sheets
            assert all("_target_: runner.hardware.SpecSheet" in (CONF_DIR / kind / f"{n}.yaml").read_text()
                       for n in sheets)
            continue
        assert registry.names() == group_options(kind), kind


BAD = [
    # (overrides, words the one-line message must contain)
    (["gpus=-1"], ["gpus", "-1", "0 to 16"]),
    (["gpus=17"], ["gpus", "17"]),
    (["gpus=abc"], ["gpus", "abc"]),
    (["train.global_batch_size=0"], ["train.global_batch_size", "0", "positive"]),
    (["train.learning_rate=-0.1"], ["train.learning_rate", "-0.1"]),
    (["train.optimizer=lamb"], ["train.optimizer", "lamb", "adam, adamw, sgd"]),
    (["model.variant=huge"], ["model.variant", "huge", "tiny"]),
    (["model.name=resnet"], ["model.name", "resnet", ", ".join(COMPONENTS["model"].names())]),
    (["strategy=mirrored", "gpus=3"], ["global_batch_size=128", "3", "multiple of 3"]),
    (["strategy=single", "gpus=2"], ["strategy=single", "gpus=2", "mirrored"]),
    (["strategy=mirrored", "strategy.cross_device_ops=magic"], ["cross_device_ops", "magic", "nccl"]),
    (["+train.foo=1"], ["train.foo"]),
    (["train.steps=0"], ["train.steps", "0"]),
    (["data=synthetic", "data.shape=[28,28]"], ["data.shape", "[height, width, channels]"]),
    (["data=tfds", "data.shape=[64,64]"], ["data.shape=[64, 64]", "[height, width, channels]", "or null"]),
    (["data=synthetic", "data.classes=1"], ["data.classes", "1", "at least 2"]),
    (["data=synthetic", "data.shape=[5,5,1]", "model=cnn"], ["model=cnn", "at least 6x6", "5x5x1 uint8 images"]),
    (["data=synthetic", "data.shape=[224,224,3]", "data.train_limit=1000000"], ["data=synthetic", "GiB", "train_limit"]),
    (["data=synthetic", "data.shape=[224,224,3]", "model=nin", "model.variant=paper", "train.global_batch_size=65536"],
     ["train.global_batch_size=65536", "GiB of activations for model=nin", "smaller batch"]),
]


def test_the_spec_comes_from_the_data_and_sizes_the_memory_estimate():
    """A plan carries the data's example spec; the memory estimate scales with the image size."""
    from runner.config import memory_estimate

    small, large = validate(compose("data=synthetic")), validate(compose("data=synthetic", "data.shape=[64,64,3]"))
    assert (small.spec.shape, small.spec.classes) == ((28, 28, 1), 10) and large.spec.shape == (64, 64, 3)
    train = {"global_batch_size": 128, "per_device_batch_size": 128}
    ratio = [a / b for a, b in zip(memory_estimate(train, large.model, large.spec, 1),
                                   memory_estimate(train, small.model, small.spec, 1))]
    assert ratio[0] == 64 * 64 * 3 / (28 * 28)  # the input batches: bytes per image
    assert ratio[1] == 1.0  # the MLP's activations do not depend on the input size


@pytest.mark.parametrize("overrides,words", BAD, ids=lambda v: " ".join(v) if isinstance(v, list) else "")
def test_bad_config_is_one_line_naming_key_and_value(overrides, words):
    # A wrong type is refused while Hydra composes (the schemas type the config), the rest by validate().
    with pytest.raises((ConfigError, HydraException)) as err:
        validate(compose(*overrides))
    message = one_line(err.value)
    assert "\n" not in message
    for word in words:
        assert word in message, f"{word!r} missing from {message!r}"
