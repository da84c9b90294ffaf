"""Hostile input (issue #45): garbage data files, bad models and bad overrides are one line; no run is left RUNNING."""

from __future__ import annotations

import os
import shutil

import pytest
from conftest import compose, run_cli, runs
from hydra.errors import HydraException

from runner.cli.overrides import explain
from runner.config import ConfigError, validate
from runner.data_pipelines import DataError
from runner.errors import one_line
from runner.experiment import run

SHORT = ["debug=smoke", "train.steps=4", "train.steps_per_call=2", "train.warmup_calls=1", "train.probe_peak=false",
         "train.checkpoint_every=0", "mlflow.system_metrics_interval=0"]
TFDS = ["data=tfds", "data.dataset=tiny_images"]


def not_a_model(input_shape, classes):
    """A user's model function that returns a dict instead of a Keras model (a `_target_` for the tests)."""
    return {"input_shape": input_shape, "classes": classes}


def frozen(input_shape, classes):
    """A user's model whose every weight is frozen (a `_target_` for the tests): nothing to train."""
    import keras

    layer = keras.layers.Dense(classes, trainable=False)
    return keras.Sequential([keras.Input(input_shape), keras.layers.Flatten(), layer])


def statuses(store: str) -> list[str]:
    """The status of every run of the smoke experiment in the store (none: [])."""
    table = runs(store, "smoke")
    return sorted(table["status"]) if len(table) else []


def one_line_naming(e: BaseException, *words: str) -> str:
    """The exception's message, checked to be one line holding every word."""
    message = str(e)
    assert "\n" not in message, message
    for word in words:
        assert word in message, (word, message)
    return message


# ---- data=files -------------------------------------------------------------------------------------------------

def test_a_shard_of_random_bytes_is_refused_at_validation_naming_it(tmp_path):
    """Random bytes named like a shard: its first record header fails TFRecord's length checksum (the length read
    from it would be anything up to 2**64), found by validation before any run opens; counting it says the same."""
    from runner.data_pipelines.records import count_records

    folder = tmp_path / "ds"
    folder.mkdir()
    (folder / "train-00000-of-00001").write_bytes(os.urandom(4096))
    (folder / "validation-00000-of-00001").write_bytes(b"")  # a TFRecord file of no records
    with pytest.raises(ConfigError) as err:
        validate(compose("data=files", f"data.path={folder}", "data.shape=[8,8,1]", "data.classes=10"))
    one_line_naming(err.value, f"{folder / 'train-00000-of-00001'} is not a TFRecord file", "checksum")
    with pytest.raises(DataError, match="is not a TFRecord file"):
        count_records(str(folder / "train-00000-of-00001"))


def test_compressed_or_utf16_data_is_named_with_what_to_do(tmp_path):
    """A gzip-compressed TFRecord shard and click logs saved as gzip or UTF-16: the format's own check fails on them
    ('fails its checksum', '1 tab-separated field', '0 categorical columns'); the line names the wrapping."""
    import gzip
    import struct

    from runner.data_pipelines.clicks import tsv_spec
    from runner.data_pipelines.files import Files
    from runner.data_pipelines.records import masked_crc32c

    folder = tmp_path / "ds"
    folder.mkdir()
    length = struct.pack("<Q", 3)
    record = length + struct.pack("<I", masked_crc32c(length)) + b"abc" + struct.pack("<I", masked_crc32c(b"abc"))
    (folder / "train-00000-of-00001").write_bytes(gzip.compress(record))
    with pytest.raises(ConfigError) as err:
        validate(compose("data=files", f"data.path={folder}", "data.shape=[8,8,1]", "data.classes=10"))
    shard = folder / "train-00000-of-00001"
    one_line_naming(err.value, f"{shard} is not a TFRecord file", f"(it is gzip-compressed; undo it in place: gzip -dc "
                    f"< {shard} > {shard}.tmp && mv {shard}.tmp {shard})")
    line = "\t".join(["1", *["7"] * 13, "4", "5", "6"]) + "\n"
    for encode, said in [(lambda text: gzip.compress(text.encode()), "gzip-compressed; undo it in place: gzip -dc <"),
                         (lambda text: text.encode("utf-16"), "UTF-16 text; undo it in place: iconv -f UTF-16 -t UTF-8")]:
        for name in ("train.tsv", "test.tsv"):
            (tmp_path / name).write_bytes(encode(line * 4))
        with pytest.raises(DataError) as err:
            tsv_spec(tmp_path, (50, 20, 30))
        one_line_naming(err.value, f"{tmp_path / 'train.tsv'} is {said}", "click logs are")
    (tmp_path / "x_train.npy").write_bytes(gzip.compress(b"\x93NUMPY"))
    with pytest.raises(DataError) as err:
        Files(path=str(tmp_path))._array("x_train")
    one_line_naming(err.value, f"{tmp_path / 'x_train.npy'} is not a .npy file: it is gzip-compressed; undo it")


