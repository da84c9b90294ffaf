"""Multirun sweeps: one fresh process per job, a parent MLflow run over child runs, failures summarised, resume.

Hydra's launcher decides where and how many jobs run at once (the basic launcher: one after another; joblib:
`hydra.launcher.n_jobs` in parallel; submitit: on a cluster). Whatever it chooses, the job function it calls only
starts `python -m runner <the job's overrides>` in a fresh interpreter and waits for it, because TensorFlow's
devices and collective groups can be set once per process: a launcher that reuses worker processes (joblib's loky
pool, Ray) would otherwise hand job 3 the TensorFlow of job 1.
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig

from runner import tracking
from runner.errors import UserError, one_line
from runner.report import kinds
from runner.tasks import METRICS
from runner.tracking.redact import redact

log = logging.getLogger(__name__)

PARENT_FILE = "parent_run_id"  # in the sweep dir: how jobs on any launcher find the parent run
CHOSEN_FILE = "predicted_top.json"  # in the sweep dir (sweep.only_top): the combinations to run, and the others
RESULT_FILE = "result.json"  # in each job dir: the job's outcome, read back by the summary

failures: list[dict] = []  # set by the callback after a sweep; the command line exits non-zero when not empty
_open_parent: dict[str, str] = {}  # uri and run id of a parent run this process opened and has not closed yet


def run_isolated(cfg: DictConfig) -> dict:
    """The job function of a multirun: skip if resumable, else run the job in a fresh process. An invalid job starts
    none: its run is recorded FAILED with the error here, as its process would have. Returns the job's outcome:
    status FINISHED / FAILED / SKIPPED, its overrides, and the error line if it failed."""
    from hydra.core.hydra_config import HydraConfig

    from runner.config import ConfigError, validate

    hc = HydraConfig.get()
    overrides, job_dir = list(hc.overrides.task), hc.runtime.output_dir
    outcome: dict[str, Any] = {"overrides": " ".join(overrides), "job_dir": job_dir}
    left_out = _not_chosen(hc.sweep.dir, overrides)
    if left_out:
        log.info("sweep.only_top: %s %s; skipped", outcome["overrides"], left_out)
        return _write(job_dir, {**outcome, "status": "SKIPPED", "reason": left_out})
    try:
        plan = validate(cfg)
    except ConfigError as e:
        _record_invalid(cfg, e, hc.sweep.dir)
        return _write(job_dir, {**outcome, "status": "FAILED", "error": one_line(e)})
    if cfg.sweep.resume:  # a FINISHED run of the same config hash
        from mlflow.tracking import MlflowClient

        client = MlflowClient(tracking.resolve_uri(plan.cfg.mlflow.tracking_uri))
        exp = client.get_experiment_by_name(plan.cfg.mlflow.experiment)
        found = exp and client.search_runs([exp.experiment_id], f"tags.config_hash = '{plan.config_hash}' and "
                                           "attributes.status = 'FINISHED'", max_results=1)
        if found:
            done = found[0].info.run_id
            log.info("resume: %s already FINISHED as run %s; skipped", outcome["overrides"], done)
            return _write(job_dir, {**outcome, "status": "SKIPPED", "run_id": done})
    # `python -m runner` with the job's overrides and the sweep's own config directories (`--config-dir`,
    # `hydra.searchpath`), so a user's components are found in the job's process too
    config_dir = [s.path for s in hc.runtime.config_sources if s.provider == "command-line" and s.schema == "file"]
    command = [sys.executable, "-m", "runner", *(["--config-dir", config_dir[0]] if config_dir else []),
               *overrides, *(o for o in hc.overrides.hydra if o.startswith("hydra.searchpath=")),
               f"hydra.run.dir={job_dir}"]
    return _write(job_dir, {**outcome, **launch(command, job_dir, _read_parent(hc.sweep.dir))})


def launch(command: list[str], job_dir: str, parent: str | None) -> dict[str, str]:
    """Run one job's process to its end, as a job of the sweep whose parent run is `parent`, its stdout and stderr
    kept in `job_dir`: the one way a sweep or a benchmark starts a job. Returns status FINISHED or FAILED, the id of
    the run it opened (`run_id`, when it got that far) and, if it failed, its `error` line."""
    env = {**os.environ, tracking.ENV_CHILD: "1", tracking.ENV_PARENT: parent or ""}
    code, stdout, stderr = _run_child(command, env)
    Path(job_dir).mkdir(parents=True, exist_ok=True)
    Path(job_dir, "child.stdout").write_text(stdout)
    Path(job_dir, "child.stderr").write_text(stderr)
    found = re.search(r"mlflow run ([0-9a-f]{32})", stdout)
    outcome = {"status": "FINISHED" if code == 0 else "FAILED", **({"run_id": found.group(1)} if found else {})}
    if code == 0:
        return outcome
    lines = [line for line in stderr.splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("error:")]  # the job's own error line, else its last
    if code < 0:  # killed by a signal it could not handle (SIGKILL: the kernel's OOM killer, `kill -9`)
        lines = [f"killed by {signal.Signals(-code).name} (its last line: {lines[-1].strip()})" if lines else
                 f"killed by {signal.Signals(-code).name}"]
    return {**outcome, "error": (errors or lines or [f"exit status {code}"])[-1].removeprefix("error: ")}


def _record_invalid(cfg: DictConfig, error: Exception, sweep_dir: str) -> None:
    """The invalid job's FAILED run under the sweep's parent; a store that refuses it is a warning (the sweep's
    summary names the job and its error either way, and no run was left open)."""
    from mlflow.exceptions import MlflowException

    try:
        tracking.record_invalid(cfg, error, _read_parent(sweep_dir))
    except (UserError, MlflowException) as refused:
        log.warning("the invalid job's run is not in the store: %s", one_line(refused))


def combination_key(overrides: list[str]) -> str:
    """A combination of a sweep, whatever its round: its overrides without the sweep's own settings."""
    return " ".join(sorted(o for o in overrides if not o.startswith("sweep.")))


