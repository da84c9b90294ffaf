"""One MLflow run: the contract the loop records through (`Recorder`), the journaled `Run` that implements it, the
`NoRun` of a worker that logs nothing, and `tracked()`, which ends every run FINISHED, FAILED or KILLED."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import logging
import math
import queue
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator, Protocol

from omegaconf import DictConfig, OmegaConf

from runner.errors import one_line
from runner.models import label
from runner.runtime import signals
from runner.tasks import target_of
from runner.tracking import system, ui
from runner.tracking.journal import NAME as JOURNAL_NAME, Journal, send
from runner.tracking.redact import redact
from runner.tracking.stale import close_dead_runs
from runner.tracking.store import StoreError, ensure_experiment, open_store, quick_http, resolve_uri, whole_write
from runner.tracking.tags import base_tags, flatten, process_tags, sweep_tags

if TYPE_CHECKING:
    from runner.config import Plan
    from runner.runtime.output import OutputFolder

log = logging.getLogger(__name__)


class Recorder(Protocol):
    """What a run's code may record. `Run` writes it to MLflow (journaled); `NoRun` drops it."""

    run_id: str | None
    experiment_id: str | None

    def params(self, params: dict[str, Any]) -> None: ...
    def tags(self, tags: dict[str, Any]) -> None: ...
    def metrics(self, metrics: dict[str, float], step: int) -> None: ...
    def text(self, text: str, name: str) -> None: ...
    def file(self, path: Path) -> None: ...
    def dataset(self, name: str, digest: str, source: str, profile: dict[str, Any], context: str) -> None: ...
    def copy_history(self, source_run_id: str, until_step: int) -> None: ...
    def end(self, status: str, error: str | None = None) -> None: ...


OFFLINE_RETRY_SECONDS = 30.0  # while the store cannot be written, how often to try it again


def record_invalid(cfg: DictConfig, error: Exception, parent: str | None) -> None:
    """A sweep job whose config is invalid still gets a run (the child of `parent`), FAILED with the error, so the
    sweep shows it."""
    uri = resolve_uri(OmegaConf.select(cfg, "mlflow.tracking_uri", default=None))
    experiment = str(OmegaConf.select(cfg, "mlflow.experiment", default="runner"))
    tags = {k: str(OmegaConf.select(cfg, f"{k}.name", default="?")) for k in ("model", "pipeline", "strategy")}
    tags["devices.count"] = str(OmegaConf.select(cfg, "gpus", default="?"))
    combination = "-".join(tags[k] for k in ("model", "pipeline", "strategy"))
    tags["mlflow.runName"] = f"{combination}-{tags['devices.count']}dev (invalid)"  # as base_tags names a run
    if parent:
        tags["mlflow.parentRunId"] = parent
    wait = OmegaConf.select(cfg, "mlflow.final_wait", default=0.0)  # the config is invalid: this value may be too
    valid = isinstance(wait, (int, float)) and 0 <= wait < math.inf
    open_store(uri, experiment)  # an unusable store is one StoreError line, as for a run (tracked)
    Run(uri, experiment, tags, final_wait=wait if valid else 0.0).end("FAILED", str(error))


