"""Where the runner caches what it fetches or measures once per machine (verified MNIST, the matmul peak)."""

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
