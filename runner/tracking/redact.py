"""Secrets never stored: credentials in URIs are masked in everything the runner writes.

A user may write a tracking URI with its password (`https://alice:secret@mlflow.example.org`) or put a token in an
override: params, tags, the `config.yaml` artifact, Hydra's copies in the run folder, its log file and the terminal
all go through `redact`. Credentials belong in MLflow's environment variables (`MLFLOW_TRACKING_USERNAME` /
`MLFLOW_TRACKING_PASSWORD` or `MLFLOW_TRACKING_TOKEN`), which the runner never copies into a run.
"""

from __future__ import annotations

import logging
import re
from pathlib import Path

MASK = "***"
# scheme://user:password@host or scheme://token@host: keep the scheme and the host, mask the user-info.
_USERINFO = re.compile(r"([a-zA-Z][a-zA-Z0-9+.-]*://)[^/\s@'\"]+@")
# ?token=... or &password=... in a URL's query string.
_QUERY = re.compile(r"([?&](?:token|access_token|password|passwd|secret|api_key|apikey|key)=)[^&\s'\"]+",
                    re.IGNORECASE)


def redact(text: str) -> str:
    """`text` with the user-info of every URI and every secret query parameter masked."""
    return _QUERY.sub(rf"\1{MASK}", _USERINFO.sub(rf"\1{MASK}@", text))


class RedactingFilter(logging.Filter):
    """Masks secrets in every log record a handler writes (terminal and log file alike)."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if redact(message) != message:
            record.msg, record.args = redact(message), None
        return True


def redact_logs() -> None:
    """Put the filter on every handler of the root logger (Hydra's console and file handlers)."""
    for handler in logging.getLogger().handlers:
        if not any(isinstance(f, RedactingFilter) for f in handler.filters):
            handler.addFilter(RedactingFilter())


def redact_files(folder: Path) -> None:
    """Rewrite the YAML files Hydra keeps of a run (`.hydra/config.yaml`, `overrides.yaml`, `hydra.yaml`) masked."""
    for path in folder.glob(".hydra/*.yaml"):
        text = path.read_text()
        if redact(text) != text:
            path.write_text(redact(text))