def write_records(tf, path, images: list[bytes]) -> None:
    """A TFRecord file of tf.train.Examples in tf_cnn_benchmarks' layout, one per encoded image, each labelled 1."""
    with tf.io.TFRecordWriter(str(path)) as writer:
        for image in images:
            writer.write(tf.train.Example(features=tf.train.Features(feature={
                "image/encoded": tf.train.Feature(bytes_list=tf.train.BytesList(value=[image])),
                "image/class/label": tf.train.Feature(int64_list=tf.train.Int64List(value=[1])),
            })).SerializeToString())


@pytest.mark.parametrize("bad", ["train", "validation"])
def test_an_image_that_is_not_an_image_ends_the_run_failed_in_one_line_naming_the_data(tf_devices, tmp_path, store,
                                                                                      bad):
    """Well-framed records whose image/encoded is random bytes, in the training shard (the compiled loop's input
    fails) or the test shard (evaluation's): a DataError naming the folder and TensorFlow's own reason, without its
    graph nodes; the run FAILED."""
    import numpy as np

    tf, folder = tf_devices, tmp_path / "ds"
    folder.mkdir()
    png = tf.io.encode_png(np.zeros((8, 8, 1), np.uint8)).numpy()
    for split in ("train", "validation"):
        images = [os.urandom(64) if split == bad else png for _ in range(32)]
        write_records(tf, folder / f"{split}-00000-of-00001", images)
    with pytest.raises(DataError) as err:
        run(compose(*SHORT, "data=files", f"data.path={folder}", "data.shape=[8,8,1]", "data.classes=10",
                    f"mlflow.tracking_uri={store}"))
    message = one_line_naming(err.value, f"an example of {folder} (tfrecord) cannot be read",
                              "Unknown image file format")
    assert not any(internal in message for internal in ("{{", "[[", "node", "Graph execution"))
    assert statuses(store) == ["FAILED"]


# ---- data=tfds ----------------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def prepared(tf_devices, tmp_path_factory):
    """tiny_images prepared by TFDS itself (tests/tiny_tfds), once; each test damages its own copy."""
    from tiny_tfds.tiny_images import TinyImages

    folder = tmp_path_factory.mktemp("tensorflow_datasets")
    TinyImages(data_dir=str(folder)).download_and_prepare()
    return folder


@pytest.fixture
def data_dir(prepared, tmp_path):
    """A fresh copy of the prepared data_dir, and its version folder (dataset_info.json, features.json, records)."""
    copy = tmp_path / "tensorflow_datasets"
    shutil.copytree(prepared, copy)
    return copy, copy / "tiny_images" / "1.0.0"


