"""data=files: a user's own images as memory-mapped .npy arrays or as TFRecord shards of encoded images, read through
every pipeline (sharded by file), and the one-line errors of a folder that is not what it should be."""

from __future__ import annotations

from pathlib import Path

import mlflow
import numpy as np
import pytest
from conftest import compose, run_cli

from runner.config import ConfigError, validate
from runner.data_pipelines import DataError, Spec
from runner.experiment import run

SHORT = ["debug=smoke", "train.steps=4", "train.steps_per_call=2", "train.warmup_calls=1", "train.probe_peak=false",
         "train.checkpoint_every=0", "mlflow.system_metrics_interval=0", "model=cnn"]


def write_npy(folder, shape=(20, 24, 3), dtype=np.uint8, classes=7, sizes=(600, 100)):
    """x_train.npy, y_train.npy, x_test.npy, y_test.npy of random images and labels."""
    rng = np.random.default_rng(0)
    folder.mkdir(parents=True, exist_ok=True)
    for split, n in zip(("train", "test"), sizes):
        x = rng.integers(0, 256, (n, *shape)).astype(dtype) / (255 if dtype == np.float32 else 1)
        np.save(folder / f"x_{split}.npy", x.astype(dtype))
        np.save(folder / f"y_{split}.npy", rng.integers(0, classes, n))
    return folder


def _replace(folder, **arrays):
    """`folder` with some of its .npy files replaced by `arrays` (name: array)."""
    for name, x in arrays.items():
        np.save(folder / f"{name}.npy", x)
    return folder


def _write(path, data):
    """`path` replaced by `data` (bytes, or a Path to link to); its folder."""
    path.unlink()
    path.symlink_to(data) if isinstance(data, Path) else path.write_bytes(data)
    return path.parent


def _npz(path):
    """An .npz archive saved under `path` (np.savez would add .npz to the name); its folder."""
    with open(path, "wb") as f:
        np.savez(f, y=np.zeros(600))
    return path.parent


def _with_nan():
    """Float training images with one NaN pixel."""
    x = np.zeros((600, 20, 24, 3), np.float32)
    x[3, 0, 0, 0] = np.nan
    return x


def write_shards(tf, folder, files=4, per_file=24, size=(36, 30, 3), test_label=None):
    """TFRecord shards train-0000k-of-0000N and validation-*: PNG images of `size`, every record of file k
    labelled k + 1 (ImageNet's convention counts from 1), so a batch's labels say which files it came from; or every
    validation record `test_label`."""
    rng = np.random.default_rng(0)
    folder.mkdir(parents=True, exist_ok=True)
    for split, n in (("train", files), ("validation", 2)):
        for k in range(n):
            with tf.io.TFRecordWriter(str(folder / f"{split}-{k:05d}-of-{n:05d}")) as writer:
                for _ in range(per_file):
                    png = tf.io.encode_png(rng.integers(0, 256, size, dtype=np.uint8)).numpy()
                    writer.write(tf.train.Example(features=tf.train.Features(feature={
                        "image/encoded": tf.train.Feature(bytes_list=tf.train.BytesList(value=[png])),
                        "image/class/label": tf.train.Feature(int64_list=tf.train.Int64List(
                            value=[test_label if split == "validation" and test_label is not None else k + 1])),
                    })).SerializeToString())
    return folder


def test_npy_arrays_give_the_spec_from_their_headers_and_stay_on_disk(tmp_path):
    folder = write_npy(tmp_path / "ds")
    plan = validate(compose("data=files", f"data.path={folder}", "data.train_limit=500"))
    assert plan.spec == Spec((20, 24, 3), 7, "uint8")  # no data.shape or data.classes given
    data = plan.data.load(0)
    assert isinstance(data.x_train, np.memmap) and data.train_size == 500 and data.test_size == 100
    floats = validate(compose("data=files", f"data.path={write_npy(tmp_path / 'f', (9, 9), np.float32)}"))
    assert floats.spec == Spec((9, 9, 1), 7, "float32")


def test_labels_shaped_n_by_1_as_keras_datasets_gives_them_train(tf_devices, tmp_path, store):
    folder = write_npy(tmp_path / "ds", sizes=(256, 64))
    for split in ("train", "test"):
        np.save(folder / f"y_{split}.npy", np.load(folder / f"y_{split}.npy").reshape(-1, 1))  # CIFAR's (n, 1)
    result = run(compose(*SHORT, "data=files", f"data.path={folder}", f"mlflow.tracking_uri={store}"))
    assert 0 <= result["test_accuracy"] <= 1


