"""Folders: where the runner caches what it fetches or measures once per machine (verified MNIST, the matmul peak),
whether a folder it must write can be written (checked before a run starts, so it fails in one line), a lock file
that processes of this host take in turn, and the JSON caches' atomic reads and writes."""

from __future__ import annotations

import json
import logging
import os
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

log = logging.getLogger(__name__)


def cache_dir(kind: str = "") -> Path:
    """`$RUNNER_CACHE_DIR` if set (everything in that one folder), else `$XDG_CACHE_HOME/runner/<kind>`, else
    `~/.cache/runner/<kind>`. Empty variables count as unset."""
    explicit = os.environ.get("RUNNER_CACHE_DIR")
    if explicit:
        return Path(explicit).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    return base / "runner" / kind  # kind "": runner/ itself


def unwritable(path: Path, kind: str = "directory") -> str | None:
    """Why `path` cannot be used as a writable `kind` ("directory", or "file" for a file to create or update),
    or None. A missing path is fine when its nearest existing ancestor is a writable directory (it is created)."""
    if path.exists():
        if kind == "directory" and not path.is_dir():
            return f"{path} is a file, not a directory"
        if kind == "file" and not path.is_file():
            return f"{path} is not a file"
        if not os.access(path, os.W_OK | (os.X_OK if path.is_dir() else 0)):
            return f"{path} is not writable"
        return None
    ancestor = path.parent
    while not ancestor.exists() and ancestor != ancestor.parent:
        ancestor = ancestor.parent
    if not ancestor.is_dir():
        return f"{ancestor} is a file, not a directory"
    if not os.access(ancestor, os.W_OK | os.X_OK):
        return f"directory {ancestor} is not writable"
    return None


@contextmanager
def locked(path: Path) -> Iterator[None]:
    """Hold an exclusive lock on the file `path` (created, with its folder, if missing) while the block runs: the
    processes of this host that take it run their blocks one at a time; a process that dies lets it go."""
    import fcntl

    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def write_json(path: Path, data: object) -> None:
    """Write `data` as JSON to `path` atomically: a reader (another process polling it) sees the old file or the
    new one, never a half-written one; on failure (a full disk) the old file stays and the partial one is removed."""
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    try:
        tmp.write_text(json.dumps(data, indent=2, sort_keys=True))
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def read_cache(path: Path) -> dict:
    """A JSON cache's entries (the peak's, XLA's decisions, the cost model's calibrations); a missing or unreadable
    file is an empty cache (what it holds is measured again)."""
    try:
        data = json.loads(path.read_text())
        return data if isinstance(data, dict) else {}
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as err:
        log.warning("ignoring the unreadable cache %s: %s", path, err)
        return {}


def write_cache(path: Path, entries: dict) -> None:
    """Add `entries` (key: entry) to a JSON cache, atomically (parallel sweep jobs never see a half-written file)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    write_json(path, {**read_cache(path), **entries})
