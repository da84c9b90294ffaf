"""Bring your own component: a model, a pipeline and a strategy from a folder outside the package (their YAMLs found
through `--config-dir`, their module on PYTHONPATH) train through `python -m runner` like the built-in ones, with
no file of the package changed; and the registries and contracts every component goes through."""

from __future__ import annotations

import os
import textwrap
from pathlib import Path

import pytest
from conftest import REPO, compose, run_cli, runs

from runner.data_pipelines import DATASETS, PIPELINES, Dataset, Pipeline
from runner.models import MODELS, Model
from runner.config import ConfigError, validate
from runner.strategies import STRATEGIES, StrategyOptions

USER_MODULE = '''
"""A user's own components, written against the runner's contracts."""
from dataclasses import dataclass

from runner.data_pipelines import PipelineOptions
from runner.strategies import StrategyBase
from runner.strategies.replicated import Towers


def small_convnet(filters: int = 8, dense: int = 32):
    """Any function returning a Keras model is a model."""
    import keras

    return keras.Sequential([
        keras.Input((28, 28, 1)),
        keras.layers.Conv2D(filters, 3, activation="relu"),
        keras.layers.MaxPooling2D(2),
        keras.layers.Flatten(),
        keras.layers.Dense(dense, activation="relu"),
        keras.layers.Dense(10),
    ])


class _Feed:
    def __init__(self, it, towers):
        self.it, self.towers = it, towers

    def next(self):
        return [next(self.it) for _ in range(self.towers)]


@dataclass
class TowerBatches(PipelineOptions):
    """One iterator of tower-sized batches, built from the runner's tf.data stages."""

    name: str = "tower_batches"
    repeat_each: int = 1

    def towers(self, examples, global_batch, devices, seed):
        ds = examples.shuffled(self.shuffle_buffer, seed).batched(global_batch // len(devices), self)
        return _Feed(iter(ds.flat_map(lambda x, y: ds.from_tensors((x, y)).repeat(self.repeat_each))), len(devices))

    def distribute(self, strategy, examples, global_batch, seed):
        raise NotImplementedError("tower_batches feeds the runner's own towers only")


@dataclass
class EveryDevice(StrategyBase):
    """A copy of the model per device, built from the runner's in-graph towers."""

    name: str = "every_device"

    def build(self, devices, training):
        return Towers(list(devices.names), training)
'''

YAMLS = {
    "model/small_convnet.yaml": "_target_: user_components.small_convnet\nname: small_convnet\nfilters: 4\n",
    "pipeline/tower_batches.yaml": "_target_: user_components.TowerBatches\nrepeat_each: 1\n",
    "strategy/every_device.yaml": "_target_: user_components.EveryDevice\n",
}


@pytest.fixture
def user_folder(tmp_path) -> Path:
    """`code/user_components.py` and `conf/<group>/<option>.yaml`, outside the package."""
    (tmp_path / "code").mkdir()
    (tmp_path / "code" / "user_components.py").write_text(textwrap.dedent(USER_MODULE))
    for name, text in YAMLS.items():
        path = tmp_path / "conf" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return tmp_path


def _sweep(folder: Path, *overrides: str):
    env = {"PYTHONPATH": os.pathsep.join([str(folder / "code"), str(REPO)])}
    return run_cli("-m", "--config-dir", str(folder / "conf"), "debug=smoke", "train.steps=20", "gpus=2",
                   "data.train_limit=1024", "data.test_limit=256", *overrides, cwd=folder, env=env, timeout=900)