def choose_top(sweep_dir: str, overrides: list[str], k: int) -> list[str]:
    """Before the jobs (sweep.only_top=K): predict every combination of the sweep, keep the K predicted fastest of
    each unit (a sweep over an image model and a language model: K of each, never ranked against each other) in the
    sweep dir for the jobs to read, and return lines naming the ones left out with their predictions."""
    from runner.predict.grid import expand, predict_elsewhere, ranked

    combos = {combination_key(c): c for c in expand(overrides)}
    order = ranked(predict_elsewhere(list(combos.values())))
    keep, seen = top_of_each_unit(order, k)
    others = {combination_key(o.overrides): (f"predicted {o.prediction.rate:,.0f} {o.prediction.unit}/s, not "
                                             f"in the top {k}" if o.prediction else f"not predicted ({o.error})")
              for o in order if combination_key(o.overrides) not in keep}
    Path(sweep_dir).mkdir(parents=True, exist_ok=True)
    Path(sweep_dir, CHOSEN_FILE).write_text(json.dumps({"run": sorted(keep), "skip": others}, indent=2))
    each = f" ({k} of each unit: {', '.join(seen)})" if len(seen) > 1 else ""
    return [f"sweep.only_top={k}: running the {len(keep)} predicted fastest{each} of {len(combos)} combinations"] + [
        f"  skipped {key}: {why}" for key, why in others.items()]


def top_of_each_unit(order: list[Any], k: int) -> tuple[set[str], list[str]]:
    """The combination keys of the first `k` predicted outcomes of each unit in `order` (ranked fastest first within
    each unit: predict.grid.ranked), and the units, in the order they come."""
    seen: dict[str, int] = {}  # unit -> its outcomes so far
    keep = set()
    for o in (o for o in order if o.prediction):
        seen[o.prediction.unit] = seen.get(o.prediction.unit, 0) + 1
        if seen[o.prediction.unit] <= k:
            keep.add(combination_key(o.overrides))
    return keep, list(seen)


def _not_chosen(sweep_dir: str, overrides: list[str]) -> str | None:
    """Why this job is left out by sweep.only_top (None: it runs, or only_top is off)."""
    path = Path(sweep_dir, CHOSEN_FILE)
    return json.loads(path.read_text())["skip"].get(combination_key(overrides)) if path.exists() else None


