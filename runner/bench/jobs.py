"""Benchmark jobs: each measurement in a fresh process, repeated in rounds and combined into rows. Runner jobs are
the jobs of one sweep per benchmark (`runner.sweep.launch`), read back from MLflow; Keras fit runs in
`runner.bench.keras_baseline`."""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import subprocess
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator

from runner.config import compose
from runner.data_pipelines import rate_unit
from runner.errors import UserError, last_line
from runner.paths import unwritable
from runner.runtime.devices import host_cpu
from runner.runtime.signals import Terminated
from runner.tasks import of_run
from runner.tracking import resolve_uri

MIN_TIMED_STEPS = 20
NO_TIMED_STEPS = "no timed steps: raise --steps to a few times --steps-per-call"  # a finished job's row without a rate
# (model, variant) -> (steps, steps per call) when --steps is not given: a short job on one CPU device (the slow
# variants get fewer, shorter calls); always >= 20 timed steps.
DEFAULT_STEPS = {
    ("mlp", "tiny"): (300, 25), ("mlp", "default"): (600, 50), ("mlp", "chainer"): (600, 50),
    ("cnn", "tiny"): (300, 25), ("cnn", "default"): (120, 10), ("cnn", "paper"): (60, 5),
    ("nin", "tiny"): (300, 25), ("nin", "default"): (60, 5), ("nin", "paper"): (40, 4),
    ("lenet", "default"): (120, 10), ("gpt", "tiny"): (300, 25), ("gpt", "default"): (300, 25),
}


def with_rate(metrics: dict) -> dict:
    """A job's figures with its throughput under one name whatever the data counts: `rate` and `rate_stderr` from
    `<unit>_per_sec` (images, tokens or examples), and `unit`; as they are when it timed nothing."""
    unit = rate_unit(metrics)
    if unit is None or f"{unit}_per_sec" not in metrics:
        return metrics
    out = {**metrics, "rate": metrics[f"{unit}_per_sec"], "rate_stderr": metrics.get(f"{unit}_per_sec_stderr", 0.0),
           "unit": unit}
    if f"predicted_{unit}_per_sec" in metrics:  # a run's own prediction (the grid's jobs turn train.predict off)
        out["predicted_rate"] = metrics[f"predicted_{unit}_per_sec"]
    return out


@dataclass
class Sweep:
    """A benchmark's runner jobs as one sweep: the store and experiment, the parent run, a folder per job."""

    uri: str
    experiment: str
    folder: Path
    parent: str
    jobs: int = 0
    failed: int = 0


@contextmanager
def sweep(tracking_uri: str | None, experiment: str) -> Iterator[Sweep]:
    """Open a benchmark's sweep (its parent run, its folder under multirun/) and close it after the jobs with the
    sweep's summary (runner.sweep.close_parent); an interruption or a crash closes the parent KILLED or FAILED."""
    from runner import sweep as sweeps

    uri, now = resolve_uri(tracking_uri), time.localtime()
    folder = Path("multirun", time.strftime("%Y-%m-%d", now), time.strftime("%H-%M-%S", now) + f"-{experiment}")
    out = Sweep(uri, experiment, folder, sweeps.open_parent(uri, experiment, sys.argv[1:], folder))
    try:
        yield out
    except BaseException as e:
        sweeps.close_open_parent("KILLED" if isinstance(e, (KeyboardInterrupt, Terminated)) else "FAILED")
        raise
    sweeps.close_parent(uri, out.parent, [f"bench: {out.jobs} runner jobs, {out.failed} failed; in {folder}"],
                        failed=bool(out.failed))


