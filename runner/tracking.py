"""MLflow: the store's set-up and one run's lifecycle. The loop calls it at start, per logged step, and at the end.

The default store is a sqlite database at an absolute path in the directory the runner was launched from (the
same `mlflow.db` that `mlflow ui` opens there), never inside Hydra's per-run output folder, so every run of every
sweep lands in one place. Artifacts go to `mlartifacts/` beside the database.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import subprocess
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator

from omegaconf import DictConfig, OmegaConf

import runner
from runner.errors import UserError

if TYPE_CHECKING:
    from runner.config import Plan

log = logging.getLogger(__name__)
_MAX_PARAM_LEN = 6000  # MLflow's limit on a param value
ENV_PARENT = "RUNNER_PARENT_RUN_ID"  # set for a sweep's job processes: the sweep's parent run
ENV_CHILD = "RUNNER_SWEEP_CHILD"  # "1" in the fresh process a sweep job starts


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
    stays RUNNING (found when the Ctrl-C sweep test failed on 2026-11-24; reproduced by raising KeyboardInterrupt
    at each line of one metric write in turn). Nested uses hold the signal until the outermost write ends.
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
    path = uri.removeprefix("sqlite:///")
    if not path or path == ":memory:":
        return None
    db = Path(path)
    if db.exists():
        if not db.is_file():
            return f"{db} is not a file"
        if not os.access(db, os.W_OK):
            return f"{db} is not writable"
    ancestor = db.parent  # the database's directory, or the nearest existing folder MLflow would create it under
    while not ancestor.exists() and ancestor != ancestor.parent:
        ancestor = ancestor.parent
    if not ancestor.is_dir():
        return f"{ancestor} is a file, not a directory"
    if not os.access(ancestor, os.W_OK | os.X_OK):
        return f"directory {ancestor} is not writable"
    return None


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
    except Exception as e:  # noqa: BLE001 - whatever the store's failure, the user's fix is the same
        first = (str(e).strip().splitlines() or [""])[0]
        raise StoreError(f"tracking store {uri} cannot be opened: {type(e).__name__}: {first}; {fix}") from e


def ensure_experiment(uri: str, name: str) -> str:
    """Create the store's schema and the experiment if missing; return the experiment id.

    Call this once before parallel jobs start: two processes creating a fresh sqlite schema at once fail.
    """
    from mlflow.tracking import MlflowClient

    client = MlflowClient(uri)
    exp = client.get_experiment_by_name(name)
    if exp is not None:
        return exp.experiment_id
    return client.create_experiment(name, artifact_location=_artifact_root(uri))


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
    return out


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
    """One MLflow run, written through MlflowClient (no global 'active run' state)."""

    def __init__(self, uri: str, experiment: str, tags: dict[str, str]):
        from mlflow.tracking import MlflowClient

        self.client = MlflowClient(uri)
        experiment_id = ensure_experiment(uri, experiment)
        self.run_id = self.client.create_run(experiment_id, tags=tags).info.run_id
        self.uri = uri

    @whole_write()  # a Ctrl-C never cuts a store write in half
    def params(self, params: dict[str, str]) -> None:
        from mlflow.entities import Param

        self.client.log_batch(self.run_id, params=[Param(k, v) for k, v in params.items()])

    @whole_write()
    def tags(self, tags: dict[str, str]) -> None:
        from mlflow.entities import RunTag

        self.client.log_batch(self.run_id, tags=[RunTag(k, str(v)) for k, v in tags.items()])

    @whole_write()
    def metrics(self, metrics: dict[str, float], step: int) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        self.client.log_batch(self.run_id, metrics=[Metric(k, float(v), now, step) for k, v in metrics.items()])

    @whole_write()
    def text(self, text: str, name: str) -> None:
        self.client.log_text(self.run_id, text, name)

    @whole_write()
    def file(self, path: Path) -> None:
        if path.is_file():
            self.client.log_artifact(self.run_id, str(path))

    @whole_write()
    def copy_history(self, source_run_id: str, until_step: int) -> None:
        """Copy another run's metric points up to `until_step` (a resumed run continues its dead run's history)."""
        from mlflow.entities import Metric

        old = self.client.get_run(source_run_id).data.metrics
        points = [
            Metric(key, m.value, m.timestamp, m.step)
            for key in old
            for m in self.client.get_metric_history(source_run_id, key)
            if m.step <= until_step
        ]
        for i in range(0, len(points), 1000):  # MLflow takes at most 1000 metrics per batch
            self.client.log_batch(self.run_id, metrics=points[i : i + 1000])

    @whole_write()
    def end(self, status: str, error: str | None = None) -> None:
        """Close the run as FINISHED, FAILED or KILLED; a failure's message is kept as the `error` tag."""
        if error:
            self.tags({"error": error[:5000]})
        self.client.set_terminated(self.run_id, status)


@contextmanager
def tracked(uri: str, plan: Plan) -> Iterator[Run]:
    """Open a run for `plan`; on exit it is FINISHED, FAILED (an exception) or KILLED (Ctrl-C), never left RUNNING."""
    cfg = plan.cfg
    open_store(uri, cfg.mlflow.experiment)  # an unusable store fails here, in one line, before anything else
    tags = {**base_tags(cfg), **sweep_tags(plan.config_hash), **process_tags()}
    close_dead_runs(uri, cfg.mlflow.experiment, tags["config_hash"])
    run = None
    try:
        with whole_write():  # a Ctrl-C during the creation is raised once `run` is set, and closes it KILLED
            run = Run(uri, cfg.mlflow.experiment, tags)
        log.info("MLflow run %s in %s (experiment %r)", run.run_id, uri, cfg.mlflow.experiment)
        run.params(flatten(cfg))
        run.text(OmegaConf.to_yaml(cfg, resolve=True), "config.yaml")
        yield run
    except KeyboardInterrupt:
        if run is not None:
            run.end("KILLED", "interrupted (KeyboardInterrupt)")
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
