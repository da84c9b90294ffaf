"""The MLflow store: where it is, opening it in one line or one error, bounded HTTP, whole writes under Ctrl-C.

The default store is a sqlite database at an absolute path in the directory the runner was launched from (the
same `mlflow.db` that `mlflow ui` opens there), never inside Hydra's per-run output folder, so every run of every
sweep lands in one place. Artifacts go to `mlartifacts/` beside the database.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
from contextlib import AbstractContextManager, contextmanager, nullcontext
from pathlib import Path
from typing import Any, Iterator
from urllib.parse import urlparse

from runner.errors import UserError, one_line
from runner.paths import locked, unwritable
from runner.runtime.signals import HANDLED
from runner.tracking import ui
from runner.tracking.redact import redact

# MLflow's sqlite store logs every failed write with its full traceback and SQL (e.g. a full disk); the runner says
# what failed itself, in one line, and keeps the run's writes (`Run`).
logging.getLogger("mlflow.store.db.utils").setLevel(logging.CRITICAL)
# MLflow's HTTP client retries 7 times with a backoff factor of 2 and waits 120 s per request: a dead tracking
# server then stalls a run for minutes. The runner's bounds (unless the user sets them): a dead server is reported
# within about 30 s. While a run is offline each retry is a single attempt (`quick_http`).
HTTP_BOUNDS = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "2", "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1",
               "MLFLOW_HTTP_REQUEST_TIMEOUT": "10"}


def bound_http_retries() -> None:
    """Apply HTTP_BOUNDS where the user has not set their own (MLflow reads them at every request), and keep MLflow
    from printing run links, which would show credentials written into the tracking URI (the runner's are masked)."""
    for name, value in HTTP_BOUNDS.items():
        os.environ.setdefault(name, value)
    os.environ["MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT"] = "true"


@contextmanager
def quick_http() -> Iterator[None]:
    """One attempt per request, 5 s at most, while the block runs: probing a store that was down."""
    saved = {k: os.environ.get(k) for k in ("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "MLFLOW_HTTP_REQUEST_TIMEOUT")}
    os.environ.update({"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0", "MLFLOW_HTTP_REQUEST_TIMEOUT": "5"})
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def resolve_uri(configured: str | None) -> str:
    """The tracking URI: the config's, else $MLFLOW_TRACKING_URI, else sqlite:///<cwd>/mlflow.db (absolute); a
    StoreError, before anything starts, for a folder the installed MLflow will not open (`folder_refused`)."""
    uri = configured or os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{Path.cwd().resolve() / 'mlflow.db'}"
    if why := folder_refused(uri):
        raise StoreError(why)
    return uri


def folder_refused(uri: str) -> str | None:
    """Why MLflow will not open `uri`, a folder (its file store: `./mlruns`, `file:///...`), or None. Recent MLflow
    (3.17 here) refuses one unless MLFLOW_ALLOW_FILE_STORE=true, in a paragraph that would fill a run's error line,
    and only once the run had loaded its data and devices. MLflow is imported only for a folder."""
    if urlparse(uri).scheme not in ("", "file"):
        return None
    import mlflow
    from mlflow import environment_variables

    allowed = getattr(environment_variables, "MLFLOW_ALLOW_FILE_STORE", None)  # None: an MLflow that opens folders
    try:
        if allowed is None or allowed.get():
            return None
    except ValueError:  # a value MLflow does not read as a boolean
        pass
    return (f"tracking store {uri} is a folder (MLflow's file store), which MLflow {mlflow.__version__} does not "
            "open; use a database, e.g. sqlite:////abs/dir/mlflow.db (`mlflow migrate-filestore` moves a folder's "
            "runs into one), or a tracking server (http://host:5000), or set MLFLOW_ALLOW_FILE_STORE=true to keep "
            "the folder")


class StoreError(UserError):
    """The MLflow tracking store cannot be opened or written; the message names the store and why."""


_holding_interrupts = False


@contextmanager
def whole_write() -> Iterator[None]:
    """Hold back the signals that stop a run (Ctrl-C, SIGTERM, SIGUSR2, SIGHUP: runtime.signals.HANDLED) while a
    store write runs, and deliver the first as soon as the write is done, to the handler that was installed: raised
    inside SQLAlchemy between sqlite's write and its commit, it would leave that connection holding the store's lock,
    and the run's closing writes would fail and leave it RUNNING.
    Nested uses hold the signals until the outermost write ends. Only the main thread can set signal handlers;
    elsewhere this does nothing, and a signal whose handler is not Python's is left alone.
    """
    global _holding_interrupts
    handlers = {s: h for s in HANDLED if callable(h := signal.getsignal(s))}
    if _holding_interrupts or not handlers or threading.current_thread() is not threading.main_thread():
        yield
        return
    held: list[tuple[int, Any]] = []
    for s in handlers:
        signal.signal(s, lambda signum, frame: held.append((signum, frame)))
    _holding_interrupts = True
    try:
        yield
    finally:
        _holding_interrupts = False
        for s, handler in handlers.items():
            signal.signal(s, handler)
    if held:
        signum, frame = held[0]
        handlers[signum](signum, frame)  # e.g. raises KeyboardInterrupt or Terminated here, after the write


def open_store(uri: str, experiment: str, columns: tuple[str, ...] = ()) -> str:
    """`ensure_experiment` (its runs view showing `columns` too), with a store that cannot be created, opened or
    written reported as one StoreError line naming it and the fix."""
    fix = "set mlflow.tracking_uri to a store you can write, e.g. sqlite:////abs/writable/dir/mlflow.db"
    # A sqlite database that cannot be created or written, checked before MLflow opens it, which answers an
    # unwritable path with a traceback, and a read-only directory only after retrying for a long time.
    path = uri.removeprefix("sqlite:///") if uri.startswith("sqlite:///") else ""
    if path and path != ":memory:" and (problem := unwritable(Path(path), "file")):
        raise StoreError(f"tracking store {uri} cannot be used: {problem}; {fix}")
    try:
        return ensure_experiment(uri, experiment, columns)
    except StoreError:
        raise
    except Exception as e:  # noqa: BLE001 - whatever the store's failure, the user's fix is the same
        if getattr(e, "error_code", "") in ("UNAUTHENTICATED", "PERMISSION_DENIED"):
            status = "401: not authenticated" if e.error_code == "UNAUTHENTICATED" else "403: permission denied"
            raise StoreError(
                f"tracking server {redact(uri)} refused the credentials (HTTP {status}); pass them in "
                "MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD (or MLFLOW_TRACKING_TOKEN)"
            ) from None
        raise StoreError(f"tracking store {redact(uri)} cannot be opened: {one_line(e)}; {fix}") from e


def schema_lock(uri: str) -> AbstractContextManager[None]:
    """A lock beside a sqlite store, to hold while the block runs: MLflow creates a fresh store's schema on first
    use, and several processes doing so at once leave it half-migrated. Other stores need no lock."""
    sqlite = uri.startswith("sqlite:///") and not uri.endswith(":memory:")
    return locked(Path(uri.removeprefix("sqlite:///") + ".lock")) if sqlite else nullcontext()


def ensure_experiment(uri: str, name: str, columns: tuple[str, ...] = ()) -> str:
    """Create the store's schema and the experiment if missing (under `schema_lock`, so any number of processes
    may start at once on a fresh store), set up its UI with `columns` in its runs view (`ui.set_up`: the figures of
    the run about to start); return the experiment id. A StoreError if the experiment was deleted."""
    from mlflow.tracking import MlflowClient

    with schema_lock(uri):
        client = MlflowClient(uri)
        exp = client.get_experiment_by_name(name)
        if exp is None:
            # artifacts beside a sqlite database; other stores choose their own location
            beside = (Path(uri.removeprefix("sqlite:///")).parent / "mlartifacts").as_uri() \
                if uri.startswith("sqlite:///") else None
            experiment_id = client.create_experiment(name, artifact_location=beside)
            ui.set_up(client, experiment_id, {}, columns)
            return experiment_id
        if exp.lifecycle_stage == "deleted":
            raise StoreError(
                f"experiment {name!r} was deleted in {uri}; restore it (mlflow experiments restore --experiment-id "
                f"{exp.experiment_id}) or choose another mlflow.experiment"
            )
        ui.set_up(client, exp.experiment_id, exp.tags, columns)  # an experiment made before its view, or another kind
        return exp.experiment_id