def run_job(overrides: list[str], sweep: Sweep, round: int = 0) -> dict:
    """Run one job of the benchmark's sweep in a fresh process (`round`: its repeat, 0 the first); return its final
    MLflow metrics (and `floor`: why it measured no floor, if it says), or {'error': ...} if it failed."""
    from mlflow.tracking import MlflowClient

    from runner.sweep import launch

    folder, sweep.jobs = sweep.folder / str(sweep.jobs), sweep.jobs + 1
    command = [sys.executable, "-m", "runner", *overrides, f"mlflow.tracking_uri={sweep.uri}",
               f"mlflow.experiment={sweep.experiment}", f"hydra.run.dir={folder}"]
    outcome = launch(command + ([f"sweep.round={round}"] if round else []), str(folder), sweep.parent)
    if outcome["status"] != "FINISHED" or "run_id" not in outcome:
        sweep.failed += 1
        return {"error": outcome.get("error", "the job opened no run")}
    data = MlflowClient(sweep.uri).get_run(outcome["run_id"]).data
    tags = {k: data.tags[k] for k in ("floor", "xla") if k in data.tags}  # why no floor; XLA on or off
    return with_rate({**data.metrics, **tags, "score_metric": of_run(data.tags, data.metrics).score.name})


@dataclass(frozen=True)
class Setting:
    """What every job of one table shares: model, variant, steps, global batch, data, optimizer."""

    model: str
    variant: str | None  # None: a model without variants
    steps: int
    steps_per_call: int
    batch: int
    data: str
    test_limit: int | None = None
    optimizer: str | None = None  # None: the model's own (`setting_for` names it)
    extra: tuple[str, ...] = ()  # the user's own config overrides (their model, their data's shape), for every job

    @property
    def name(self) -> str:
        name = f"{self.model}/{self.variant}" if self.variant else self.model
        return " ".join([name, *self.extra])

    def overrides(self) -> list[str]:
        """The runner's config overrides for this setting."""
        out = [f"model={self.model}", f"train.steps={self.steps}", f"train.global_batch_size={self.batch}",
               f"data={self.data}", f"train.steps_per_call={self.steps_per_call}",
               "train.probe_floor=true", "train.target_accuracy=null",
               "train.predict=false"]  # predictions of a grid: `bench predicted`, one calibration per device set
        out += [f"model.variant={self.variant}"] if self.variant else []
        out += [f"train.optimizer={self.optimizer}"] if self.optimizer else []
        return out + ([f"data.test_limit={self.test_limit}"] if self.test_limit else []) + list(self.extra)


def setting_for(args: argparse.Namespace, model: str, variant: str | None, extra: tuple[str, ...] = ()) -> Setting:
    """`model`/`variant` at the command line's batch, data, test limit and optimizer (none given: the model's own,
    as `runner` trains it: gpt's adamw, dlrm's adagrad, else adam), for its steps and steps per call (given, or
    DEFAULT_STEPS; else 120 in calls of 10)."""
    steps, per_call = DEFAULT_STEPS.get((model, variant), (120, 10))
    setting = Setting(model, variant, args.steps or steps, args.steps_per_call or per_call, args.batch, args.data,
                      args.test_limit, args.optimizer, extra)
    if setting.optimizer is None:
        setting = dataclasses.replace(setting, optimizer=str(compose(setting.overrides()).train.optimizer))
    return setting