def _run_child(command: list[str], env: dict) -> tuple[int, str, str]:
    """Run a job process to the end: (exit status, stdout, stderr). On Ctrl-C the child, in the same process group,
    got the interrupt too; anything else that ends this process's wait (SIGTERM sent to it alone, the SystemExit of
    submitit's timeout handler) is passed on to the child as SIGTERM. Either way the child gets time to save a
    checkpoint and close its MLflow run as KILLED (killed at once, or left alone, it would leave the run RUNNING)."""
    with subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) as child:
        try:
            stdout, stderr = child.communicate()
        except BaseException as e:
            if not isinstance(e, KeyboardInterrupt):
                child.terminate()
            try:
                child.communicate(timeout=60)
            except subprocess.TimeoutExpired:
                child.kill()
            raise
    return child.returncode, stdout, stderr


def _write(job_dir: str, outcome: dict) -> dict:
    Path(job_dir).mkdir(parents=True, exist_ok=True)
    Path(job_dir, RESULT_FILE).write_text(json.dumps(outcome))
    return outcome


def _read_parent(sweep_dir: str) -> str | None:
    path = Path(sweep_dir, PARENT_FILE)
    return path.read_text().strip() if path.exists() else None


def summary_lines(outcomes: list[dict]) -> list[str]:
    """Counts per status, then one line per failed combination with its error."""
    counts = {s: sum(o["status"] == s for o in outcomes) for s in ("FINISHED", "FAILED", "SKIPPED")}
    reused = sum(o["status"] == "SKIPPED" and "run_id" in o for o in outcomes)
    lines = [f"sweep: {len(outcomes)} jobs: " + ", ".join(f"{n} {s.lower()}" for s, n in counts.items())
             + (f" ({reused} FINISHED before, sweep.resume: their runs in the table)" if reused else "")]
    lines += [redact(f"  FAILED {o['overrides']}: {o['error']}") for o in outcomes if o["status"] == "FAILED"]
    lines += [redact(f"  SKIPPED {o['overrides']}: {o['reason']}") for o in outcomes if o.get("reason")]
    return lines


def _close_dead_jobs(client: Any, parent: str, wait: float = 10.0) -> None:
    """Close KILLED the parent's jobs left RUNNING by processes gone from this host: joblib's launcher, interrupted,
    SIGKILLs its workers and their `python -m runner` children, which cannot close their runs. A job's process still
    alive here (closing its own run after the same Ctrl-C) is given `wait` seconds; one of another host is left."""
    experiment = client.get_run(parent).info.experiment_id
    deadline = time.monotonic() + wait
    while True:
        running = client.search_runs([experiment], f"tags.mlflow.parentRunId = '{parent}' and "
                                                    "attributes.status = 'RUNNING'")
        alive = [r for r in running if not tracking.close_dead(client, r, "the job's process", "its run")
                 and tracking.process_alive(r.data.tags)]
        if not alive or time.monotonic() > deadline:
            return
        time.sleep(0.5)


class SweepAborted(BaseException):
    """The sweep's start or end failed. Not an Exception: Hydra turns a callback's Exception into a warning and goes
    on (jobs without their parent run, a parent left RUNNING); this reaches the command line, which closes the parent
    and reports `error` in one line."""

    def __init__(self, error: Exception):
        super().__init__(str(error))
        self.error = error


class SweepCallback(Callback):
    """Opens the parent run before a multirun's jobs start and closes it, with a summary, after they end; in the
    launching process (conf/config.yaml's hydra.callbacks), so parallel jobs never race to create a fresh store."""

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        from runner.config import SweepConf
        from runner.registry import typed_values
        from runner.tracking.redact import redact_files, redact_logs

        try:
            # The sweep's own settings, checked against their rules before anything opens: the jobs check the rest,
            # but these act before any job (sweep.only_top=-1 would leave every job out).
            typed_values(SweepConf, config.sweep, "sweep")
            redact_logs()  # Hydra logs each job's overrides
            redact_files(Path(config.hydra.sweep.dir))
            uri, sweep_dir = tracking.resolve_uri(config.mlflow.tracking_uri), Path(config.hydra.sweep.dir)
            parent = open_parent(uri, config.mlflow.experiment, list(config.hydra.overrides.task), sweep_dir)
            show_swept(uri, parent, list(config.hydra.overrides.task))
            os.environ[tracking.ENV_PARENT] = parent
            failures.clear()
            log.info("sweep parent run %s in %s", parent, uri)
            if config.train.probe_peak:
                from runner.measure.peak import probe_before_jobs

                probe_before_jobs()
            Path(sweep_dir, CHOSEN_FILE).unlink(missing_ok=True)  # a sweep dir used again: its old choice goes
            if config.sweep.only_top:
                chosen = choose_top(str(sweep_dir), list(config.hydra.overrides.task), config.sweep.only_top)
                print("\n".join(redact(line) for line in chosen), file=sys.stderr)
        except Exception as e:
            raise SweepAborted(e) from e

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        try:
            results = sorted(Path(config.hydra.sweep.dir).glob(f"*/{RESULT_FILE}"))
            outcomes = [json.loads(p.read_text()) for p in results]
            failures[:] = [o for o in outcomes if o["status"] == "FAILED"]
            uri, parent = tracking.resolve_uri(config.mlflow.tracking_uri), _read_parent(config.hydra.sweep.dir)
            _reuse(uri, parent, outcomes)
            close_parent(uri, parent, summary_lines(outcomes), failed=bool(failures))
        except Exception as e:
            raise SweepAborted(e) from e