class Run(Recorder):
    """One MLflow run, written through MlflowClient (no global 'active run' state), each write to its journal (in
    `folder`, else in memory) first. A store that fails mid-run does not stop training: the run goes offline, tries
    the store again every OFFLINE_RETRY_SECONDS, and at the end sends everything (trying for up to `final_wait`
    seconds) or raises a StoreError naming the journal and `runner replay`. `system_metrics`: seconds between samples.
    """

    def __init__(self, uri: str, experiment: str, tags: dict[str, str], folder: OutputFolder | None = None,
                 system_metrics: float = 0.0, final_wait: float = 0.0):
        from mlflow.tracking import MlflowClient

        self.client, self.uri = MlflowClient(uri), uri
        self.experiment_id = ensure_experiment(uri, experiment)
        self.run_id = self.client.create_run(self.experiment_id, tags=tags).info.run_id
        header = {"journal": 1, "uri": redact(uri), "run_id": self.run_id, "experiment": experiment}
        self.journal = Journal(folder.path / JOURNAL_NAME if folder else None, header,
                               folder.failed if folder else None)
        self.offline: float | None = None  # while the store cannot be written: when to try it again
        self.monitor = system.start(self.run_id, uri, system_metrics) if system_metrics else None
        self.final_wait = final_wait

    def _record(self, op: str, **args: Any) -> None:
        self.journal.append(op, **args)
        self._send()

    def _send(self, final: bool = False) -> None:
        """Send the journal's pending writes in order; on failure go (or stay) offline. `final`: keep trying for up
        to `final_wait` seconds (a store that is restarting), then raise a StoreError naming the journal."""
        if self.offline and not final and time.monotonic() < self.offline:
            return
        deadline = time.monotonic() + (self.final_wait if final else 0)  # online until now, or not
        while True:
            try:
                with whole_write(), (quick_http() if self.offline and not final else contextlib.nullcontext()):
                    for entry in self.journal.pending():
                        send(self.client, self.run_id, entry)
                        self.journal.ack(entry["seq"])
                break
            except Exception as e:  # noqa: BLE001 - whatever the store's failure, training goes on
                if self.offline is None:
                    log.warning("tracking store %s cannot be written (%s): training goes on, the run's writes are kept "
                                "in %s and sent when it answers", self.uri, one_line(e), self.journal.path or "memory")
                self.offline = time.monotonic() + OFFLINE_RETRY_SECONDS
                if not final:
                    return
                if time.monotonic() > deadline:
                    raise StoreError(
                        f"tracking store {redact(self.uri)} could not be written ({one_line(e)}); this run's "
                        f"{len(self.journal.pending())} unsent writes are in {self.journal.path or 'memory only'}: "
                        f"once the store works, run `runner replay {self.journal.path}`"
                    ) from e
                time.sleep(min(5.0, max(0.0, deadline - time.monotonic())))
        if self.offline:
            log.warning("tracking store %s answers again: the run's writes are sent", self.uri)
            self.offline = None

    def params(self, params: dict[str, str]) -> None:
        self._record("params", params={k: str(v) for k, v in params.items()})

    def tags(self, tags: dict[str, str]) -> None:
        self._record("tags", tags={k: str(v) for k, v in tags.items()})

    def metrics(self, metrics: dict[str, float], step: int, at: int | None = None) -> None:
        """`at`: when they were measured (ms since the epoch; a writer process gets them later), else now."""
        now = at or int(time.time() * 1000)
        self._record("metrics", points=[[k, float(v), now, int(step)] for k, v in metrics.items()])

    def text(self, text: str, name: str) -> None:
        self._record("text", text=text, name=name)

    def file(self, path: Path | str) -> None:
        if Path(path).is_file():
            self._record("file", path=str(path))

    def dataset(self, name: str, digest: str, source: str, profile: dict[str, Any], context: str) -> None:
        """Record the data as an MLflow dataset input of the run (the UI's Dataset column)."""
        self._record("dataset", name=name, digest=digest, source=source, profile=profile, context=context)

    def copy_history(self, source_run_id: str, until_step: int) -> None:
        """Copy another run's metric points up to `until_step` (a resumed run continues its dead run's history); one
        this store does not hold (the checkpoint's run logged to another store, or deleted) is a warning: the run
        goes on from the checkpoint, its charts from the resumed step."""
        from mlflow.exceptions import MlflowException

        try:
            old = self.client.get_run(source_run_id).data.metrics
        except MlflowException as e:
            if e.error_code != "RESOURCE_DOES_NOT_EXIST":
                raise
            log.warning("resumed from the checkpoint of run %s, which this store does not hold (another "
                        "mlflow.tracking_uri, or deleted): its metrics before step %d are not copied", source_run_id,
                        until_step)
            return
        points = [[key, m.value, m.timestamp, m.step] for key in old
                  for m in self.client.get_metric_history(source_run_id, key) if m.step <= until_step]
        self._record("metrics", points=points)

    def end(self, status: str, error: str | None = None) -> None:
        """Close the run as FINISHED, FAILED or KILLED (a failure's message kept as the `error` tag), after every
        write the journal holds, and remove the journal file; a StoreError if the store still cannot be written."""
        if self.monitor is not None:
            self.monitor.finish()  # its last samples, before the run closes
        if error:
            self.journal.append("tags", tags={"error": redact(error)[:5000]})  # e.g. a store's URI in the message
        self.journal.append("end", status=status)
        self._send(final=True)
        self.journal.remove()


