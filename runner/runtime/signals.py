"""Stopping a run on request: Ctrl-C (SIGINT) and SIGTERM (what `timeout`, docker, Kubernetes and SLURM send).

Outside the training loop a signal stops the run at once: SIGINT as Python's KeyboardInterrupt, SIGTERM as
`Terminated`. Inside it, the signal is noted and the loop stops at the end of the compiled call that is running
(at most `train.steps_per_call` steps later), after its hooks have saved a checkpoint of the step reached, so a
preempted job that is started again resumes from there. Either way the MLflow run ends KILLED; the process exits
with 130 (SIGINT) or 143 (SIGTERM), the shell's codes for those signals.
"""

from __future__ import annotations

import signal
import threading
from contextlib import contextmanager
from typing import Iterator

EXIT_CODES = {signal.SIGINT: 130, signal.SIGTERM: 143}


class Terminated(BaseException):
    """The process got SIGTERM. A BaseException, as KeyboardInterrupt: no `except Exception` handles it as an error."""


_deferring = False  # inside the training loop: note the signal, stop at the call boundary
_pending: list[int] = []  # signals noted while deferring


def _raise_for(signum: int) -> None:
    if signum == signal.SIGINT:
        raise KeyboardInterrupt
    raise Terminated(f"stopped by {signal.Signals(signum).name}")


def _handler(signum: int, frame: object) -> None:
    if _deferring:
        _pending.append(signum)
        return
    _raise_for(signum)


def install() -> None:
    """Handle SIGTERM (and SIGINT) this way for the rest of the process; only the main thread can."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _handler)
        signal.signal(signal.SIGINT, _handler)


@contextmanager
def at_call_boundaries() -> Iterator[None]:
    """While the block runs, a signal is noted (`requested()`) instead of raised; on leaving, a noted signal that
    nobody acted on is raised."""
    global _deferring
    _deferring = True
    try:
        yield
    finally:
        _deferring = False
    if _pending:
        _raise_for(_pending[0])


def requested() -> int | None:
    """The first signal noted while deferring, if any."""
    return _pending[0] if _pending else None


def stop() -> None:
    """Raise for the noted signal now (the loop calls this at a call boundary, after its hooks)."""
    signum = _pending[0]
    _pending.clear()
    _raise_for(signum)
