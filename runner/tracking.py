"""MLflow: the store's set-up and one run's lifecycle. The loop calls it at start, per logged step, and at the end.

The default store is a sqlite database at an absolute path in the directory the runner was launched from (the
same `mlflow.db` that `mlflow ui` opens there), never inside Hydra's per-run output folder, so every run of every
sweep lands in one place. Artifacts go to `mlartifacts/` beside the database.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shlex
import signal
import socket
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator

from omegaconf import DictConfig, OmegaConf

import runner
from runner.errors import UserError
from runner.journal import NAME as JOURNAL_NAME
from runner.journal import Journal, send
from runner.redact import redact
from runner.signals import Terminated

if TYPE_CHECKING:
    from runner.config import Plan

log = logging.getLogger(__name__)
# MLflow's sqlite store logs every failed write with its full traceback and SQL (e.g. a full disk); the runner says
# what failed itself, in one line, and keeps the run's writes (`Run`).
logging.getLogger("mlflow.store.db.utils").setLevel(logging.CRITICAL)
_MAX_PARAM_LEN = 6000  # MLflow's limit on a param value
ENV_PARENT = "RUNNER_PARENT_RUN_ID"  # set for a sweep's job processes: the sweep's parent run
ENV_CHILD = "RUNNER_SWEEP_CHILD"  # "1" in the fresh process a sweep job starts
OFFLINE_RETRY_SECONDS = 30.0  # while the store cannot be written, how often to try it again
FINAL_WAIT_SECONDS = 30.0  # at the run's end, how long to keep trying a store that cannot be written
# MLflow's HTTP client retries 7 times with a backoff factor of 2 and waits 120 s per request: a dead tracking
# server then stalls a run for minutes. The runner's bounds (unless the user sets them): a dead server is reported
# within about 30 s. While a run is offline each retry is a single attempt (`quick_http`).
HTTP_BOUNDS = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "2", "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1",
               "MLFLOW_HTTP_REQUEST_TIMEOUT": "10"}


def bound_http_retries() -> None:
    """Apply HTTP_BOUNDS where the user has not set their own (MLflow reads them at every request), and keep
    MLflow from printing run links itself: they would show credentials written into the tracking URI, and the runner
    prints its own (masked) link."""
    for name, value in HTTP_BOUNDS.items():
        os.environ.setdefault(name, value)
    os.environ["MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT"] = "true"


def command_line() -> str:
    """This process's command line as typed (`python -m runner ...`), for tags."""
    return " ".join(shlex.quote(a) for a in [Path(sys.orig_argv[0]).name, *sys.orig_argv[1:]])


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


def is_sweep_child() -> bool:
    """True in the fresh process a sweep job starts."""
    return os.environ.get(ENV_CHILD) == "1"


def parent_run_id() -> str | None:
    """The sweep's parent run, inside a sweep job."""
    return os.environ.get(ENV_PARENT) or None


def resolve_uri(configured: str | None) -> str:
    """The tracking URI: the config's, else $MLFLOW_TRACKING_URI, else sqlite:///<cwd>/mlflow.db (absolute)."""
    return configured or os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{Path.cwd().resolve() / 'mlflow.db'}"


def _artifact_root(uri: str) -> str | None:
    """Artifacts beside a sqlite database; other stores choose their own location."""
    if uri.startswith("sqlite:///"):
        return (Path(uri.removeprefix("sqlite:///")).parent / "mlartifacts").as_uri()
    return None


class StoreError(UserError):
    """The MLflow tracking store cannot be opened or written; the message names the store and why."""


_holding_interrupts = False


@contextmanager
def whole_write() -> Iterator[None]:
    """Hold back Ctrl-C (SIGINT) while a store write runs, and deliver it as soon as the write is done.

    Why: a KeyboardInterrupt raised inside SQLAlchemy between sqlite's write and its commit leaves that connection
    holding the store's lock; the run's closing writes then each wait MLflow's 20 s busy timeout, fail, and the run
    stays RUNNING (reproduced by raising KeyboardInterrupt at each line of one metric write in turn). Nested uses hold the signal until the outermost write ends.
    Only the main thread can set signal handlers; elsewhere, or when SIGINT is ignored, this does nothing.
    """
    global _holding_interrupts
    deliver = signal.getsignal(signal.SIGINT)
    if _holding_interrupts or not callable(deliver) or threading.current_thread() is not threading.main_thread():
        yield
        return
    held = []
    signal.signal(signal.SIGINT, lambda signum, frame: held.append(frame))
    _holding_interrupts = True
    try:
        yield
    finally:
        _holding_interrupts = False
        signal.signal(signal.SIGINT, deliver)
    if held:
        deliver(signal.SIGINT, held[0])  # the default handler raises KeyboardInterrupt here, after the write


