"""keras.applications networks, untrained, as the runner's models: `model=keras_app` (every constructor Keras exports)
and a user's `_target_: keras.applications.MobileNetV2` YAML, both built for the data's spec."""

from __future__ import annotations

import mlflow
import pytest
from conftest import compose, new_store, run_cli, runs

from runner.config import ConfigError, validate
from runner.experiment import run
from runner.models.keras_app import APPLICATIONS

SMALL = ["debug=smoke", "data=synthetic", "data.shape=[32,32,3]", "data.train_limit=128", "data.test_limit=32",
         "train.steps=2", "train.steps_per_call=1", "train.warmup_calls=1", "train.measure_input=false",
         "train.probe_peak=false", "train.checkpoint_every=0", "mlflow.system_metrics_interval=0"]


def test_every_constructor_keras_exports_is_a_choice():
    import keras

    assert len(APPLICATIONS) >= 30 and {"MobileNetV2", "ResNet50", "EfficientNetB0", "ConvNeXtTiny"} <= set(APPLICATIONS)
    assert all(callable(getattr(keras.applications, name)) for name in APPLICATIONS)


def test_a_keras_application_is_named_by_the_network_it_builds(tmp_path):
    """Every keras.applications network was `keras_app/default` in run lines, predictions and reports: ResNet50 and
    VGG16 had one name."""
    from mlflow import MlflowClient

    from runner.models import label
    from runner.predict.costs import combination
    from runner.report.table import row_of

    plan = validate(compose(*SMALL, "model=keras_app", "model.app=ResNet50"))
    assert label(plan.model) == "ResNet50/tiny" and combination(plan).startswith("ResNet50/tiny single/split x")
    assert label(validate(compose("model=mlp", "model.variant=tiny")).model) == "mlp/tiny"
    client = MlflowClient(new_store(tmp_path))
    experiment, tags = client.create_experiment("e"), {"model": "keras_app", "model.variant": "tiny"}
    labelled = client.create_run(experiment, tags={**tags, "model.label": "ResNet50/tiny"}).info.run_id
    older = client.create_run(experiment, tags=tags).info.run_id  # a run logged before the label was tagged
    assert [row_of(client.get_run(r)).model for r in (labelled, older)] == ["ResNet50/tiny", "keras_app/tiny"]


@pytest.mark.slow  # MobileNetV2 built four times (two replicas, FLOP count, evaluation), ~25 s
def test_mobilenet_v2_trains_on_two_devices_through_model_keras_app(tf_devices, store):
    result = run(compose(*SMALL, "model=keras_app", "model.app=MobileNetV2", "+model.options.alpha=0.35",
                         "strategy=mirrored", "gpus=2", f"mlflow.tracking_uri={store}"))
    row = mlflow.MlflowClient(store).get_run(result["run_id"])
    assert row.info.status == "FINISHED" and row.data.params["model.app"] == "MobileNetV2"
    assert row.data.tags["model.label"] == "MobileNetV2/tiny"  # the name the report's rows read
    assert row.data.tags["batch_norm.copies_equal"] == "true"  # MobileNetV2 normalizes every convolution
    assert row.data.tags["flops.source"] == "TensorFlow's graph statistics" and result["flops_per_example"] > 0


@pytest.mark.parametrize("overrides,words", [
    (["model.app=ResNet51"], ["model.app='ResNet51'", "ResNet50, ResNet50V2"]),
    (["+model.options.weights=imagenet"], ["model.options.weights='imagenet'", "never downloaded"]),
    (["+model.options.include_top=false"], ["model.options", "include_top", "the runner sets those"]),
    (["model.options={alpha:0.35}"], ["model.options is a mapping", "+model.options.NAME=VALUE"]),
])
def test_a_bad_keras_app_option_is_one_line(overrides, words):
    from hydra.errors import HydraException

    from runner.cli.overrides import explain

    with pytest.raises((ConfigError, HydraException)) as err:
        validate(compose("model=keras_app", *overrides))
    for word in words:
        assert word in explain(err.value)


def test_a_constructors_own_0_to_255_preprocessing_is_off_unless_asked_for(tf_devices):
    """The runner's images are in [0, 1]: MobileNetV3's built-in rescaling to [-1, 1] (it expects 0-255 pixels) is
    left out; `model.options.include_preprocessing=true` puts it back."""
    from runner.strategies.common import build_model

    def rescalings(*options):
        plan = validate(compose(*SMALL, "model=keras_app", "model.app=MobileNetV3Small", *options))
        # by type: a layer's name depends on the Rescaling layers any earlier test of this process made
        return [type(layer).__name__ for layer in build_model(plan.model, plan.spec, 0).layers
                if type(layer).__name__ == "Rescaling"]

    assert rescalings() == [] and rescalings("+model.options.include_preprocessing=true") == ["Rescaling"]


def test_an_argument_the_constructor_does_not_take_or_a_size_it_refuses_is_one_line(tf_devices):
    from runner.strategies.common import build_model

    plan = validate(compose(*SMALL, "model=keras_app", "+model.options.depth=3"))
    with pytest.raises(ConfigError, match="model.options.depth: keras.applications.MobileNetV2 takes no such"):
        build_model(plan.model, plan.spec, 0)
    with pytest.raises(ConfigError, match="model=keras_app takes images of at least 32x32, the data gives 28x28x1"):
        validate(compose("model=keras_app"))  # MNIST: refused before TensorFlow
    plan = validate(compose(*SMALL, "model=keras_app", "model.app=InceptionV3"))  # 32x32: too small for this one
    with pytest.raises(ConfigError, match="model=keras_app cannot be built for 32x32x3 .*at least 75x75"):
        build_model(plan.model, plan.spec, 0)


@pytest.mark.slow  # a fresh process building MobileNetV2 twice, ~30 s
def test_a_users_yaml_naming_a_keras_application_trains_as_is(tmp_path):
    """The YAML a user writes from keras.applications' documentation: `weights: null`, `alpha: 0.35`; the runner adds
    input_shape, classes and logits."""
    (tmp_path / "conf" / "model").mkdir(parents=True)
    (tmp_path / "conf" / "model" / "mobilenet.yaml").write_text(
        "_target_: keras.applications.MobileNetV2\nname: mobilenet\nweights: null\nalpha: 0.35\n")
    proc = run_cli("--config-dir", str(tmp_path / "conf"), "model=mobilenet", *SMALL, "strategy=replicated", "gpus=2",
                   cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    row = runs(f"sqlite:///{tmp_path / 'mlflow.db'}", "smoke").iloc[0]
    assert row["status"] == "FINISHED" and row["tags.model"] == "mobilenet"
    assert row["params.model.alpha"] == "0.35" and row["tags.batch_norm.copies_equal"] == "true"