@pytest.mark.long
@pytest.mark.slow  # 10 fresh jobs, ~70 s
def test_user_model_pipeline_and_strategy_train_under_every_strategy_that_applies(user_folder):
    """The user's model under every built-in strategy that takes 2 devices (model_parallel: stages, since it is not
    all Dense) and the user's strategy, fed by the user's pipeline; the user's model and strategy under every built-in
    pipeline. Each job is a fresh `python -m runner` process; each must finish with a real run in the store."""
    applies = [s for s in STRATEGIES.names() if STRATEGIES.get(s).takes(2) and not STRATEGIES.get(s).multi_process]
    proc = _sweep(user_folder, "model=small_convnet", "pipeline=tower_batches",
                  f"strategy={','.join([*applies, 'every_device'])}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    proc = _sweep(user_folder, "model=small_convnet", "strategy=every_device",
                  f"pipeline={','.join(PIPELINES.names())}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    table = runs(f"sqlite:///{user_folder / 'mlflow.db'}", "smoke")
    children = table[table["tags.mlflow.parentRunId"].notna()]
    assert set(children["status"]) == {"FINISHED"} and set(children["tags.model"]) == {"small_convnet"}
    assert set(children["params.model.filters"]) == {"4"}  # the YAML's option reached the function, as it spells it
    assert (children["metrics.flops_per_example"] > 0).all()  # counted from the user's model itself
    fed_by_theirs = children[children["tags.pipeline"] == "tower_batches"]
    assert sorted(fed_by_theirs["tags.strategy"]) == sorted([*applies, "every_device"])
    assert fed_by_theirs[fed_by_theirs["tags.strategy"] == "model_parallel"]["tags.strategy.split"].tolist() == [
        "stages"]
    theirs = children[children["tags.strategy"] == "every_device"]
    assert sorted(theirs["tags.pipeline"]) == sorted([*PIPELINES.names(), "tower_batches"])
    assert (children["metrics.test_accuracy"] > 0.1).all()  # above chance after 20 steps


def test_a_users_model_is_named_by_its_function_not_by_the_default_models_name():
    """`+model._target_=pkg.text_classifier` (docs/your-model-your-data.md's command) was tagged and reported as
    `mlp` (model=mlp's name, from the defaults): two users' models, or one beside the MLP, became one model's rows."""
    from runner.tracking.tags import base_tags

    plan = validate(compose("+model._target_=user_models.resnet"))
    assert plan.model.name == "resnet" and base_tags(plan.cfg)["model"] == "resnet"
    assert validate(compose("+model._target_=user_models.resnet", "model.name=mine")).model.name == "mine"


def test_a_model_functions_keywords_are_logged_as_the_user_spells_them():
    """`+model.filters=16` was logged as `model.kwargs.filters`: a sweep over it had an empty `params.model.filters`
    column in the runs view (runner.sweep.show_swept names the override's key)."""
    from runner.tracking.tags import flatten

    plan = validate(compose("+model._target_=user_models.resnet", "+model.filters=16"))
    params = flatten(plan.cfg)
    assert params["model.filters"] == "16" and params["model._target_"] == "user_models.resnet"
    assert not [k for k in params if "kwargs" in k or k == "model.target"]  # one name for each fact
    assert plan.model.kwargs == {"filters": 16}


def test_a_model_functions_ignored_variant_is_said_once(monkeypatch, caplog):
    """`runner predict -m` validates each combination: "takes no variant: model.variant=default ignored" came 4
    times per model."""
    from runner import models

    monkeypatch.setattr(models, "IGNORED_VARIANT", set(), raising=False)
    for _ in range(3):
        assert validate(compose("+model._target_=user_models.resnet", "debug=smoke")).model.name == "resnet"
    assert caplog.text.count("takes no variant: model.variant=tiny ignored") == 1


def test_a_bug_in_a_users_model_function_is_one_line_naming_where(tf_devices):
    """A NameError in a user's model function was Hydra's 'Error executing job' and 64 lines of traceback; so was
    this misspelt layer."""
    from runner.strategies.common import build_model

    plan = validate(compose("+model._target_=user_models.misspelt"))
    with pytest.raises(ConfigError) as err:
        build_model(plan.model, plan.spec, 0)
    said = str(err.value)
    assert said.startswith("model=misspelt: _target_ user_models.misspelt raised AttributeError: module "
                           "'keras.layers' has no attribute 'Dens'") and said.endswith(f"user_models.py:{_line_of('Dens(')}")


def _line_of(text: str) -> int:
    """The line of tests/user_models.py that holds `text`."""
    lines = (Path(__file__).parent / "user_models.py").read_text().splitlines()
    return next(i for i, line in enumerate(lines, 1) if text in line)


def test_a_user_component_with_a_bad_option_or_path_is_one_line(user_folder, monkeypatch):
    monkeypatch.syspath_prepend(str(user_folder / "code"))
    conf = str(user_folder / "conf")
    with pytest.raises(ConfigError, match=r"model._target_='user_components.small_convnet' does not take .*width"):
        validate(_compose_with(conf, "model=small_convnet", "+model.width=3"))
    with pytest.raises(ConfigError, match=r"missing a required argument: 'shape' \(a model function gets the data's "
                                          r"input_shape and classes by name"):  # was the TypeError's words alone
        validate(_compose_with(conf, "+model._target_=user_models.odd_arguments"))
    with pytest.raises(ConfigError, match=r"strategy._target_='nowhere.Thing' cannot be imported"):
        validate(_compose_with(conf, "strategy=every_device", "strategy._target_=nowhere.Thing"))
    # the module is found, the name is not (was "cannot be imported ...; put its package on PYTHONPATH")
    with pytest.raises(ConfigError, match=r"model._target_='user_models.resnt': module user_models \(.*user_models.py\) "
                                          r"has no 'resnt'; did you mean resnet\?"):
        validate(_compose_with(conf, "+model._target_=user_models.resnt"))
    with pytest.raises(ConfigError, match=r"pipeline.repeat_each='x' is not allowed; expected an integer"):
        validate(_compose_with(conf, "pipeline=tower_batches", "pipeline.repeat_each=x"))


def test_float16_is_refused_for_a_strategy_that_does_not_say_it_scales_the_loss(user_folder, monkeypatch):
    monkeypatch.syspath_prepend(str(user_folder / "code"))
    conf = str(user_folder / "conf")
    with pytest.raises(ConfigError, match=r"mixed_float16 needs loss scaling .* strategy=every_device does not"):
        validate(_compose_with(conf, "strategy=every_device", "gpus=2", "train.precision=mixed_float16"))
    validate(_compose_with(conf, "strategy=replicated", "gpus=2", "train.precision=mixed_float16"))  # built-in: yes


def _compose_with(config_dir: str, *overrides: str):
    from runner.config import compose

    return compose([f"hydra.searchpath=[file://{config_dir}]", *overrides])


@pytest.mark.parametrize("registry,contract", [(MODELS, Model), (PIPELINES, Pipeline), (DATASETS, Dataset),
                                               (STRATEGIES, StrategyOptions)], ids=["model", "pipeline", "data",
                                                                                    "strategy"])
def test_every_built_in_component_meets_its_contract_with_its_defaults(registry, contract):
    for name in registry.names():
        component = registry.get(name)()
        assert isinstance(component, contract), name
        assert component.name == name


def test_validation_imports_no_tensorflow_for_any_component(tmp_path):
    """Every strategy, model and dataset validates (its spec read, its choices checked) without TensorFlow or Keras."""
    import subprocess
    import sys

    from test_files_data import write_npy
    from test_tfds import describe_prepared

    configs = [[f"strategy={s}", "gpus=2", *(["strategy.workers=[a:1,b:1]"] if s == "multi_worker" else [])]
               for s in STRATEGIES.names() if STRATEGIES.get(s).takes(2)]
    configs += [[f"model={m}", "data=synthetic", "data.shape=[32,32,3]"] for m in MODELS.names()
                if m not in ("gpt", "dlrm")]
    configs += [["model=gpt", "data=shakespeare"], ["model=gpt", "data=synthetic", "data.task=next_token"]]
    configs += [["model=dlrm", "data=clicks"], ["model=dlrm", "data=clicks", "strategy=sharded_update", "gpus=2"]]
    configs += [["data=files", f"data.path={write_npy(tmp_path / 'npy', sizes=(8, 4))}"],
                ["data=tfds", "data.dataset=tiny_images", f"data.data_dir={describe_prepared(tmp_path / 'tfds')}"]]
    code = (f"import sys; from conftest import compose; from runner.config import validate; "
            f"[validate(compose(*c)) for c in {configs!r}]; "
            "print(sorted(m for m in ('tensorflow', 'keras') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO / "tests", capture_output=True, text=True, timeout=120)
    assert out.stdout.strip() == "[]", out.stderr[-2000:]


def test_compose_api_sees_each_component_schema():
    cfg = compose("pipeline=sharded", "strategy=mirrored")
    assert cfg.pipeline.device_buffer == 2 and cfg.strategy.cross_device_ops == "auto"  # from the dataclasses


RESNET = '''
def resnet(filters: int = 8):
    """A user's small ResNet: residual adds and batch normalization (no FLOP formula covers it)."""
    import keras
    from keras import layers

    x = inputs = keras.Input((28, 28, 1))
    x = layers.Conv2D(filters, 3, padding="same", activation="relu")(x)
    y = layers.ReLU()(layers.BatchNormalization()(layers.Conv2D(filters, 3, padding="same")(x)))
    y = layers.BatchNormalization()(layers.Conv2D(filters, 3, padding="same")(y))
    x = layers.GlobalAveragePooling2D()(layers.ReLU()(layers.Add()([x, y])))
    return keras.Model(inputs, layers.Dense(10)(x))
'''


def test_a_user_resnet_with_batch_norm_trains_and_is_counted_by_tensorflow(tf_devices, tmp_path, store, monkeypatch):
    """In-process (a user's config folder and code from the command line: tests/test_layout.py, and the sweep above)."""
    from runner.experiment import run

    (tmp_path / "code").mkdir()
    (tmp_path / "code" / "user_resnet.py").write_text(RESNET)
    (tmp_path / "conf" / "model").mkdir(parents=True)
    (tmp_path / "conf" / "model" / "resnet.yaml").write_text("_target_: user_resnet.resnet\nname: resnet\nfilters: 4\n")
    monkeypatch.syspath_prepend(str(tmp_path / "code"))
    run(compose(f"hydra.searchpath=[file://{tmp_path / 'conf'}]", "model=resnet", "debug=smoke",
                "strategy=replicated", "gpus=2", f"mlflow.tracking_uri={store}"))
    row = runs(store, "smoke").iloc[0]
    assert row["status"] == "FINISHED" and row["tags.model"] == "resnet"
    assert row["tags.flops.source"] == "TensorFlow's graph statistics"
    assert row["metrics.flops_per_example"] > 0 and row["metrics.achieved_gflops"] > 0


CONTRACT_ONLY = {"model": "ContractModel", "data": "ContractData", "pipeline": "ContractPipeline",
                 "strategy": "ContractStrategy"}


def test_components_giving_only_their_written_contracts_validate_train_and_are_predicted(tf_devices, tmp_path, store):
    """A user's model, data, pipeline and strategy that give the runner their Protocol's members and nothing else
    (tests/user_models.py: each member a built-in's, any other attribute an AttributeError) pass validation, train
    in-process and are priced from a spec sheet: every member the runner reads is in the written contract (was:
    Dataset lacked train_examples, describe and in_memory_bytes; Pipeline its tf.data options; StrategyOptions
    its roles and jit_refusal)."""
    from runner.experiment import run
    from runner.predict.grid import predict_all

    for group, cls in CONTRACT_ONLY.items():
        (tmp_path / "conf" / group).mkdir(parents=True)
        (tmp_path / "conf" / group / "contract.yaml").write_text(f"_target_: user_models.{cls}\n")
    chosen = [f"hydra.searchpath=[file://{tmp_path / 'conf'}]", *(f"{g}=contract" for g in CONTRACT_ONLY), "gpus=2"]
    run(compose(*chosen, "train.global_batch_size=64", "train.steps=60", "train.steps_per_call=10",
                "train.predict=false", "train.jit_compile=false", "mlflow.experiment=contract",
                f"mlflow.tracking_uri={store}"))  # debug=smoke's keys: options these components do not have
    row = runs(store, "contract").iloc[0]
    assert row["status"] == "FINISHED" and row["tags.strategy"] == "contract_strategy", row.to_dict()
    assert row["metrics.test_accuracy"] > 0.5  # it learned (MNIST's 10 classes; debug=smoke's MLP: about 0.8)
    (outcome,) = predict_all([[*chosen, "hardware=dgx1_p100"]])
    assert outcome.error is None and outcome.prediction.rate > 0, outcome.error


def test_a_built_strategy_on_common_built_alone_has_the_contracts_defaults():
    """docs/architecture.md: `build` returns a `common.Built`; one that subclasses it alone answers what the run asks
    of every built strategy with a default (was: AttributeError at the first checkpoint, check_same_start)."""
    from runner.strategies import Strategy
    from runner.strategies.common import Built

    class Mine(Built):
        pass

    assert isinstance(Mine(), Strategy) and Mine().check_same_start(5) is None


def test_a_word_in_a_list_option_of_a_component_is_one_config_error():
    """A component's `xs: list[int]` given [1, "a"]: OmegaConf names the item `xs[1]`; reading the option's rule by that
    key raised KeyError (a traceback) where a word in a number option became 'expected a number' (91376f2)."""
    from dataclasses import dataclass, field

    from runner.registry import typed_values

    @dataclass
    class Listed:
        xs: list[int] = field(default_factory=list)
        rate: float = 1.0

    with pytest.raises(ConfigError, match=r"^thing\.xs\[1\]: Value 'a' of type 'str' could not be converted"):
        typed_values(Listed, {"xs": [1, "a"]}, "thing")
    with pytest.raises(ConfigError, match=r"^thing\.rate='fast' is not allowed; expected a number$"):
        typed_values(Listed, {"rate": "fast"}, "thing")