def _sqlite_problem(uri: str) -> str | None:
    """Why a sqlite store's database cannot be created or written, or None.

    Checked before MLflow opens it: MLflow answers an unwritable path with its own traceback, and for a read-only
    directory only after retrying for about 100 s.
    """
    from runner.paths import unwritable

    path = uri.removeprefix("sqlite:///")
    if not path or path == ":memory:":
        return None
    return unwritable(Path(path), "file")


def open_store(uri: str, experiment: str) -> str:
    """`ensure_experiment`, with an unusable store reported as one StoreError line naming it and the fix.

    Raises:
        StoreError: the store cannot be created, opened or written.
    """
    fix = "set mlflow.tracking_uri to a store you can write, e.g. sqlite:////abs/writable/dir/mlflow.db"
    problem = _sqlite_problem(uri) if uri.startswith("sqlite:///") else None
    if problem:
        raise StoreError(f"tracking store {uri} cannot be used: {problem}; {fix}")
    try:
        return ensure_experiment(uri, experiment)
    except StoreError:
        raise
    except Exception as e:  # noqa: BLE001 - whatever the store's failure, the user's fix is the same
        if getattr(e, "error_code", "") in ("UNAUTHENTICATED", "PERMISSION_DENIED"):
            status = "401: not authenticated" if e.error_code == "UNAUTHENTICATED" else "403: permission denied"
            raise StoreError(
                f"tracking server {redact(uri)} refused the credentials (HTTP {status}); pass them in "
                "MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD (or MLFLOW_TRACKING_TOKEN)"
            ) from None
        raise StoreError(f"tracking store {redact(uri)} cannot be opened: {reason(e)}; {fix}") from e


def reason(e: BaseException) -> str:
    """A store's failure in a few words: the OS error behind a failed HTTP request, else the first line."""
    import re

    text = str(e).strip()
    errno = re.search(r"\[Errno -?\d+\] [^'\")]+", text)
    database = re.search(r"\((sqlite3\.\w+|psycopg2?\.\w+|pymysql\.\w+)\) ([^\n]+)", text)
    if errno:
        return errno.group(0)
    if database:
        return f"{database.group(1)}: {database.group(2)}"
    return f"{type(e).__name__}: {(text.splitlines() or [''])[0][:300]}"


@contextmanager
def schema_lock(uri: str) -> Iterator[None]:
    """Hold a lock beside a sqlite store while the block runs: MLflow creates a fresh store's schema on first use,
    and several processes doing so at once leave it half-migrated. Other stores need no lock."""
    if not uri.startswith("sqlite:///") or uri.endswith(":memory:"):
        yield
        return
    import fcntl

    lock = Path(uri.removeprefix("sqlite:///") + ".lock")
    lock.parent.mkdir(parents=True, exist_ok=True)
    with lock.open("a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def ensure_experiment(uri: str, name: str) -> str:
    """Create the store's schema and the experiment if missing (under `schema_lock`, so any number of processes
    may start at once on a fresh store); return the experiment id.

    Raises:
        StoreError: the experiment exists but was deleted.
    """
    from mlflow.tracking import MlflowClient

    from runner import ui

    with schema_lock(uri):
        client = MlflowClient(uri)
        exp = client.get_experiment_by_name(name)
        if exp is None:
            experiment_id = client.create_experiment(name, artifact_location=_artifact_root(uri))
            ui.set_up(client, experiment_id, {})
            return experiment_id
    if exp.lifecycle_stage == "deleted":
        raise StoreError(
            f"experiment {name!r} was deleted in {uri}; restore it (mlflow experiments restore --experiment-id "
            f"{exp.experiment_id}) or choose another mlflow.experiment"
        )
    if ui.VIEW_TAG not in exp.tags:  # an experiment made before the runner set up its view, or by someone else
        ui.set_up(client, exp.experiment_id, exp.tags)
    return exp.experiment_id


def flatten(cfg: DictConfig) -> dict[str, str]:
    """The resolved config as flat `a.b.c -> value` params."""
    out: dict[str, str] = {}

    def walk(node: Any, prefix: str) -> None:
        if isinstance(node, dict):
            for k, v in node.items():
                walk(v, f"{prefix}{k}.")
        else:
            out[prefix[:-1]] = str(node)[:_MAX_PARAM_LEN]

    walk(OmegaConf.to_container(cfg, resolve=True), "")
    return {key: redact(value) for key, value in out.items()}


def _source_checkout() -> Path | None:
    """The checkout the runner is installed from in editable mode (`pip install -e`), from the install's own record
    (PEP 610 direct_url.json); None for a regular install, whose version says what ran."""
    import json
    from importlib import metadata

    try:
        direct = json.loads(metadata.distribution(runner.DISTRIBUTION).read_text("direct_url.json") or "{}")
    except (metadata.PackageNotFoundError, ValueError):
        return None
    url = direct.get("url", "")
    editable = direct.get("dir_info", {}).get("editable", False)
    return Path(url.removeprefix("file://")) if editable and url.startswith("file://") else None


def _git_commit() -> str | None:
    """The commit of the editable checkout that runs, if there is one and git can read it."""
    checkout = _source_checkout()
    if checkout is None:
        return None
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=checkout, capture_output=True, text=True, timeout=5)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def model_label(cfg: DictConfig) -> str:
    """The model and its variant, if it has variants: `mlp/tiny`, `lenet`."""
    variant = cfg.model.get("variant")
    return f"{cfg.model.name}/{variant}" if variant else str(cfg.model.name)