def _reuse(uri: str, parent: str, outcomes: list[dict]) -> None:
    """Tag the parent with the earlier runs its resumed jobs were skipped for (`report.table.REUSED`), which its table,
    verdict and `runner report --parent` then include."""
    from mlflow.entities import RunTag
    from mlflow.tracking import MlflowClient

    from runner.report.table import REUSED

    tags = [RunTag(REUSED + o["run_id"], redact(o["overrides"])) for o in outcomes
            if o["status"] == "SKIPPED" and o.get("run_id")]
    try:
        for start in range(0, len(tags), 100):  # MLflow takes 100 tags a batch
            MlflowClient(uri).log_batch(parent, tags=tags[start:start + 100])
    except Exception as e:  # noqa: BLE001 - the table then shows this sweep's own runs; the parent is closed as ever
        log.warning("the runs of the resumed jobs could not be named on the sweep's parent: %s", one_line(e))


def open_parent(uri: str, experiment: str, overrides: list[str], sweep_dir: Path) -> str:
    """Before a sweep's (or a benchmark's) jobs: the store's schema and experiment, once, and the parent run its jobs'
    runs hang under (`runner report --parent`), its id in `sweep_dir` for jobs on any launcher; returns the id."""
    from mlflow.tracking import MlflowClient

    experiment_id = tracking.open_store(uri, experiment)
    # process_tags: how `runner report` tells a parent its killed sweep left open (tracking/stale.py)
    tags = {"sweep": "parent", "sweep.command": redact(tracking.command_line()),
            "sweep.overrides": redact(" ".join(overrides)), "sweep.dir": str(sweep_dir.resolve()),
            "mlflow.runName": "sweep " + "/".join(sweep_dir.parts[-2:]),
            **tracking.process_tags()}
    with tracking.whole_write():  # registered for closing before a Ctrl-C held back meanwhile is raised
        parent = MlflowClient(uri).create_run(experiment_id, tags=tags).info.run_id
        _open_parent.update(uri=uri, run_id=parent)
    sweep_dir.mkdir(parents=True, exist_ok=True)
    (sweep_dir / PARENT_FILE).write_text(parent)
    return parent


def show_swept(uri: str, parent: str, overrides: list[str]) -> None:
    """The runs view of a sweep's experiment gets a column for each config key the sweep's `overrides` vary besides
    its combinations' own (`train.precision=float32,mixed_bfloat16`: params.train.precision; `data=a,b`: data.name),
    so that its jobs are told apart there; one that cannot be added is a warning (the sweep runs as well without)."""
    from mlflow.tracking import MlflowClient

    from runner.config import COMPONENTS
    from runner.predict.grid import expand, swept
    from runner.tracking import ui

    try:
        keys = [k if "." in k else f"{k}.name" for k in swept(expand(overrides)) if "." in k or k in COMPONENTS]
        if keys:
            client = MlflowClient(uri)
            experiment = client.get_run(parent).info.experiment_id
            ui.set_up(client, experiment, client.get_experiment(experiment).tags,
                      tuple(f"params.`{k}`" for k in keys))
    except Exception as e:  # noqa: BLE001 - a column of the UI's view
        log.warning("the runs view shows no column for the keys the sweep varies: %s", one_line(e))


