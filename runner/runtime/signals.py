"""Stopping a run on request: Ctrl-C (SIGINT), SIGTERM (what `timeout`, docker, Kubernetes and SLURM send), SIGUSR2
(what submitit asks SLURM to send before a job's time limit: `--signal=USR2@120`) and SIGHUP (the terminal or SSH
session closed; left alone when ignored, as under `nohup`).

Outside the training loop a signal stops the run at once: SIGINT as Python's KeyboardInterrupt, the others as
`Terminated`. Inside it, the signal is noted and the loop stops at the end of the compiled call that is running
(at most `train.steps_per_call` steps later), after its hooks have saved a checkpoint of the step reached, so a
preempted job that is started again resumes from there. Either way the MLflow run ends KILLED; the process exits
with 128 + the signal's number (130, 143, 140, 129), the shell's codes.

Every signal stays noted until it is acted on (`acted`): raised inside a `__del__` (TensorFlow frees functions in
them), Python prints the exception and drops it, and the run would go on; the loop's next call boundary and the
run's close (`raise_noted`) raise it again.
"""

from __future__ import annotations

import signal
import threading
from contextlib import contextmanager
from typing import Iterator

HANDLED = (signal.SIGINT, signal.SIGTERM, signal.SIGUSR2, signal.SIGHUP)


class Terminated(BaseException):
    """The process got SIGTERM, SIGUSR2 or SIGHUP. A BaseException, as KeyboardInterrupt: no `except Exception`
    handles it as an error."""

    def __init__(self, signum: int = signal.SIGTERM):
        super().__init__(f"stopped by {signal.Signals(signum).name}")
        self.signum = signum


def exit_code(stop: BaseException) -> int:
    """The shell's exit status for a process stopped by `stop` (KeyboardInterrupt or Terminated): 128 + signal."""
    return 128 + (stop.signum if isinstance(stop, Terminated) else signal.SIGINT)


_deferring = False  # inside the training loop: note the signal, stop at the call boundary
_noted: list[int] = []  # signals received and not yet acted on


def _raise_for(signum: int) -> None:
    if signum == signal.SIGINT:
        raise KeyboardInterrupt
    raise Terminated(signum)


def _handler(signum: int, frame: object) -> None:
    _noted.append(signum)
    if not _deferring:
        _raise_for(signum)


def install() -> None:
    """Handle the signals this way for the rest of the process (only the main thread can); an ignored SIGHUP
    (`nohup`) stays ignored."""
    if threading.current_thread() is threading.main_thread():
        for signum in HANDLED:
            if not (signum == signal.SIGHUP and signal.getsignal(signum) is signal.SIG_IGN):
                signal.signal(signum, _handler)


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
    raise_noted()


def requested() -> int | None:
    """The first signal received and not yet acted on, if any."""
    return _noted[0] if _noted else None


def acted() -> None:
    """The noted signals are being acted on (a run closed KILLED): forget them."""
    _noted.clear()


def raise_noted() -> None:
    """Raise for the first signal not yet acted on, if any (the loop calls this at a call boundary, after its hooks;
    a run before it ends FINISHED)."""
    if _noted:
        signum = _noted[0]
        acted()
        _raise_for(signum)
