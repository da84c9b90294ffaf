"""data=tfds: a TensorFlow Datasets dataset prepared locally (tests/tiny_tfds, generated, no download) gives the spec
without TensorFlow, trains through the runner's pipelines, and an unprepared one is one line naming how to prepare it."""

from __future__ import annotations

import mlflow
import pytest
from conftest import compose

from runner.config import ConfigError, validate
from runner.data_pipelines import Spec
from runner.experiment import run

SHORT = ["debug=smoke", "train.steps=4", "train.steps_per_call=2", "train.warmup_calls=1", "train.probe_peak=false",
         "train.checkpoint_every=0", "mlflow.system_metrics_interval=0", "model=cnn"]


def describe_prepared(root) -> str:
    """Only the description a prepared tiny_images leaves in its data_dir (dataset_info.json, features.json), as TFDS
    writes it, and its record files, each one empty record: what validation reads (the records' first headers),
    without TensorFlow. Returns the data_dir."""
    import json
    import struct

    from runner.data_pipelines.records import masked_crc32c

    folder = root / "tiny_images" / "1.0.0"
    folder.mkdir(parents=True)
    splits = [{"name": n, "shardLengths": [str(k)], "filepathTemplate": "{DATASET}-{SPLIT}.{FILEFORMAT}-{SHARD_X_OF_Y}"}
              for n, k in (("train", 300), ("test", 60))]
    (folder / "dataset_info.json").write_text(json.dumps({"fileFormat": "tfrecord", "name": "tiny_images",
                                                          "splits": splits, "version": "1.0.0"}))
    image = {"image": {"dtype": "uint8", "shape": {"dimensions": ["20", "24", "3"]}}}
    label = {"classLabel": {"numClasses": "5"}}
    (folder / "features.json").write_text(json.dumps({"featuresDict": {"features": {"image": image, "label": label}}}))
    length = struct.pack("<Q", 0)  # a record of no bytes, framed as TFRecord files frame one
    record = length + struct.pack("<I", masked_crc32c(length)) + struct.pack("<I", masked_crc32c(b""))
    for split in ("train", "test"):
        (folder / f"tiny_images-{split}.tfrecord-00000-of-00001").write_bytes(record)
    return str(root)


def test_the_description_written_here_is_what_tfds_writes(data_dir, tmp_path):
    """describe_prepared (what the no-TensorFlow config tests validate against) gives the real dataset's plan."""
    real = validate(compose("data=tfds", "data.dataset=tiny_images", f"data.data_dir={data_dir}"))
    written = validate(compose("data=tfds", "data.dataset=tiny_images", f"data.data_dir={describe_prepared(tmp_path)}"))
    assert (real.spec, real.data.train_examples()) == (written.spec, written.data.train_examples())


@pytest.fixture(scope="module")
def data_dir(tf_devices, tmp_path_factory) -> str:
    """tiny_images prepared by TFDS itself into a fresh data_dir."""
    from tiny_tfds.tiny_images import TinyImages

    folder = tmp_path_factory.mktemp("tensorflow_datasets")
    TinyImages(data_dir=str(folder)).download_and_prepare()
    return str(folder)


def test_the_spec_and_sizes_come_from_the_prepared_description(data_dir):
    plan = validate(compose("data=tfds", "data.dataset=tiny_images", f"data.data_dir={data_dir}"))
    assert plan.spec == Spec((20, 24, 3), 5)
    data = plan.data.load(0)
    assert (data.train_size, data.test_size) == (300, 60)
    resized = validate(compose("data=tfds", "data.dataset=tiny_images:1.0.0", f"data.data_dir={data_dir}",
                               "data.shape=[32,32,3]"))
    assert resized.spec == Spec((32, 32, 3), 5)


@pytest.mark.parametrize("pipeline", ["per_tower", "sharded"])
def test_a_prepared_dataset_trains_on_two_devices(data_dir, store, pipeline):
    result = run(compose(*SHORT, "data=tfds", "data.dataset=tiny_images", f"data.data_dir={data_dir}",
                         "strategy=replicated", "gpus=2", f"pipeline={pipeline}", f"mlflow.tracking_uri={store}"))
    row = mlflow.MlflowClient(store).get_run(result["run_id"])
    assert row.info.status == "FINISHED" and row.data.params["data.dataset"] == "tiny_images"
    assert 0 <= result["test_accuracy"] <= 1


@pytest.mark.parametrize("overrides,words", [
    (["data.dataset=cifar10"], ["data.dataset=cifar10 is not prepared", "never downloads", "tfds build cifar10"]),
    (["data.dataset=tiny_images:9.9.9"], ["tiny_images/9.9.9/dataset_info.json"]),
    (["data.dataset=tiny_images", "data.image_key=picture"], ["no image feature 'picture'", "image, label"]),
    (["data.dataset=tiny_images", "data.shape=[32,32,1]"], ["1 channels, tiny_images's images 3"]),
    (["data.dataset=tiny_images", "data.test_split=validation"], ["no split 'validation'", "train, test"]),
])
def test_what_cannot_be_read_is_one_line(data_dir, overrides, words):
    with pytest.raises(ConfigError) as err:
        validate(compose("data=tfds", f"data.data_dir={data_dir}", *overrides))
    for word in words:
        assert word in str(err.value)


@pytest.mark.parametrize("damage,words", [
    (lambda folder: _edit(folder / "dataset_info.json", lambda d: d["splits"][0].pop("shardLengths")),
     ["description in", "lacks or garbles 'shardLengths'", "tfds build tiny_images"]),
    (lambda folder: _edit(folder / "features.json", lambda d: d["featuresDict"]["features"]["label"]["classLabel"].pop(
        "numClasses")), ["lacks or garbles 'numClasses'"]),
    (lambda folder: (folder / "tiny_images-test.tfrecord-00000-of-00001").write_bytes(b""),
     ["data.dataset=tiny_images's 'test' split holds no records"]),
])
def test_a_damaged_description_or_an_empty_split_is_one_line(tmp_path, damage, words):
    """Was a KeyError's traceback, and a run on an empty test split that ended FINISHED with no test scores."""
    data_dir = describe_prepared(tmp_path)
    damage(tmp_path / "tiny_images" / "1.0.0")
    with pytest.raises(ConfigError) as err:
        validate(compose("data=tfds", f"data.data_dir={data_dir}", "data.dataset=tiny_images"))
    assert "\n" not in str(err.value) and all(word in str(err.value) for word in words), err.value


def _edit(path, change):
    """Change the JSON file at `path` in place."""
    import json

    found = json.loads(path.read_text())
    change(found)
    path.write_text(json.dumps(found))