@pytest.mark.parametrize("pipeline", ["split", "sharded"])
def test_npy_arrays_train_on_two_devices(tf_devices, tmp_path, store, pipeline):
    folder = write_npy(tmp_path / "ds")
    result = run(compose(*SHORT, "data=files", f"data.path={folder}", "strategy=replicated", "gpus=2",
                         f"pipeline={pipeline}", f"mlflow.tracking_uri={store}"))
    row = mlflow.MlflowClient(store).get_run(result["run_id"])
    assert row.info.status == "FINISHED" and result["test_accuracy"] >= 0
    assert [i.dataset.name for i in row.inputs.dataset_inputs] == ["files", "files"]


def test_tfrecord_shards_are_counted_from_their_headers(tf_devices, tmp_path):
    from runner.data_pipelines.records import count_records

    folder = write_shards(tf_devices, tmp_path / "ds", files=3, per_file=5)
    assert [count_records(str(p)) for p in sorted(folder.glob("train-*"))] == [5, 5, 5]
    broken = folder / "train-00000-of-00003"
    broken.write_bytes(broken.read_bytes()[:-10])
    with pytest.raises(DataError, match="is not a whole TFRecord file"):
        count_records(str(broken))


def test_the_sharded_pipeline_gives_each_tower_its_own_files(tf_devices, tmp_path):
    """Shard i of 2 reads files i, i + 2 only (their labels say so); together every record once, decoded and
    resized to the spec, labels less the offset."""
    folder = write_shards(tf_devices, tmp_path / "ds", files=4, per_file=6)
    plan = validate(compose("data=files", f"data.path={folder}", "data.shape=[32,32,3]", "data.classes=4",
                            "data.label_offset=1", "pipeline=sharded"))
    examples = plan.data.load(0).train()
    seen = []
    for i in range(2):
        x, y = next(iter(examples.shard(2, i).batched(12, plan.pipeline)))  # one pass: 2 files x 6 records
        assert x.shape == (12, 32, 32, 3) and float(np.max(x)) <= 1.0
        seen.append(set(y.numpy().tolist()))
    assert seen == [{0, 2}, {1, 3}]


def test_shuffled_record_shards_stay_disjoint_and_a_limit_keeps_its_records(tf_devices, tmp_path):
    """Fewer files than towers: the shards split the records, each shuffling with its own seed, and still read every
    record once an epoch together; a limit keeps the same records every epoch (each image is its identity)."""
    from runner.data_pipelines.sharded import shard

    folder = write_shards(tf_devices, tmp_path / "ds", files=3, per_file=8)
    plan = validate(compose("data=files", f"data.path={folder}", "data.shape=[36,30,3]", "data.classes=4",
                            "data.label_offset=1", "pipeline=sharded", "pipeline.shuffle_buffer=8"))
    examples = plan.data.load(0).train()

    def images(batch):  # the batch's images, each as its bytes
        return [x.tobytes() for x in batch[0].numpy()]

    epoch = [images(next(iter(shard(examples, i, 4, 6, plan.pipeline, seed=0)))) for i in range(4)]  # 24 / 4
    assert len({x for part in epoch for x in part}) == 24  # 4 x 6 records, none twice, none left out
    limited = validate(compose("data=files", f"data.path={folder}", "data.shape=[36,30,3]", "data.classes=4",
                               "data.label_offset=1", "data.train_limit=8")).data.load(0).train()
    it = iter(limited.shuffled(8, 0).batched(8, plan.pipeline))
    kept = [set(images(next(it))) for _ in range(4)]  # 4 epochs of the 8 kept records
    assert len(kept[0]) == 8 and all(k == kept[0] for k in kept)


def test_tfrecord_shards_train_under_the_sharded_pipeline(tf_devices, tmp_path, store):
    folder = write_shards(tf_devices, tmp_path / "ds")
    result = run(compose(*SHORT, "data=files", f"data.path={folder}", "data.shape=[32,32,3]", "data.classes=4",
                         "data.label_offset=1", "strategy=replicated", "gpus=2", "pipeline=sharded",
                         f"mlflow.tracking_uri={store}"))
    assert mlflow.MlflowClient(store).get_run(result["run_id"]).info.status == "FINISHED"
    assert result["test_accuracy"] >= 0


def test_a_tfrecord_label_outside_the_classes_stops_training_in_one_line(tf_devices, tmp_path, store):
    folder = write_shards(tf_devices, tmp_path / "ds")
    with pytest.raises(DataError, match="label 4 after data.label_offset, outside 0 to data.classes - 1"):
        run(compose(*SHORT, "data=files", f"data.path={folder}", "data.shape=[32,32,3]", "data.classes=4",
                    f"mlflow.tracking_uri={store}"))  # labels 1..4 without the offset