def close_parent(uri: str, parent: str, lines: list[str], failed: bool) -> None:
    """After the jobs: `lines` (what the sweep says of its jobs) and the jobs' table and verdict, printed to stderr and
    logged to the parent run, which ends FAILED if a job failed, else FINISHED."""
    from mlflow.tracking import MlflowClient

    from runner.report.table import sweep_end

    client = MlflowClient(uri)
    try:
        lines = lines + sweep_end(client, parent)
    except Exception as e:  # noqa: BLE001 - the table is a convenience; closing the parent is what matters
        lines = lines + [f"(no table of the jobs: {type(e).__name__}: {e})"]
    print("\n".join(lines), file=sys.stderr)
    with tracking.whole_write():
        try:
            _summarise_on_parent(client, parent)
            client.log_text(parent, "\n".join(lines) + "\n", "sweep_summary.txt")
        finally:  # the parent is closed even if the summary cannot be stored
            client.set_terminated(parent, "FAILED" if failed else "FINISHED")
            _open_parent.clear()


def _summarise_on_parent(client: Any, parent: str) -> None:
    """Give the parent's row in the runs table something to say: its finished jobs' best figures (`parent_figures`)
    and the models, pipelines, strategies and device counts they covered."""
    from mlflow.entities import Metric, RunTag

    from runner.report.table import jobs as of_sweep, rows_of

    jobs = [r for r in of_sweep(client, client.get_run(parent).info.experiment_id, parent)
            if r.info.status == "FINISHED"]
    now = int(time.time() * 1000)
    metrics = [Metric(key, value, now, 0) for key, value in parent_figures(rows_of(jobs)).items()]
    metrics.append(Metric("jobs_finished", float(len(jobs)), now, 0))
    tags = [RunTag(key, ", ".join(sorted({r.data.tags.get(key, "?") for r in jobs}, key=str)))
            for key in ("model", "pipeline", "strategy", "devices.count", "devices.kind") if jobs]
    client.log_batch(parent, metrics=metrics, tags=tags)


def parent_figures(jobs: list[Any]) -> dict[str, float]:
    """The best figures of a sweep's finished jobs (report rows), each in the unit and metric its runs logged: the
    highest `<unit>_per_sec`, the best test score of their task (`test_accuracy`, a click model's `test_auc`), the
    shortest time to the target (`time_to_<metric>_seconds`). Jobs of several kinds (runner/report/kinds.py), or of
    several models or settings (the report's rows: `mlp/tiny data.path=/a`), are summarised per model, under its name
    (`gpt/tiny/tokens_per_sec`): a figure never picks between two units, nor two settings' work."""
    parts = kinds.split(jobs)
    if len(parts) < 2 and len({r.model for r in jobs}) < 2:
        groups = [("", jobs)]
    else:  # a model whose own jobs are of several kinds (a user's, on images and on tokens): its kinds named too
        named = dict(zip([k for k, _ in parts], kinds.names([k for k, _ in parts])))
        spans = [model for _, part in parts for model in {r.model for r in part}]
        # the model's name as MLflow takes it in a metric's key (letters, digits, `_-. /`; a user's may say more)
        groups = [(re.sub(r"[^\w\-. /]", "_", model) + (f"/{named[kind]}" if spans.count(model) > 1 else "") + "/",
                   [r for r in part if r.model == model])
                  for kind, part in parts for model in sorted({r.model for r in part})]
    figures = {}
    for prefix, rows in groups:
        kind = kinds.one(rows)
        best_score = METRICS[kind.score].best  # the highest accuracy or AUC; the lowest of a figure to minimise
        for key, field, pick in ((f"{kind.unit}_per_sec", "rate", max), (f"test_{kind.score}", "score", best_score),
                                 (f"time_to_{kind.target}_seconds", "time_to_target", min)):
            values = [v for r in rows if not math.isnan(v := getattr(r, field))]
            if values:
                figures[prefix + key] = pick(values)
    return figures


def close_open_parent(status: str) -> None:
    """End a sweep's parent run that an interruption (Ctrl-C) or a crash left open, so it does not stay RUNNING, and
    its jobs' runs whose processes died (`_close_dead_jobs`); a store that cannot be written then is said in a
    warning (the failure being reported matters more)."""
    if _open_parent:
        from mlflow.tracking import MlflowClient

        try:
            with tracking.whole_write():
                client = MlflowClient(_open_parent["uri"])
                _close_dead_jobs(client, _open_parent["run_id"])
                client.set_terminated(_open_parent["run_id"], status)
        except Exception as e:  # noqa: BLE001 - called while another failure is being reported
            log.warning("the sweep's parent run %s could not be closed: %s", _open_parent["run_id"], redact(str(e)))
        _open_parent.clear()