def run_name(cfg: DictConfig) -> str:
    """A readable name for the MLflow UI's run list."""
    return f"{cfg.model.name}-{cfg.pipeline.name}-{cfg.strategy.name}-{cfg.gpus}dev"


def base_tags(cfg: DictConfig) -> dict[str, str]:
    """Tags every run carries, so the UI and search_runs can filter by them."""
    tags = {
        "model": cfg.model.name,
        "model.variant": str(cfg.model.get("variant", "")),
        "pipeline": cfg.pipeline.name,
        "strategy": cfg.strategy.name,
        "data": cfg.data.name,
        "data.synthetic": str(cfg.data.name == "synthetic").lower(),
        "mlflow.runName": run_name(cfg),
        "runner.version": runner.__version__,
        # The UI's Source column: the command that made the run.
        "mlflow.source.name": redact(command_line()),
        "mlflow.source.type": "LOCAL",
    }
    commit = _git_commit()
    if commit:
        tags["mlflow.source.git.commit"] = commit
    return tags


def process_tags() -> dict[str, str]:
    """Which process writes the run: how a later start of the same config tells a dead run from a live one."""
    return {"runner.host": socket.gethostname(), "runner.pid": str(os.getpid())}


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else
        return True
    return True


def close_dead_runs(uri: str, experiment: str, digest: str) -> list[str]:
    """End as KILLED the RUNNING runs of this config whose process died on this host (SIGKILL, power loss).

    Runs of live processes, or of other hosts (whose processes cannot be checked from here), are left alone.

    Returns:
        The ids of the runs it closed.
    """
    from mlflow.tracking import MlflowClient

    client = MlflowClient(uri)
    exp = client.get_experiment_by_name(experiment)
    if exp is None:
        return []
    closed = []
    query = f"tags.config_hash = '{digest}' and attributes.status = 'RUNNING'"
    for found in client.search_runs([exp.experiment_id], query):
        tags = found.data.tags
        pid = tags.get("runner.pid", "")
        if tags.get("runner.host") != socket.gethostname() or not pid.isdigit() or _alive(int(pid)):
            continue
        client.set_tag(found.info.run_id, "error", f"the process (pid {pid}) died without ending the run")
        client.set_terminated(found.info.run_id, "KILLED")
        closed.append(found.info.run_id)
        log.warning("run %s of this config was left RUNNING by a dead process (pid %s): marked KILLED",
                    found.info.run_id, pid)
    return closed


def sweep_tags(digest: str) -> dict[str, str]:
    """The config hash (what resume matches on) and, inside a sweep, the parent run."""
    tags = {"config_hash": digest}
    parent = parent_run_id()
    if parent:
        tags["mlflow.parentRunId"] = parent
    return tags