@dataclasses.dataclass
class Opening:
    """What opening a run takes, in JSON's types (a writer process receives it as one line): `check` the store (an
    unusable one is a StoreError line) and close dead runs of the same config, then `fill` the created run with its
    config. The journal goes in `folder` (a path), if given."""

    uri: str
    experiment: str
    columns: list[str]
    tags: dict[str, str]
    config_hash: str
    params: dict[str, str]
    config_yaml: str
    folder: str | None
    system_metrics: float
    final_wait: float

    def check(self) -> None:
        open_store(self.uri, self.experiment, tuple(self.columns))
        close_dead_runs(self.uri, self.config_hash)

    def run(self, folder: Any) -> Run:
        return Run(self.uri, self.experiment, self.tags, folder, self.system_metrics, self.final_wait)

    def fill(self, run: Run) -> None:
        log.info("MLflow run %s in %s (experiment %r)", run.run_id, self.uri, self.experiment)
        run.params(self.params)
        run.text(self.config_yaml, "config.yaml")


@contextlib.contextmanager
def tracked(uri: str, plan: Plan, folder: OutputFolder | None = None, writer: bool | None = None) -> Iterator[Recorder]:
    """Open a run for `plan`; on exit it is FINISHED, FAILED (an exception) or KILLED (Ctrl-C), never left RUNNING
    (a store that cannot be written at the end: a StoreError naming the journal that holds the rest).

    `writer`: the run is opened and written by a writer process (`WriterRun`) while this one goes on; by default
    when this process has not imported MLflow (a job's start: MLflow's import overlaps TensorFlow's). Otherwise
    here, an unusable store failing in one line before anything else."""
    cfg, target = plan.cfg, target_of(plan.train)
    opening = Opening(
        uri, cfg.mlflow.experiment,
        # the runs view gets this run's own figures (its data's unit and score, the metric of its target)
        list(ui.figures(plan.spec.unit, plan.spec.task, target.metric if target else None)),
        {**base_tags(cfg), "model.label": label(plan.model), **sweep_tags(plan.config_hash), **process_tags()},
        plan.config_hash, flatten(cfg),
        redact(OmegaConf.to_yaml(cfg, resolve=True)), str(folder.path) if folder else None,
        cfg.mlflow.system_metrics_interval, cfg.mlflow.final_wait)
    if writer is None:
        writer = "mlflow" not in sys.modules
    run: Recorder | None = None
    try:
        if writer:
            run = WriterRun(opening, folder)
        else:
            opening.check()
            with whole_write():  # a Ctrl-C during the creation is raised once `run` is set, and closes it KILLED
                run = opening.run(folder)
            opening.fill(run)
        yield run
        signals.raise_noted()  # a signal whose exception a `__del__` swallowed (runtime.signals) still stops the run
    except (KeyboardInterrupt, signals.Terminated) as e:
        signals.acted()
        if run is not None:
            run.end("KILLED", f"interrupted ({type(e).__name__}{': ' + str(e) if str(e) else ''})")
        raise
    except BaseException as e:
        if run is not None:
            run.end("FAILED", f"{type(e).__name__}: {e}".splitlines()[0])
        raise
    run.end("FINISHED")


_WRITES = ("params", "tags", "text", "file", "dataset", "copy_history")


