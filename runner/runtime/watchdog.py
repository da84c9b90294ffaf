"""A bounded, interruptible wait for a multi-worker job's peers.

MultiWorkerMirroredStrategy's constructor waits for every worker inside TensorFlow's C++ code, holding Python's
interpreter lock: no timeout or Ctrl-C handler can act, and TensorFlow's own SIGTERM handler swallows SIGTERM. A small
process started just before the wait watches it instead: it exits once told the cluster is up; after
`strategy.peer_timeout` seconds it prints one `error:` line naming the workers waited for, ends the job's MLflow run
FAILED and kills the stuck process; on Ctrl-C or SIGTERM it ends the run KILLED and kills the stuck process.

    [RUNNER_WATCHDOG_URI=URI] python -m runner.runtime.watchdog --pid PID --seconds S --name worker0 \
        --waiting-for "host:port, ..." [--run-id ID]
"""

from __future__ import annotations

import argparse
import os
import select
import signal
import subprocess
import sys
from contextlib import contextmanager
from typing import Iterator

from runner.runtime import is_sweep_child, signals

URI_VARIABLE = "RUNNER_WATCHDOG_URI"  # the watched run's tracking store (kept off the command line: credentials)
# What a job of a sweep (`-m strategy=multi_worker ...`) waiting for its peers is told: the sweep starts none of them.
IN_A_SWEEP = ("; a sweep job is one worker and the sweep starts no other: start the other workers of each job "
              "yourself (the same overrides, each its own strategy.task_index), or run this strategy outside a sweep")


def _end_run(uri: str | None, run_id: str | None, status: str, error: str) -> None:
    if not (uri and run_id):
        return
    from mlflow.tracking import MlflowClient

    try:
        client = MlflowClient(uri)
        client.set_tag(run_id, "error", error)
        client.set_terminated(run_id, status)
    except BaseException as e:  # noqa: BLE001 - the stuck process is killed whatever the store says (or a signal)
        print(f"the run could not be closed in its tracking store ({type(e).__name__}); the next start of this "
              "config marks it", file=sys.stderr)


def watch(args: argparse.Namespace) -> int:
    """Wait for "up" on stdin, the timeout or a signal; see the module docstring."""
    signals.install()  # a signal raises, so that the wait in `select` ends
    try:
        ready, _, _ = select.select([sys.stdin], [], [], args.seconds)
    except (KeyboardInterrupt, signals.Terminated) as stop:
        name = "SIGINT" if isinstance(stop, KeyboardInterrupt) else signal.Signals(stop.signum).name
        error = f"interrupted ({name}) while waiting for {args.waiting_for}"
        _end_run(args.uri, args.run_id, "KILLED", error)
        print(error, file=sys.stderr, flush=True)
        os.kill(args.pid, signal.SIGKILL)
        return 0
    if not ready:  # the time is up
        error = (f"{args.name} waited {args.seconds:g} s for {args.waiting_for} and gave up: start every worker of "
                 "strategy.workers (or TF_CONFIG), or raise strategy.peer_timeout") + (IN_A_SWEEP * is_sweep_child())
        print(f"error: {error}", file=sys.stderr, flush=True)
        _end_run(args.uri, args.run_id, "FAILED", error)
        os.kill(args.pid, signal.SIGKILL)
    return 0  # up, or the watched process has gone (stdin closed)


@contextmanager
def bounded_wait(seconds: float, name: str, waiting_for: str, uri: str | None, run_id: str | None) -> Iterator[None]:
    """Watch the block (`name`'s wait for `waiting_for`) from a separate process; see the module docstring."""
    command = [sys.executable, "-m", "runner.runtime.watchdog", "--pid", str(os.getpid()), "--seconds", str(seconds),
               "--name", name, "--waiting-for", waiting_for]
    env = dict(os.environ)  # the job's own: a sweep job's watchdog sees it is one (is_sweep_child)
    if uri and run_id:  # the store's URI (it may hold credentials) in the environment, not on a command line ps shows
        command += ["--run-id", run_id]
        env[URI_VARIABLE] = uri
    guard = subprocess.Popen(command, stdin=subprocess.PIPE, text=True, env=env)
    try:
        yield
    finally:
        guard.stdin.write("up\n")
        guard.stdin.close()
        guard.wait()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m runner.runtime.watchdog", description=__doc__.splitlines()[0])
    parser.add_argument("--pid", type=int, required=True, help="the process whose wait is watched")
    parser.add_argument("--seconds", type=float, required=True, help="how long the wait may last")
    parser.add_argument("--waiting-for", required=True, help="who is waited for (for the error line)")
    parser.add_argument("--name", default="this worker", help="who waits (for the error line)")
    parser.add_argument("--run-id", default=None, help=f"the watched process's MLflow run (its store: ${URI_VARIABLE})")
    args = parser.parse_args(argv)
    args.uri = os.environ.get(URI_VARIABLE)
    return watch(args)


if __name__ == "__main__":
    sys.exit(main())