def timed_steps(steps: int, steps_per_call: int) -> int:
    """Steps the runner times (full calls after the first, warm-up; a short tail call is not timed), as Keras fit
    here."""
    return max(0, steps // steps_per_call - 1) * steps_per_call


def too_few_timed(name: str, steps: int, per_call: int) -> str | None:
    """Why `steps` in compiled calls of `per_call` time too little for a row (at least MIN_TIMED_STEPS in at least
    two timed calls: a standard error needs two), or None."""
    n = timed_steps(steps, per_call)
    if n >= MIN_TIMED_STEPS and n >= 2 * per_call:
        return None
    return (f"{name}: --steps {steps} --steps-per-call {per_call} times only {n} steps (the first call is warm-up, a "
            f"short tail is not timed); need >= {MIN_TIMED_STEPS} steps in >= 2 calls")


def keras_command(setting: Setting, gpus: int, mirrored: bool) -> list[str]:
    """The command line of plain Keras fit for one setting (runner.bench.keras_baseline)."""
    return [sys.executable, "-m", "runner.bench.keras_baseline", "--model", setting.model,
            *(["--variant", setting.variant] if setting.variant else []), "--gpus", str(gpus), "--batch",
            str(setting.batch), "--steps", str(setting.steps), "--data", setting.data, "--chunk",
            str(setting.steps_per_call), *(["--optimizer", setting.optimizer] if setting.optimizer else []),
            *(f"--override={o}" for o in setting.extra),
            *(["--mirrored"] if mirrored else [])]


def keras_job(setting: Setting, gpus: int, mirrored: bool) -> dict:
    """Plain Keras fit in a fresh process; its JSON figures, or {'error': ...}."""
    proc = subprocess.run(keras_command(setting, gpus, mirrored), capture_output=True, text=True,
                          env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"})
    if proc.returncode != 0:
        return {"error": last_line(proc.stderr.strip(), "failed")}
    return with_rate(json.loads(proc.stdout.strip().splitlines()[-1]))


@dataclass(frozen=True)
class Job:
    """One measurement: a runner job (kind single/runner) or a Keras fit (kind keras/keras_mirrored)."""

    kind: str
    gpus: int
    label: str
    strategy: str = ""
    pipeline: str = ""

    @property
    def where(self) -> str:
        return f"{self.label} x{self.gpus}"


@dataclass
class Table:
    """The measured rows of one setting, in measurement order."""

    setting: Setting
    date: str
    rows: list[tuple[Job, dict]] = field(default_factory=list)
    seconds: float = 0.0
    repeats: int = 1

    def rate(self, kind: str) -> float | None:
        """Mean rate (images/s, tokens/s, ...) of the rows of one kind (single: the runner's single device), None if
        none succeeded."""
        rates = [m["rate"] for job, m in self.rows if job.kind == kind and "rate" in m]
        return sum(rates) / len(rates) if rates else None

    @property
    def unit(self) -> str:
        """What the rows' rates count (images, tokens, examples: the data's unit)."""
        return next((m["unit"] for _, m in self.rows if "unit" in m), "images")


class Progress:
    """One stderr line per finished job, with the elapsed time and a naive estimate of the time left."""

    def __init__(self, total: int):
        self.total, self.done, self.start = total, 0, time.perf_counter()

    def run(self, what: str, measure: Callable[[], dict]) -> dict:
        t0 = time.perf_counter()
        metrics = measure()
        self.done += 1
        elapsed = time.perf_counter() - self.start
        left = elapsed / self.done * (self.total - self.done)
        rate = f"{metrics['rate']:,.0f} {metrics['unit']}/s" if "rate" in metrics else "FAILED"
        print(f"[{self.done}/{self.total}] {what}: {rate} ({time.perf_counter() - t0:.1f} s; "
              f"{elapsed / 60:.1f} min elapsed, ~{left / 60:.0f} min left)", file=sys.stderr, flush=True)
        return metrics


def run_one(setting: Setting, job: Job, sweep: Sweep, progress: Progress, round: int = 0) -> dict:
    """One job of one setting in a fresh process, in its `round`: its figures, or {'error': ...}."""
    if job.kind.startswith("keras"):
        run = lambda: keras_job(setting, job.gpus, job.kind == "keras_mirrored")  # noqa: E731
    else:
        overrides = [f"strategy={job.strategy}", f"pipeline={job.pipeline}", f"gpus={job.gpus}"]
        run = lambda: run_job([*overrides, *setting.overrides()], sweep, round)  # noqa: E731
    metrics = progress.run(f"{setting.name} {job.where}", run)
    if "error" not in metrics and "rate" not in metrics:
        metrics = {"error": NO_TIMED_STEPS}
    return metrics


def combine(runs: list[dict]) -> dict:
    """One row from a job's repeats: the median of each figure (peak RSS: the highest), the rate with each round's
    (`rate_runs`, in order) and their count; a failed repeat fails the row. One run is its own row."""
    failed = [m for m in runs if "error" in m]
    if failed or len(runs) == 1:
        return (failed or runs)[0]
    numeric = [k for k in runs[0] if isinstance(runs[0][k], (int, float)) and all(k in m for m in runs)]
    out = {k: statistics.median(m[k] for m in runs) for k in numeric}
    out.update(rate_runs=[m["rate"] for m in runs], repeats=len(runs), unit=runs[0].get("unit", "images"))
    if "peak_rss_mb" in out:
        out["peak_rss_mb"] = max(m["peak_rss_mb"] for m in runs)
    return out


def measure(setting: Setting, jobs: list[Job], sweep: Sweep, progress: Progress, repeats: int = 1) -> Table:
    """Run every job of one setting `repeats` times, each in a fresh process, one round over all jobs at a time
    (so a slow spell of the host hits every row alike); each row is the combination of its job's runs."""
    table, t0 = Table(setting, time.strftime("%Y-%m-%d %H:%M"), repeats=repeats), time.perf_counter()
    runs: dict[Job, list[dict]] = {job: [] for job in jobs}
    for r in range(repeats):
        for job in jobs:
            runs[job].append(run_one(setting, job, sweep, progress, r))
    table.rows = [(job, combine(runs[job])) for job in jobs]
    table.seconds = time.perf_counter() - t0
    return table


def median_range(values: list[float], fmt: str) -> str:
    """`median (low-high)`, or the one value, or '-' when nothing was measured."""
    if not values:
        return "-"
    text = format(statistics.median(values), fmt)
    return text if len(values) == 1 else f"{text} ({format(min(values), fmt)}-{format(max(values), fmt)})"


def medians(runs: list[dict], *figures: tuple[str, str]) -> list[str]:
    """`median_range` of each (key, format) over the runs that measured that figure."""
    return [median_range([m[key] for m in runs if key in m], fmt) for key, fmt in figures]


def cell(m: dict, key: str, fmt: str, scale: float = 1.0) -> str:
    """One figure of a job (over `scale`), or `-` where it failed or has none."""
    return format(m[key] / scale, fmt) if key in m else "-"


def emit(out: list[str], lines: list[str]) -> None:
    """Print lines now (a long grid shows each table as it finishes) and keep them for --out."""
    print("\n".join(lines), flush=True)
    out += lines


def out_problem(path: str) -> str | None:
    """Why --out `path` cannot hold the tables, or None: `paths.unwritable`'s checks, then the file opened for writing
    (and its folder made) before the work, as a check by permission bits alone passes where the kernel refuses
    (root under /proc); a file made only to try it is removed."""
    if problem := unwritable(Path(path), "file"):
        return problem
    existed = Path(path).exists()
    try:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        open(path, "a").close()
    except OSError as e:
        return e.strerror or str(e)
    if not existed:
        Path(path).unlink(missing_ok=True)
    return None


def save(out: list[str], path: str | None) -> None:
    """With --out: the printed lines in that file too; a file that cannot be written (a full disk) is a UserError."""
    if path:
        try:
            Path(path).parent.mkdir(parents=True, exist_ok=True)
            Path(path).write_text("\n".join(out) + "\n")
        except OSError as e:
            raise UserError(f"--out {path} cannot hold the tables: {e.strerror or e}") from None


def failed(errors: list[str], width: int) -> str:
    """` (2 failed: <the first error>)` after a row's name where some of its runs failed; '' where none did."""
    return f" ({len(errors)} failed: {errors[0][:width].replace('|', '/')})" if errors else ""


def stamp() -> str:
    """When and on what the figures below ran: the time, the host CPU and its cores."""
    return f"{time.ctime()}; {host_cpu()}, {os.cpu_count()} cores"