def _sent(name: str) -> Any:
    """A write of the Recorder contract that a `WriterRun` sends to its writer."""
    return lambda self, *args: self._call(name, *args)


class WriterRun(Recorder):
    """A run written by a writer process (`python -m runner.tracking.writer`, which holds the journaled `Run`): each
    call goes to it as a JSON line, from a thread, so training never waits for the store. The writer's log lines are
    logged here; the first call waits until it has opened the run (its StoreError, one line, raised here)."""

    def __init__(self, opening: Opening, folder: OutputFolder | None):
        self.folder = folder
        self.process = subprocess.Popen([sys.executable, "-m", "runner.tracking.writer"], stdin=subprocess.PIPE,
                                        stdout=subprocess.PIPE, text=True)
        self.replies: queue.Queue[dict[str, Any] | None] = queue.Queue()
        self.outbox: queue.Queue[str | None] = queue.Queue()
        self.outbox.put(json.dumps(dataclasses.asdict(opening)))
        self.failed: str | None = None  # the writer's error, once answered
        threading.Thread(target=self._read, daemon=True).start()
        threading.Thread(target=self._write, daemon=True).start()

    def _write(self) -> None:
        while (line := self.outbox.get()) is not None:
            try:
                self.process.stdin.write(line + "\n")
                self.process.stdin.flush()
            except OSError:  # the writer has ended: its reply (or its absence) says why
                return
        self.process.stdin.close()

    def _read(self) -> None:
        for line in self.process.stdout:
            try:
                reply = json.loads(line)
            except ValueError:  # not the writer's: said as it came
                sys.stderr.write(line)
                continue
            if "log" in reply:
                level, name, message = reply["log"]
                logging.getLogger(name).log(level, "%s", message)
            elif "folder_failed" in reply and self.folder is not None:
                self.folder.failed(OSError(reply["folder_failed"]))
            else:
                self.replies.put(reply)
        self.replies.put(None)

    def _reply(self) -> dict[str, Any]:
        """The writer's next answer; an error (its last word), or its end without one, is a StoreError from now on."""
        if self.failed is None:
            reply = self.replies.get()
            if reply is not None and "error" not in reply:
                return reply
            code = self.process.wait()
            self.failed = reply["error"] if reply else (
                f"the MLflow writer process ended without a reply (exit code {code}); its error is above")
        raise StoreError(self.failed)

    @functools.cached_property
    def _opened(self) -> dict[str, Any]:
        return self._reply()

    @property
    def run_id(self) -> str:  # type: ignore[override]
        return self._opened["opened"]

    @property
    def experiment_id(self) -> str:  # type: ignore[override]
        return self._opened["experiment_id"]

    def _call(self, name: str, *args: Any) -> None:
        self._opened  # noqa: B018 - waits until the writer has opened the run
        self.outbox.put(json.dumps({"call": name, "args": args}, default=str))  # a Path, a numpy number: as text

    # the Recorder's writes, each sent to the writer's `Run` as it is called
    params, tags, text, file, dataset, copy_history = (_sent(name) for name in _WRITES)

    def metrics(self, metrics: dict[str, float], step: int) -> None:
        self._call("metrics", metrics, step, int(time.time() * 1000))  # stamped now, not when the writer gets them

    def end(self, status: str, error: str | None = None) -> None:
        """Close the run (the writer sends everything first, as `Run.end`), then wait for the writer to finish."""
        self._call("end", status, error)
        self.outbox.put(None)
        try:
            self._reply()
        finally:
            self.process.wait()


def _nothing(self: Any, *args: Any, **kwargs: Any) -> None:
    """Records nothing."""


class NoRun(Recorder):
    """Stands in for a Run where nothing is logged: the workers of a multi-worker job other than the chief (each
    worker's own log file keeps its record). Every method of the contract, doing nothing."""

    run_id: str | None = None
    experiment_id: str | None = None
    params = tags = metrics = text = file = dataset = copy_history = end = _nothing