def record_invalid(cfg: DictConfig, error: Exception) -> None:
    """A sweep job whose config is invalid still gets a run, FAILED with the error, so the sweep shows it."""
    uri = resolve_uri(OmegaConf.select(cfg, "mlflow.tracking_uri", default=None))
    experiment = str(OmegaConf.select(cfg, "mlflow.experiment", default="runner"))
    tags = {k: str(OmegaConf.select(cfg, f"{k}.name", default="?")) for k in ("model", "pipeline", "strategy")}
    tags["devices.count"] = str(OmegaConf.select(cfg, "gpus", default="?"))
    combination = "-".join(tags[k] for k in ("model", "pipeline", "strategy"))
    tags["mlflow.runName"] = f"{combination}-{tags['devices.count']}dev (invalid)"
    parent = parent_run_id()
    if parent:
        tags["mlflow.parentRunId"] = parent
    Run(uri, experiment, tags).end("FAILED", str(error))


class Run:
    """One MLflow run, written through MlflowClient (no global 'active run' state).

    Every write goes to the run's journal first (runner/journal.py) and then to the store. A store that fails
    mid-run does not stop training: the run goes offline, keeps journaling, tries the store again every
    OFFLINE_RETRY_SECONDS (one quick attempt), and at the end sends everything or raises a StoreError naming the
    journal and the `runner replay` command.

    Args:
        uri: the tracking store.
        experiment: the experiment's name (created if missing).
        tags: the run's first tags.
        journal_dir: where the journal file goes (the run's output folder); None keeps it in memory.
    """

    def __init__(self, uri: str, experiment: str, tags: dict[str, str], journal_dir: Path | None = None,
                 system_metrics: float = 0.0):
        from mlflow.tracking import MlflowClient

        self.client, self.uri = MlflowClient(uri), uri
        self.experiment_id = ensure_experiment(uri, experiment)
        self.run_id = self.client.create_run(self.experiment_id, tags=tags).info.run_id
        header = {"journal": 1, "uri": redact(uri), "run_id": self.run_id, "experiment": experiment}
        self.journal = Journal(journal_dir / JOURNAL_NAME if journal_dir else None, header)
        self.offline: tuple[str, float] | None = None  # (why, when to try again) while the store cannot be written
        self.monitor = _system_metrics(self.run_id, uri, system_metrics) if system_metrics else None

    def _record(self, op: str, **args: Any) -> None:
        self.journal.append(op, **args)
        self._send()

    def _send(self, final: bool = False) -> None:
        """Send the journal's pending writes in order; on failure go (or stay) offline. `final`: keep trying for up
        to FINAL_WAIT_SECONDS (a store that is restarting), then raise a StoreError naming the journal."""
        if self.offline and not final and time.monotonic() < self.offline[1]:
            return
        deadline = time.monotonic() + (FINAL_WAIT_SECONDS if final and self.offline else 0)
        while True:
            try:
                with whole_write(), (quick_http() if self.offline and not final else contextlib.nullcontext()):
                    for entry in self.journal.pending():
                        send(self.client, self.run_id, entry)
                        self.journal.ack(entry["seq"])
                break
            except Exception as e:  # noqa: BLE001 - whatever the store's failure, training goes on
                self._went_offline(reason(e))
                if not final:
                    return
                if time.monotonic() > deadline:
                    raise StoreError(
                        f"tracking store {redact(self.uri)} could not be written ({reason(e)}); this run's "
                        f"{len(self.journal.pending())} unsent writes are in {self.journal.path or 'memory only'}: "
                        f"once the store works, run `runner replay {self.journal.path}`"
                    ) from e
                time.sleep(5)
        if self.offline:
            log.warning("tracking store %s answers again: the run's writes are sent", self.uri)
            self.offline = None

    def _went_offline(self, why: str) -> None:
        if self.offline is None:
            log.warning("tracking store %s cannot be written (%s): training goes on, the run's writes are kept in %s "
                        "and sent when it answers", self.uri, why, self.journal.path or "memory")
        self.offline = (why, time.monotonic() + OFFLINE_RETRY_SECONDS)

    def params(self, params: dict[str, str]) -> None:
        self._record("params", params={k: str(v) for k, v in params.items()})

    def tags(self, tags: dict[str, str]) -> None:
        self._record("tags", tags={k: str(v) for k, v in tags.items()})

    def metrics(self, metrics: dict[str, float], step: int) -> None:
        now = int(time.time() * 1000)
        self._record("metrics", points=[[k, float(v), now, step] for k, v in metrics.items()])

    def text(self, text: str, name: str) -> None:
        self._record("text", text=text, name=name)

    def file(self, path: Path) -> None:
        if path.is_file():
            self._record("file", path=str(path))

    def dataset(self, name: str, digest: str, source: str, profile: dict[str, Any], context: str) -> None:
        """Record the data as an MLflow dataset input of the run (the UI's Dataset column)."""
        self._record("dataset", name=name, digest=digest, source=source, profile=profile, context=context)

    def copy_history(self, source_run_id: str, until_step: int) -> None:
        """Copy another run's metric points up to `until_step` (a resumed run continues its dead run's history)."""
        old = self.client.get_run(source_run_id).data.metrics
        points = [
            [key, m.value, m.timestamp, m.step]
            for key in old
            for m in self.client.get_metric_history(source_run_id, key)
            if m.step <= until_step
        ]
        self._record("metrics", points=points)

    def end(self, status: str, error: str | None = None) -> None:
        """Close the run as FINISHED, FAILED or KILLED (a failure's message kept as the `error` tag), after every
        write the journal holds; the journal file is removed once the store has it all.

        Raises:
            StoreError: the store still cannot be written; the message names the journal and how to replay it.
        """
        if self.monitor is not None:
            self.monitor.finish()  # its last samples, before the run closes
        if error:
            self.journal.append("tags", tags={"error": error[:5000]})
        self.journal.append("end", status=status)
        self._send(final=True)
        self.journal.remove()