def test_a_label_below_zero_is_named_with_its_sign(tf_devices, tmp_path, store):
    """records.refused read TensorFlow's "[label out of range] [-1]" as label 1: the minus was taken for a separator."""
    folder = write_shards(tf_devices, tmp_path / "ds")
    with pytest.raises(DataError, match="label -1 after data.label_offset, outside 0 to data.classes - 1"):
        run(compose(*SHORT, "data=files", f"data.path={folder}", "data.shape=[32,32,3]", "data.classes=4",
                    "data.label_offset=2", f"mlflow.tracking_uri={store}"))  # labels 1..4 become -1..2


def test_integer_labels_of_two_integer_types_are_class_ids_alike(tmp_path):
    """y_train int64 and y_test uint8 are both class ids: they were refused as 'store both splits alike'."""
    folder = _replace(write_npy(tmp_path / "ds"), y_test=np.arange(100, dtype=np.uint8) % 7)
    spec = validate(compose("data=files", f"data.path={folder}")).spec
    assert spec.target == "class" and spec.classes == 7


def test_training_labels_of_one_class_are_said_in_a_warning(tmp_path, caplog):
    """Labels all 3 train a classifier that always answers 3 and scores 100% on a test split of 3s: said."""
    folder = _replace(write_npy(tmp_path / "ds"), y_train=np.full(600, 3), y_test=np.full(100, 3))
    validate(compose("data=files", f"data.path={folder}")).data.load(0)
    assert caplog.text.count(f"{folder}/y_train.npy holds one class (3) only") == 1
    caplog.clear()
    validate(compose("data=files", f"data.path={write_npy(tmp_path / 'many')}")).data.load(0)
    assert "holds one class" not in caplog.text


@pytest.mark.parametrize("layout", ["tfrecord", "criteo_tsv"])
def test_sharded_data_fewer_than_the_towers_is_one_line_once_counted(tf_devices, tmp_path, store, layout):
    """Validation cannot count a TFRecord's records or a TSV's lines without reading them all; once loaded, one
    example for two towers is refused as npy arrays are (an OutOfRangeError traceback, or 'Integer division by zero'
    said of a file that was fine)."""
    if layout == "tfrecord":
        args = ["data.shape=[16,16,3]", "data.classes=3"]
        folder = write_shards(tf_devices, tmp_path / "ds", files=1, per_file=1)
    else:
        args = ["model=dlrm", "data.vocabulary_sizes=[10,10]"]
        folder = tmp_path / "ds"
        folder.mkdir()
        for split in ("train", "test"):
            (folder / f"{split}.tsv").write_text("\t".join(["1", *map(str, range(13)), "4", "5"]) + "\n")
    with pytest.raises(ConfigError, match="pipeline=sharded splits the 1 training examples into 2 shards"):
        run(compose(*SHORT, "data=files", f"data.path={folder}", *args, "strategy=replicated", "gpus=2",
                    "pipeline=sharded", f"mlflow.tracking_uri={store}"))
    assert mlflow.MlflowClient(store).search_runs(["1"])[0].info.status == "FAILED"


def test_records_that_are_not_examples_stop_training_in_one_line(tf_devices, tmp_path, store):
    """TFRecord files of random bytes: TensorFlow's error naming the record was not text, and the run ended in a
    UnicodeDecodeError's traceback."""
    folder = tmp_path / "raw"
    folder.mkdir()
    rng = np.random.default_rng(0)
    for split in ("train", "validation"):
        with tf_devices.io.TFRecordWriter(str(folder / f"{split}-00000-of-00001")) as writer:
            for _ in range(16):
                writer.write(rng.integers(0, 256, 64, dtype=np.uint8).tobytes())
    with pytest.raises(DataError, match=r"a record of .* cannot be parsed as a tf.train.Example"):
        run(compose(*SHORT, "data=files", f"data.path={folder}", "data.format=tfrecord", "data.shape=[8,8,3]",
                    "data.classes=3", f"mlflow.tracking_uri={store}"))
    assert mlflow.MlflowClient(store).search_runs(["1"])[0].info.status == "FAILED"


def test_a_test_label_outside_the_classes_stops_evaluation_in_one_line(tf_devices, tmp_path, store):
    folder = write_shards(tf_devices, tmp_path / "ds", test_label=9)
    with pytest.raises(DataError, match="label 8 after data.label_offset, outside 0 to data.classes - 1"):
        run(compose(*SHORT, "data=files", f"data.path={folder}", "data.shape=[32,32,3]", "data.classes=4",
                    "data.label_offset=1", f"mlflow.tracking_uri={store}"))  # training labels 0..3, test 8


