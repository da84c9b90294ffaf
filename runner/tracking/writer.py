"""`python -m runner.tracking.writer`: the writer process of a run (`run.WriterRun` starts it).

It reads the run's `Opening` (one JSON line), opens the run in the store, answers {"opened": run_id, ...} (or
{"error": a StoreError's line}), then makes each call that follows ({"call": "metrics", "args": [...]}) on the
journaled `Run` until "end", whose outcome it answers. Its log lines, and a journal file that cannot be written, go
back as replies (the training process logs them). It ignores Ctrl-C and SIGTERM: the training process, which gets
them, ends the run. If that process dies (SIGKILL) before "end", the run stays RUNNING, as it would have.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any, TextIO

from runner.errors import one_line
from runner.tracking.redact import redact
from runner.tracking.run import Opening
from runner.tracking.store import StoreError


class _Replies(logging.Handler):
    """Log records (and replies) as JSON lines to the training process."""

    def __init__(self, out: TextIO):
        super().__init__(logging.INFO)
        self.out = out

    def send(self, reply: dict[str, Any]) -> None:
        with self.lock:  # the system-metrics thread logs too
            self.out.write(json.dumps(reply) + "\n")
            self.out.flush()

    def emit(self, record: logging.LogRecord) -> None:
        self.send({"log": [record.levelno, record.name, record.getMessage()]})


def main() -> int:
    """Open the run the first line describes, make the calls that follow, answer each outcome; the exit status."""
    for s in (signal.SIGINT, signal.SIGTERM):
        signal.signal(s, signal.SIG_IGN)
    replies = _Replies(os.fdopen(os.dup(1), "w"))
    os.dup2(2, 1)  # anything printed goes to stderr, not into the replies
    logging.basicConfig(level=logging.INFO, handlers=[replies], force=True)
    opening = Opening(**json.loads(sys.stdin.readline()))
    try:
        opening.check()
        folder = SimpleNamespace(path=Path(opening.folder), failed=lambda e: replies.send(
            {"folder_failed": one_line(e)})) if opening.folder else None
        run = opening.run(folder)
        opening.fill(run)
    except Exception as e:  # noqa: BLE001 - one line, as the store's own errors are
        replies.send({"error": str(e) if isinstance(e, StoreError) else
                      f"the run could not be opened in {redact(opening.uri)}: {one_line(e)}"})
        return 2
    replies.send({"opened": run.run_id, "experiment_id": run.experiment_id})
    for line in sys.stdin:
        call = json.loads(line)
        if call["call"] == "end":
            try:
                run.end(*call["args"])
            except StoreError as e:
                replies.send({"error": str(e)})
                return 2
            replies.send({"ended": True})
            return 0
        getattr(run, call["call"])(*call["args"])
    return 0  # the training process ended without "end"


if __name__ == "__main__":
    os._exit(main())  # a system-metrics thread left by a run that was never ended does not hold the exit