def _system_metrics(run_id: str, uri: str, interval: float) -> Any:
    """MLflow's system-metrics monitor (CPU, memory, disk, network; GPU utilisation and memory with nvidia-ml-py),
    sampling every `interval` seconds in a thread of its own, started; None if it cannot run here."""
    try:
        from mlflow.system_metrics.system_metrics_monitor import SystemMetricsMonitor

        logging.getLogger("mlflow.system_metrics").setLevel(logging.WARNING)  # its start/stop INFO lines
        monitor = SystemMetricsMonitor(run_id, sampling_interval=interval, samples_before_logging=1, tracking_uri=uri)
        monitor.start()
        return monitor
    except Exception as e:  # noqa: BLE001 - a run does not need it
        log.warning("no system metrics (%s: %s)", type(e).__name__, e)
        return None


@contextmanager
def tracked(uri: str, plan: Plan, journal_dir: Path | None = None) -> Iterator[Run]:
    """Open a run for `plan`; on exit it is FINISHED, FAILED (an exception) or KILLED (Ctrl-C), never left RUNNING
    (a store that cannot be written at the end: a StoreError naming the journal that holds the rest)."""
    cfg = plan.cfg
    open_store(uri, cfg.mlflow.experiment)  # an unusable store fails here, in one line, before anything else
    tags = {**base_tags(cfg), **sweep_tags(plan.config_hash), **process_tags()}
    close_dead_runs(uri, cfg.mlflow.experiment, tags["config_hash"])
    run = None
    try:
        with whole_write():  # a Ctrl-C during the creation is raised once `run` is set, and closes it KILLED
            run = Run(uri, cfg.mlflow.experiment, tags, journal_dir, cfg.mlflow.system_metrics_interval)
        log.info("MLflow run %s in %s (experiment %r)", run.run_id, uri, cfg.mlflow.experiment)
        run.params(flatten(cfg))
        run.text(redact(OmegaConf.to_yaml(cfg, resolve=True)), "config.yaml")
        yield run
    except (KeyboardInterrupt, Terminated) as e:
        if run is not None:
            run.end("KILLED", f"interrupted ({type(e).__name__}{': ' + str(e) if str(e) else ''})")
        raise
    except BaseException as e:
        if run is not None:
            run.end("FAILED", f"{type(e).__name__}: {e}".splitlines()[0])
        raise
    run.end("FINISHED")


class NoRun:
    """Stands in for a Run where nothing is logged: the workers of a multi-worker job other than the chief."""

    run_id = None

    def __getattr__(self, name: str) -> Any:
        return lambda *args, **kwargs: None


@contextmanager
def untracked() -> Iterator[NoRun]:
    """A run context that logs nothing (the worker's own log file keeps its record)."""
    yield NoRun()