@pytest.mark.long
@pytest.mark.parametrize("verbose", ["", "1"])
def test_a_bad_label_on_the_command_line_is_one_error_line_without_tensorflows_log(tf_devices, tmp_path, verbose):
    """Run as a user would, TensorFlow's log level untouched: its C++ INFO and WARNING lines (the file reader's, the
    failed op's) stay quiet before the one `error:` line (runtime/quiet.py); RUNNER_VERBOSE_TENSORFLOW=1 shows them."""
    folder = write_shards(tf_devices, tmp_path / "ds")
    proc = run_cli(*SHORT, "data=files", f"data.path={folder}", "data.shape=[32,32,3]", "data.classes=4", cwd=tmp_path,
                   env={"RUNNER_VERBOSE_TENSORFLOW": verbose, "TF_CPP_MIN_LOG_LEVEL": None})
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert proc.stderr.strip().splitlines()[-1].startswith("error: the data has label 4 after data.label_offset")
    tensorflows = [line for line in proc.stderr.splitlines() if "rendezvous" in line or "tf_record_dataset" in line]
    assert bool(tensorflows) == bool(verbose), tensorflows


@pytest.mark.parametrize("make,overrides,words", [
    (lambda t: t / "missing", [], ["data.path=", "is not a folder", "x_train.npy", "train-*"]),
    (lambda t: t, [], ["no train-* files", "no x_train.npy"]),
    (lambda t: write_npy(t / "ds", classes=7), ["data.classes=5"], ["labels from 0 to 6", "data.classes=5"]),
    (lambda t: write_npy(t / "ds", shape=(4, 4, 2, 2)), [], ["x_train.npy holds uint8 (600, 4, 4, 2, 2)"]),
    (lambda t: write_npy(t / "ds", sizes=(600, 100)) and (np.save(t / "ds" / "y_test.npy", np.zeros(3)) or t / "ds"),
     [], ["x_test.npy (100, 20, 24, 3) and y_test.npy (3,) do not match"]),
    (lambda t: t / "tfr", [], ["needs data.shape=[height,width,channels]", "data.classes"]),
    (lambda t: write_npy(t / "ds", classes=7) and (np.save(t / "ds" / "y_test.npy", np.full(100, 9)) or t / "ds"),
     [], ["y_test.npy has labels from 9 to 9", "y_train.npy's labels (up to 6) make 7 classes; set data.classes"]),
    (lambda t: write_npy(t / "ds") and (np.save(t / "ds" / "y_train.npy", np.full(600, 1.5 + 1j)) or t / "ds"),
     [], ["y_train.npy holds complex128 labels", "integer class labels", "or float32 (a value)"]),  # float: a regression
    (lambda t: write_npy(t / "ds"), ["data.shape=[32,32,3]"], ["data.shape=[32, 32, 3] resizes TFRecord images"]),
    # found before TensorFlow starts; each was trained on, or a traceback (a NaN pixel is a ReLU's 0: a run at chance
    # with a score; float test images beside uint8 training ones went in unscaled; float labels with data.classes a
    # regression; a 0-d y a TypeError)
    (lambda t: _replace(write_npy(t / "ds", dtype=np.float32), x_train=_with_nan()), [],
     ["x_train.npy holds nan at index (3, 0, 0, 0)", "finite values"]),
    (lambda t: _replace(write_npy(t / "ds"), y_train=np.zeros(600, np.float32), y_test=np.full(100, np.inf)), [],
     ["y_test.npy holds inf at index (0,)"]),
    # finite, but its squared error is not: the loss was infinite at step 1, said as "look for NaN or infinite values"
    # (1e19: its square fits float32, a batch's sum of them does not)
    (lambda t: _replace(write_npy(t / "ds"), y_train=np.array([1.0, -1e19] * 300, np.float32),
                        y_test=np.zeros(100, np.float32)), [],
     ["y_train.npy holds -1e+19 at index (1,)", "beyond 1.8e+16, squared errors summed over a batch overflow float32",
      "y / np.abs(y).max()"]),
    (lambda t: _replace(write_npy(t / "ds", dtype=np.float32), x_test=np.zeros((100, 20, 24, 3), np.uint8)), [],
     ["x_test.npy uint8", "x_train.npy float32", "store both splits alike", "uint8 images are scaled"]),
    (lambda t: _replace(write_npy(t / "ds"), y_test=np.zeros(100, np.float32)), [],  # was said of uint8 images
     ["y_test.npy float32", "y_train.npy int64", "integer labels are class ids, float ones values"]),
    (lambda t: _replace(write_npy(t / "ds"), y_train=np.zeros(600), y_test=np.zeros(100)), ["data.classes=7"],
     ["data.classes=7 counts a classifier's classes", "y_train.npy holds float64 values, a regression"]),
    (lambda t: _replace(write_npy(t / "ds"), y_train=np.array(1)), [], ["y_train.npy holds no examples (int64 ())"]),
    (lambda t: _replace(write_npy(t / "ds"), y_train=np.full(600, 2**33)), [],  # was "global_batch_size=... GiB"
     ["y_train.npy has labels up to 8,589,934,592: 8,589,934,593 classes", "0 to n - 1"]),
    (lambda t: write_npy(t / "ds") and (np.save(t / "ds" / "x_train.npy", np.asfortranarray(
        np.zeros((600, 20, 24, 3), np.uint8))) or t / "ds"), [], ["x_train.npy is stored in Fortran order"]),
    # big-endian images trained as byte-swapped garbage (accuracy 0.44 for 0.98); an empty file, a CSV and an .npz
    # ended in EOFError, "pickled data ... allow_pickle", AttributeError; token ids (n, 0) in a ValueError of min()
    (lambda t: _replace(write_npy(t / "ds", dtype=np.float32), x_train=np.zeros((600, 20, 24, 3), ">f4")), [],
     ["x_train.npy holds >f4 values, in the other byte order than this machine's", "newbyteorder"]),
    (lambda t: _write(write_npy(t / "ds") / "y_test.npy", b""), [],
     ["y_test.npy is not a .npy file: it is empty"]),
    (lambda t: _write(write_npy(t / "ds") / "x_train.npy", b"1,2,3\n"), [],
     ["x_train.npy is not a .npy file: it has no numpy header"]),
    (lambda t: _npz(write_npy(t / "ds") / "y_train.npy"), [],
     ["y_train.npy is not a .npy file", "an .npz archive holds several arrays"]),
    (lambda t: _write(write_npy(t / "ds") / "y_test.npy", Path("/proc/self/mem")), [],  # reading it: EIO
     ["y_test.npy cannot be read: Input/output error"]),
    (lambda t: _replace(write_npy(t / "ds"), x_train=np.zeros((600, 0), np.int32)), [],
     ["x_train.npy holds no examples (int32 (600, 0))"]),
])
def test_a_folder_that_is_not_a_dataset_is_one_line(tf_devices, tmp_path, make, overrides, words):
    write_shards(tf_devices, tmp_path / "tfr", files=1, per_file=1)
    with pytest.raises(ConfigError) as err:
        validate(compose("data=files", f"data.path={make(tmp_path)}", *overrides))
    assert "\n" not in str(err.value)
    for word in words:
        assert word in str(err.value)