@pytest.mark.parametrize("damage", ["truncated", "not an object"])
@pytest.mark.parametrize("name", ["dataset_info.json", "features.json"])
def test_a_truncated_tfds_description_is_one_line_naming_the_file(data_dir, name, damage):
    root, version = data_dir
    text = (version / name).read_text()
    (version / name).write_text(text[: len(text) // 2] if damage == "truncated" else "[]")
    with pytest.raises(ConfigError) as err:
        validate(compose(*TFDS, f"data.data_dir={root}"))
    one_line_naming(err.value, f"{version / name} cannot be read as JSON", "tfds build tiny_images")


def test_a_missing_tfds_features_file_is_named(data_dir):
    """Without features.json the image feature was said to be missing from 'the description'."""
    root, version = data_dir
    (version / "features.json").unlink()
    with pytest.raises(ConfigError) as err:
        validate(compose(*TFDS, f"data.data_dir={root}"))
    one_line_naming(err.value, f"{version / 'features.json'} is not there", "tfds build tiny_images")


@pytest.mark.parametrize("damage", ["removed", "random bytes"])
def test_tfds_record_files_missing_or_not_records_are_refused_before_the_run_opens(data_dir, store, damage):
    """The description is there, the records are not (or are garbage): one line naming a file, before any run."""
    root, version = data_dir
    records = sorted(version.glob("tiny_images-*.tfrecord-*"))
    assert records
    for path in records:
        path.unlink() if damage == "removed" else path.write_bytes(os.urandom(256))
    with pytest.raises(ConfigError) as err:
        run(compose(*SHORT, *TFDS, f"data.data_dir={root}", f"mlflow.tracking_uri={store}"))
    said = "is not there" if damage == "removed" else "is not a TFRecord file"
    one_line_naming(err.value, str(version / "tiny_images-train.tfrecord-00000-of-00001"), said)
    assert statuses(store) == []


# ---- a user's model ------------------------------------------------------------------------------------------------

def test_pretrained_weights_are_refused_by_one_rule_for_a_users_target_and_keras_app(tf_devices, tmp_path):
    """A user's YAML naming a keras.applications constructor with `weights: imagenet` would download them when the
    model is built (and fail offline, after the run opened): refused at validation, by keras_app's own rule."""
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "mobilenet.yaml").write_text(
        "_target_: keras.applications.MobileNetV2\nname: mobilenet\nweights: imagenet\nalpha: 0.35\n")
    small = ["data=synthetic", "data.shape=[32,32,3]"]
    with pytest.raises(ConfigError) as users:
        validate(compose(f"hydra.searchpath=[file://{tmp_path}]", "model=mobilenet", *small))
    with pytest.raises(ConfigError) as apps:
        validate(compose("model=keras_app", "+model.options.weights=imagenet", *small))
    rule = one_line_naming(users.value, "model.weights='imagenet' is not allowed", "never downloaded")
    assert one_line_naming(apps.value, "model.options.weights='imagenet'").split(" is not allowed")[1] == \
        rule.split(" is not allowed")[1]
    validate(compose(f"hydra.searchpath=[file://{tmp_path}]", "model=mobilenet", "model.weights=null", *small))
    (tmp_path / "model" / "mobilenet.yaml").write_text(  # no weights key: not Keras' default ("imagenet") either
        "_target_: keras.applications.MobileNetV2\nname: mobilenet\nalpha: 0.35\n")
    assert validate(compose(f"hydra.searchpath=[file://{tmp_path}]", "model=mobilenet", *small)).model.kwargs[
        "weights"] is None


def test_a_target_returning_something_else_than_a_model_ends_the_run_failed_in_one_line(tf_devices, store):
    with pytest.raises(ConfigError) as err:
        run(compose(*SHORT, f"+model._target_={__name__}.not_a_model", "model.name=not_a_model",
                    f"mlflow.tracking_uri={store}"))
    one_line_naming(err.value, f"_target_ {__name__}.not_a_model returned {{'classes': 10, ", "(a dict)",
                    "not a keras.Model")
    assert statuses(store) == ["FAILED"]


def test_a_model_without_trainable_weights_is_one_line_in_a_run_and_in_a_spec_sheets_prediction(tf_devices, store,
                                                                                                  tmp_path):
    """Was a traceback from each strategy's update ("not enough values to unpack", an AttributeError), and a
    prediction (2,296,892 images/s) of a model no run trains."""
    with pytest.raises(ConfigError) as err:
        run(compose(*SHORT, f"+model._target_={__name__}.frozen", f"mlflow.tracking_uri={store}"))
    one_line_naming(err.value, f"model=frozen: _target_ {__name__}.frozen returned a model without trainable weights",
                    "(2 weights, none trainable)")
    assert statuses(store) == ["FAILED"]
    proc = run_cli("predict", "hardware=dgx1_p100", "gpus=8", "strategy=mirrored", f"+model._target_={__name__}.frozen",
                   cwd=tmp_path, env={"PYTHONPATH": os.path.dirname(__file__)})
    # one combination: its refusal is the command's one error line (97c51ef), as a run's is; no rate printed
    (said,) = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert proc.returncode == 2 and said.startswith("error: model=frozen: ") and "images/s" not in proc.stdout


# ---- overrides ------------------------------------------------------------------------------------------------------

def test_runner_predict_with_an_override_of_the_wrong_type_is_the_runs_one_line_before_calibrating(tmp_path):
    """`runner predict` says what `python -m runner` says of the same override (one line, exit 2), calibrating
    nothing, instead of a table of one row that was not predicted."""
    overrides = ["debug=smoke", "strategy=mirrored", "gpus=abc"]
    with pytest.raises(HydraException) as err:
        compose(*overrides)
    proc = run_cli("predict", "-m", *overrides, cwd=tmp_path, env={"RUNNER_CACHE_DIR": str(tmp_path / "cache")})
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stderr.strip().splitlines() == [f"error: {explain(err.value)}"] and proc.stdout == ""
    assert "gpus must be an integer from 0 to" in proc.stderr and not (tmp_path / "cache").exists()


def test_runner_predict_raises_an_override_hydra_cannot_compose_for_the_dispatcher_to_report():
    from runner.cli import predict

    with pytest.raises(HydraException) as err:
        predict.main(["-m", "debug=smoke", "strategy=mirrored", "train.steps=many"])
    assert explain(err.value).startswith("Error merging override train.steps=many: Value 'many'")


def test_a_negative_sweep_only_top_is_refused_before_the_sweep_opens_anything(tmp_path, monkeypatch):
    """The multirun's start (SweepCallback) checks the sweep.* rules before it opens the store, the parent run or
    predicts anything: `sweep.only_top=-1` used to run 0 of the combinations and exit 0."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    from runner.config import CONF_DIR
    from runner.sweep import SweepAborted, SweepCallback

    monkeypatch.chdir(tmp_path)
    db = tmp_path / "mlflow.db"
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = hydra_compose("config", ["debug=smoke", "sweep.only_top=-1", "train.probe_peak=false",
                                       f"mlflow.tracking_uri=sqlite:///{db}"], return_hydra_config=True)
    with pytest.raises(SweepAborted) as err:
        SweepCallback().on_multirun_start(cfg)
    assert isinstance(err.value.error, ConfigError)
    one_line_naming(err.value.error, "sweep.only_top=-1 is not allowed; expected 0 (every combination)")
    assert not db.exists() and list(tmp_path.iterdir()) == []


# ---- TensorFlow's errors in one line ------------------------------------------------------------------------------

def test_a_tensorflow_error_in_one_line_is_its_own_message_without_graph_internals(tf_devices, tmp_path):
    """Real tf.errors texts: an eager op's (`{{function_node __wrapped__SaveV2_...}} ... [Op:SaveV2]`, what a
    checkpoint on a full disk raises) and a compiled function's ("Graph execution error:", the node's preamble and
    `[[{{node ...}}]]`); a text without them (Hydra's, with a value holding `[[`) is kept as it was."""
    tf = tf_devices
    (tmp_path / "afile").write_text("a file, where the checkpoint wants a folder\n")
    with pytest.raises(tf.errors.OpError) as saved:
        tf.raw_ops.SaveV2(prefix=str(tmp_path / "afile" / "ckpt"), tensor_names=["v"], shape_and_slices=[""],
                          tensors=[tf.constant(1.0)])
    assert str(saved.value).startswith("{{function_node __wrapped__SaveV2") and "[Op:SaveV2]" in str(saved.value)
    assert one_line(saved.value).startswith(f"{tmp_path / 'afile' / 'ckpt'}.data-00000-of-00001")
    assert one_line(saved.value).endswith("; Not a directory")

    @tf.function
    def decode(encoded):
        return tf.io.decode_image(encoded)

    with pytest.raises(tf.errors.InvalidArgumentError) as decoded:
        decode(tf.constant(b"not an image"))
    assert str(decoded.value).startswith("Graph execution error:")
    assert one_line(decoded.value).startswith("Unknown image file format. One of JPEG")
    assert not any(internal in one_line(decoded.value) for internal in ("{{", "[[", "[Op:", "node"))
    hydra = "Error merging override x=[[1,2],[3,4]]"
    assert one_line(ValueError(hydra)) == hydra
