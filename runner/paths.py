"""Folders: where the runner caches what it fetches or measures once per machine (verified MNIST, the matmul peak),
and whether a folder it must write can be written (checked before a run starts, so it fails in one line)."""

from __future__ import annotations

import os
from pathlib import Path


def cache_dir(kind: str = "") -> Path:
    """`$RUNNER_CACHE_DIR` if set (everything in that one folder), else `$XDG_CACHE_HOME/runner/<kind>`, else
    `~/.cache/runner/<kind>`. Empty variables count as unset."""
    explicit = os.environ.get("RUNNER_CACHE_DIR")
    if explicit:
        return Path(explicit).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    return base / "runner" / kind if kind else base / "runner"


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