@pytest.mark.slow  # writes a 4.7 GiB dataset, then one fresh run over it (~1 min)
def test_a_dataset_three_times_the_runs_peak_memory_trains(tmp_path):
    """Memory-mapped .npy images larger than the run's whole peak RSS: nothing reads them whole (training gathers
    its batches from disk, the digest reads the first MiB)."""
    from conftest import run_cli, runs

    folder, n, shape = tmp_path / "big", 400_000, (64, 64, 3)
    folder.mkdir()
    pattern = (np.arange(np.prod(shape)) % 251).astype(np.uint8).reshape(shape)  # cheap, not all zeros
    chunk = np.broadcast_to(pattern, (20_000, *shape)).tobytes()
    with open(folder / "x_train.npy", "wb") as f:  # written, not mapped: a child inherits its parent's peak RSS
        np.lib.format.write_array_header_1_0(f, {"descr": "|u1", "fortran_order": False, "shape": (n, *shape)})
        for _ in range(n // 20_000):
            f.write(chunk)
    np.save(folder / "y_train.npy", np.arange(n) % 10)
    np.save(folder / "x_test.npy", np.broadcast_to(pattern, (500, *shape)))
    np.save(folder / "y_test.npy", np.arange(500) % 10)
    size = (folder / "x_train.npy").stat().st_size
    proc = run_cli("data=files", f"data.path={folder}", "debug=smoke", "data.train_limit=null",
                   "data.test_limit=null", "train.steps=200", "strategy=replicated", "gpus=2", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    row = runs(f"sqlite:///{tmp_path / 'mlflow.db'}", "smoke").iloc[0]
    assert row["status"] == "FINISHED"
    assert size > 3 * row["metrics.peak_rss_mb"] * 2**20, (size, row["metrics.peak_rss_mb"])
