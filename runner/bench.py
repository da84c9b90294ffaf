"""Benchmarks: every measurement in a fresh process; runner jobs are normal runs, read back from MLflow.

    python -m runner.bench grid [--models mlp,cnn,nin] [--variants tiny,default] [--gpus 1,2,4,8]
        [--strategies mirrored,replicated,parameter_server,single] [--pipelines split,per_tower,sharded]
        [--steps N --steps-per-call K] [--data mnist|synthetic] [--optimizer adam|sgd|momentum|rmsprop]
        [--repeats R] [--out FILE]

runs, for each model/variant, the runner's single device (before and after the grid), plain Keras `fit` on one
device, then for each device count Keras `fit` under MirroredStrategy and every strategy x pipeline (`single` on
1 device only), and prints one table per model/variant: images/s ± standard error over the timed steps, as ratios
to the runner's single-device rate and to Keras fit, the pipeline-alone rate against the step rate, peak RSS and
job overhead (process start to first step); then a summary of the targets of the issue, PASS or FAIL in this run.
With --repeats R every job runs R times, in R rounds over all the jobs, and each row shows the median images/s
and its range (a single run of a millisecond-step job can be a quarter off on a shared host).

    python -m runner.bench strategies [--gpus 2,4] [--model mlp --variant default] [--steps 600]

is the same table for one model on 2 and 4 devices with the data-parallel strategies.

    python -m runner.bench settings [--groups calls,fused,xla,precision,threads,reduce] [--steps N]

measures each speed setting users expect (steps per compiled call, fused optimizer updates, XLA, mixed
precision, host threads, mirrored's cross-device reduction and input feed, freed memory kept for reuse): one row
per value, each a fresh job, as a ratio to the first row of its group (the default), which is measured again at
the end of the group to show the noise.

    python -m runner.bench pipelines [--gpus 1,2,4] [--strategies replicated,mirrored] [--model mlp] [--steps 400]

prints, for each pipeline x strategy x device count, the batches/s of the input pipeline alone and of the full
training step, their ratio, and whether the run is input-bound (pipeline under 3x the step rate).
Runner jobs land in the MLflow experiment `bench_<command>` with their config and devices.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from typing import Callable

from runner.config import OPTIMIZERS

PIPELINES = ("split", "per_tower", "sharded")
DATA_PARALLEL = ("mirrored", "replicated", "parameter_server")
MIN_TIMED_STEPS = 20
# (model, variant) -> (steps, steps per call) when --steps is not given: about 10-20 s of training on one device
# of the 2-core development CPU (the slow variants get fewer, shorter calls); always >= 20 timed steps.
DEFAULT_STEPS = {
    ("mlp", "tiny"): (300, 25), ("mlp", "default"): (600, 50), ("mlp", "chainer"): (600, 50),
    ("cnn", "tiny"): (300, 25), ("cnn", "default"): (120, 10), ("cnn", "paper"): (60, 5),
    ("nin", "tiny"): (300, 25), ("nin", "default"): (60, 5), ("nin", "paper"): (40, 4),
}
# The targets.
KERAS_TARGET = {"mlp": 1.5}  # runner single / Keras fit on one device; other models: 1.0
SCALING_TARGET = {2: 0.9, 4: 0.9, 8: 0.6}  # every data-parallel strategy x pipeline on N devices / runner single
INPUT_TARGET = 3.0  # pipeline alone / training step
OVERHEAD_TARGET_S = 10.0  # process start to first step
RSS_TARGET_MB = 1536.0  # a tiny (smoke) MLP job


def run_job(overrides: list[str], uri: str, experiment: str) -> dict:
    """Run one job in a fresh process; return its final MLflow metrics, or {'error': ...} if it failed."""
    from mlflow.tracking import MlflowClient

    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}
    args = [sys.executable, "-m", "runner", *overrides, f"mlflow.tracking_uri={uri}", f"mlflow.experiment={experiment}"]
    proc = subprocess.run(args, capture_output=True, text=True, env=env)
    match = re.search(r"mlflow run ([0-9a-f]{32})", proc.stdout)
    if proc.returncode != 0 or not match:
        lines = [line for line in proc.stderr.splitlines() if line.strip()]
        return {"error": lines[-1] if lines else f"exit {proc.returncode}"}
    return dict(MlflowClient(uri).get_run(match.group(1)).data.metrics)


def _row(pipeline: str, strategy: str, gpus: int, m: dict) -> str:
    if "error" not in m and "input_batches_per_sec" not in m:
        m = {"error": "no timed steps: raise --steps to a few times --steps-per-call"}
    if "error" in m:
        return f"| {pipeline} | {strategy} | {gpus} | failed: {m['error'][:80]} | | | | |"
    ratio = m["input_batches_per_sec"] / m["step_batches_per_sec"]
    return (
        f"| {pipeline} | {strategy} | {gpus} | {m['input_batches_per_sec']:,.0f} | {m['step_batches_per_sec']:,.0f} "
        f"| {ratio:.1f}x | {'yes' if m['input_bound'] else 'no'} | {m['images_per_sec']:,.0f} |"
    )


def pipelines(args: argparse.Namespace) -> int:
    """The pipeline table: input-alone vs training-step batches/s for every pipeline x strategy x N."""
    from runner.tracking import ensure_experiment, resolve_uri

    uri = resolve_uri(args.tracking_uri)
    ensure_experiment(uri, "bench_pipelines")  # create the store once, before the jobs
    print(f"# pipeline benchmark: model={args.model} steps={args.steps} global batch={args.batch}, {time.ctime()}")
    print("| pipeline | strategy | devices | pipeline alone (batches/s) | training step (batches/s) | ratio "
          "| input-bound | images/s |")
    print("|---|---|---|---|---|---|---|---|")
    failed = 0
    for gpus in args.gpus:
        for strategy in args.strategies:
            for pipeline in args.pipelines:
                overrides = [
                    f"pipeline={pipeline}", f"strategy={strategy}", f"gpus={gpus}", f"model={args.model}",
                    f"model.variant={args.variant}", f"train.steps={args.steps}",
                    f"train.global_batch_size={args.batch}",
                    f"data={args.data}", f"train.steps_per_call={args.steps_per_call}",
                ]
                metrics = run_job(overrides, uri, "bench_pipelines")
                failed += "error" in metrics
                print(_row(pipeline, strategy, gpus, metrics), flush=True)
    return 1 if failed else 0


@dataclass(frozen=True)
class Setting:
    """What every job of one table shares: model, variant, steps, global batch, data, optimizer."""

    model: str
    variant: str
    steps: int
    steps_per_call: int
    batch: int
    data: str
    test_limit: int | None = None
    optimizer: str = "adam"

    @property
    def name(self) -> str:
        return f"{self.model}/{self.variant}"

    def overrides(self) -> list[str]:
        """The runner's config overrides for this setting."""
        out = [f"model={self.model}", f"model.variant={self.variant}", f"train.steps={self.steps}",
               f"train.global_batch_size={self.batch}", f"data={self.data}",
               f"train.steps_per_call={self.steps_per_call}", f"train.optimizer={self.optimizer}"]
        return out + ([f"data.test_limit={self.test_limit}"] if self.test_limit else [])


def timed_steps(steps: int, steps_per_call: int, warmup_calls: int = 1) -> int:
    """Steps the runner times (full calls after the warm-up; a short tail call is not timed), as Keras fit here."""
    return max(0, steps // steps_per_call - warmup_calls) * steps_per_call


def keras_command(setting: Setting, gpus: int, mirrored: bool) -> list[str]:
    """The command line of plain Keras fit for one setting (runner.keras_baseline)."""
    cmd = [sys.executable, "-m", "runner.keras_baseline", "--model", setting.model, "--variant", setting.variant,
           "--gpus", str(gpus), "--batch", str(setting.batch), "--steps", str(setting.steps), "--data", setting.data,
           "--chunk", str(setting.steps_per_call), "--optimizer", setting.optimizer]
    return cmd + (["--mirrored"] if mirrored else [])


def keras_job(setting: Setting, gpus: int, mirrored: bool) -> dict:
    """Plain Keras fit in a fresh process; its JSON figures, or {'error': ...}."""
    proc = subprocess.run(keras_command(setting, gpus, mirrored), capture_output=True, text=True,
                          env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"})
    if proc.returncode != 0:
        return {"error": (proc.stderr.strip().splitlines() or ["failed"])[-1]}
    return json.loads(proc.stdout.strip().splitlines()[-1])


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
        """Mean images/s of the rows of one kind (single: the runner's single device), None if none succeeded."""
        rates = [m["images_per_sec"] for job, m in self.rows if job.kind == kind and "images_per_sec" in m]
        return sum(rates) / len(rates) if rates else None


def plan(strategies: list[str], pipelines: list[str], gpus: list[int]) -> list[Job]:
    """The jobs of one table, in the order they run: single device and Keras fit first, single again last."""
    jobs = [Job("single", 1, "runner single (before the grid)", "single", "split"), Job("keras", 1, "keras fit")]
    for n in gpus:
        jobs.append(Job("keras_mirrored", n, "keras fit + MirroredStrategy"))
        for strategy in strategies:
            if strategy == "single" and n != 1:
                continue  # single takes one device
            jobs += [Job("runner", n, f"runner {strategy} / {p}", strategy, p) for p in pipelines]
    return jobs + [Job("single", 1, "runner single (after the grid)", "single", "split")]


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
        rate = f"{metrics['images_per_sec']:,.0f} images/s" if "images_per_sec" in metrics else "FAILED"
        print(f"[{self.done}/{self.total}] {what}: {rate} ({time.perf_counter() - t0:.1f} s; "
              f"{elapsed / 60:.1f} min elapsed, ~{left / 60:.0f} min left)", file=sys.stderr, flush=True)
        return metrics


def run_one(setting: Setting, job: Job, uri: str, experiment: str, progress: Progress) -> dict:
    """One job of one setting in a fresh process: its figures, or {'error': ...}."""
    if job.kind.startswith("keras"):
        run = lambda: keras_job(setting, job.gpus, job.kind == "keras_mirrored")  # noqa: E731
    else:
        overrides = [f"strategy={job.strategy}", f"pipeline={job.pipeline}", f"gpus={job.gpus}"]
        run = lambda: run_job([*overrides, *setting.overrides()], uri, experiment)  # noqa: E731
    metrics = progress.run(f"{setting.name} {job.where}", run)
    if "error" not in metrics and "images_per_sec" not in metrics:
        metrics = {"error": "no timed steps: raise --steps to a few times --steps-per-call"}
    return metrics


def combine(runs: list[dict]) -> dict:
    """One row from a job's repeats: the median of each figure (peak RSS: the highest), images/s with its lowest
    and highest; a failed repeat fails the row. One run is its own row."""
    failed = [m for m in runs if "error" in m]
    if failed or len(runs) == 1:
        return (failed or runs)[0]
    numeric = [k for k in runs[0] if isinstance(runs[0][k], (int, float)) and all(k in m for m in runs)]
    out = {k: statistics.median(m[k] for m in runs) for k in numeric}
    rates = [m["images_per_sec"] for m in runs]
    out.update(images_per_sec_low=min(rates), images_per_sec_high=max(rates), repeats=len(runs))
    if "peak_rss_mb" in out:
        out["peak_rss_mb"] = max(m["peak_rss_mb"] for m in runs)
    return out


def measure(setting: Setting, jobs: list[Job], uri: str, experiment: str, progress: Progress,
            repeats: int = 1) -> Table:
    """Run every job of one setting `repeats` times, each in a fresh process, one round over all jobs at a time
    (so a slow spell of the host hits every row alike); each row is the combination of its job's runs."""
    table, t0 = Table(setting, time.strftime("%Y-%m-%d %H:%M"), repeats=repeats), time.perf_counter()
    runs: dict[Job, list[dict]] = {job: [] for job in jobs}
    for _ in range(repeats):
        for job in jobs:
            runs[job].append(run_one(setting, job, uri, experiment, progress))
    table.rows = [(job, combine(runs[job])) for job in jobs]
    table.seconds = time.perf_counter() - t0
    return table


COLUMNS = ("what", "devices", "images/s ± stderr", "timed steps", "x runner single", "x keras fit",
           "pipeline alone (batches/s)", "pipeline / step", "peak RSS (MB)", "overhead (s)")


def _ratio(value: float, base: float | None) -> str:
    return f"{value / base:.2f}" if base else "-"


def format_row(job: Job, m: dict, table: Table) -> str:
    """One table row; a failed job shows its error, a job timed over fewer than 20 steps is flagged."""
    if "error" in m:
        return f"| {job.label} | {job.gpus} | failed: {m['error'][:100].replace('|', '/')} |" + " |" * 7
    ips, steps = m["images_per_sec"], int(m.get("timed_steps", 0))
    spread = (f"({m['images_per_sec_low']:,.0f}-{m['images_per_sec_high']:,.0f})" if "repeats" in m
              else f"± {m['images_per_sec_stderr']:,.0f}")
    cells = [job.label, str(job.gpus), f"{ips:,.0f} {spread}",
             f"{steps}" + (f" (under {MIN_TIMED_STEPS}!)" if steps < MIN_TIMED_STEPS else ""),
             _ratio(ips, table.rate("single")), _ratio(ips, table.rate("keras"))]
    if "input_batches_per_sec" in m:
        pipeline = m["input_batches_per_sec"]
        cells += [f"{pipeline:,.0f}", f"{pipeline / m['step_batches_per_sec']:.1f}x"]
    else:
        cells += ["-", "-"]
    cells += [f"{m['peak_rss_mb']:,.0f}" if "peak_rss_mb" in m else "-",
              f"{m['seconds_to_first_step']:.1f}" if "seconds_to_first_step" in m else "-"]
    return "| " + " | ".join(cells) + " |"


def format_table(table: Table) -> list[str]:
    """The header naming the setting, the two bases of the ratios, and the rows."""
    s, single, keras = table.setting, table.rate("single"), table.rate("keras")
    columns = list(COLUMNS)
    if table.repeats > 1:
        columns[2] = f"images/s, median (lowest-highest) of {table.repeats} runs"
    each = (f" Each row is the median of {table.repeats} runs of its job, run in {table.repeats} rounds over all "
            "the jobs." if table.repeats > 1 else "")
    return [
        f"## {s.name}: global batch {s.batch}, {s.steps} steps ({s.steps_per_call} per call, the first call "
        f"untimed), data {s.data}, optimizer {s.optimizer}, {table.date}",
        "",
        f"x runner single: over {single or 0:,.0f} images/s (the mean of the two runner single rows); "
        f"x keras fit: over {keras or 0:,.0f} images/s. {len(table.rows)} jobs in {table.seconds:.0f} s.{each}",
        "",
        "| " + " | ".join(columns) + " |",
        "|" + "---|" * len(columns),
        *(format_row(job, m, table) for job, m in table.rows),
        "",
    ]


def check(name: str, items: list[tuple[str, float | None]], holds: Callable[[float], bool], worst: str,
          fmt: Callable[[float], str]) -> str:
    """`- PASS|FAIL name: k of n hold; <worst> value (where)`; a failed job (None) does not hold."""
    if not items:
        return f"- n/a {name}: not measured in this run"
    ok = [v is not None and holds(v) for _, v in items]
    measured = [(v, where) for where, v in items if v is not None]
    text = f"- {'PASS' if all(ok) else 'FAIL'} {name}: {sum(ok)} of {len(ok)} hold"
    if measured:
        value, where = (max if worst == "highest" else min)(measured, key=lambda item: item[0])  # first of ties
        text += f"; {worst} {fmt(value)} ({where})"
    failed = len(items) - len(measured)
    return text + (f"; {failed} failed" if failed else "")


def _ratio_or_none(m: dict, base: float | None) -> float | None:
    return m["images_per_sec"] / base if base and "images_per_sec" in m else None


def table_targets(table: Table) -> list[str]:
    """Per model/variant: runner single vs Keras fit, and every data-parallel strategy x pipeline per N."""
    s, single, keras = table.setting, table.rate("single"), table.rate("keras")
    need = KERAS_TARGET.get(s.model, 1.0)
    vs_keras = [("runner single / keras fit", single / keras if single and keras else None)]
    lines = [check(f"{s.name}: runner 1 device >= {need}x keras fit", vs_keras, lambda v: v >= need, "lowest",
                   lambda v: f"{v:.2f}x")]
    for n, floor in SCALING_TARGET.items():
        items = [(f"{job.strategy}/{job.pipeline}", _ratio_or_none(m, single)) for job, m in table.rows
                 if job.kind == "runner" and job.gpus == n and job.strategy in DATA_PARALLEL]
        if items:
            lines.append(check(f"{s.name}: every data-parallel strategy x pipeline at {n} devices >= {floor}x "
                               "runner single", items, lambda v, f=floor: v >= f, "lowest", lambda v: f"{v:.2f}x"))
    return lines


def _items(tables: list[Table], value: Callable[[dict], float | None], kinds: tuple[str, ...],
           only: Callable[[Setting], bool] = lambda s: True) -> list[tuple[str, float | None]]:
    return [(f"{t.setting.name} {job.where}", value(m)) for t in tables if only(t.setting)
            for job, m in t.rows if job.kind in kinds]


def _get(key: str) -> Callable[[dict], float | None]:
    return lambda m: m.get(key)


def targets(tables: list[Table]) -> list[str]:
    """The summary block: each target of the issue and whether it holds in this run."""
    runner_kinds = ("single", "runner")
    lines = ["## Targets (this run)", ""]
    for table in tables:
        lines += table_targets(table)
    pipeline = _items(tables, lambda m: m["input_batches_per_sec"] / m["step_batches_per_sec"]
                      if "input_batches_per_sec" in m else None, runner_kinds)
    lines.append(check(f"pipeline alone >= {INPUT_TARGET:g}x the step rate, every runner job", pipeline,
                       lambda v: v >= INPUT_TARGET, "lowest", lambda v: f"{v:.1f}x"))
    overhead = _items(tables, _get("seconds_to_first_step"), runner_kinds)
    lines.append(check(f"job overhead (process start to first step) <= {OVERHEAD_TARGET_S:g} s, every runner job",
                       overhead, lambda v: v <= OVERHEAD_TARGET_S, "highest", lambda v: f"{v:.1f} s"))
    rss = _items(tables, _get("peak_rss_mb"), runner_kinds, lambda s: s.model == "mlp" and s.variant == "tiny")
    lines.append(check(f"peak RSS of a tiny (smoke) MLP runner job <= {RSS_TARGET_MB:g} MB, any devices", rss,
                       lambda v: v <= RSS_TARGET_MB, "highest", lambda v: f"{v:,.0f} MB"))
    steps = _items(tables, _get("timed_steps"), ("single", "runner", "keras", "keras_mirrored"))
    lines.append(check(f"at least {MIN_TIMED_STEPS} timed steps after warm-up, every job", steps,
                       lambda v: v >= MIN_TIMED_STEPS, "fewest", lambda v: f"{v:.0f}"))
    return lines


def _values(option: str, default: str, *others: str) -> list[tuple[str, list[str]]]:
    """(label, overrides) rows of one option: its default first, then the others."""
    return [(f"{option}={default} (default)", []), *[(f"{option}={v}", [f"{option}={v}"]) for v in others]]


_MLP = ["model=mlp", "model.variant=default", "train.steps=600", "train.steps_per_call=50"]
_CNN = ["model=cnn", "model.variant=default", "train.steps=120", "train.steps_per_call=10"]
_MLP_TINY = ["model=mlp", "model.variant=tiny", "train.steps=300", "train.steps_per_call=25"]
# TensorFlow's generator datasets (behind tf.distribute's per-device input iterators) are what set the malloc trap.
_DISTRIBUTE = ["strategy=mirrored", "gpus=2", "strategy.input=distribute"]
# group -> (what, where, the group's job, [(value, its overrides)]); the first value is the default.
SPEED_SETTINGS = {
    "calls": ("steps per compiled call", "mlp/default, single", _MLP,
              _values("train.steps_per_call", "50", "10", "1")),
    "fused": ("fused optimizer update", "mlp/default, replicated x4", [*_MLP, "strategy=replicated", "gpus=4"],
              _values("train.fused_optimizer", "true", "false")),
    "fused1": ("fused optimizer update", "mlp/default, single", _MLP,
               _values("train.fused_optimizer", "true", "false")),
    "xla": ("XLA compilation", "mlp/default, single", _MLP, _values("train.jit_compile", "false", "true")),
    "xla_cnn": ("XLA compilation", "cnn/default, single", _CNN, _values("train.jit_compile", "false", "true")),
    "precision": ("mixed precision", "mlp/default, single", _MLP,
                  _values("train.precision", "float32", "mixed_bfloat16")),
    "precision_cnn": ("mixed precision", "cnn/default, single", _CNN,
                      _values("train.precision", "float32", "mixed_bfloat16")),
    "threads": ("host threads", "mlp/default, replicated x2", [*_MLP, "strategy=replicated", "gpus=2"], [
        ("train.intra_op_threads=-1 (default: cores / devices)", []),
        ("train.intra_op_threads=0 (TensorFlow's default)", ["train.intra_op_threads=0"]),
        ("train.intra_op_threads=2", ["train.intra_op_threads=2"]),
        ("train.inter_op_threads=1", ["train.inter_op_threads=1"]),
        ("train.inter_op_threads=4", ["train.inter_op_threads=4"])]),
    "threads1": ("host threads", "mlp/tiny, single", _MLP_TINY, [
        ("train.intra_op_threads=-1 (default: TensorFlow's own on one device)", []),
        ("train.intra_op_threads=1", ["train.intra_op_threads=1"])]),
    "malloc": ("freed memory kept for reuse", "mlp/default, mirrored x2, tf.distribute input",
               [*_MLP, *_DISTRIBUTE], _values("train.reuse_freed_memory", "true", "false")),
    "malloc_cnn": ("freed memory kept for reuse", "cnn/default, mirrored x2, tf.distribute input",
                   [*_CNN, *_DISTRIBUTE], _values("train.reuse_freed_memory", "true", "false")),
    "input": ("mirrored's input", "mlp/tiny, mirrored x2", [*_MLP_TINY, "strategy=mirrored", "gpus=2"],
              _values("strategy.input", "towers", "distribute")),
    "input4": ("mirrored's input", "mlp/default, mirrored x4", [*_MLP, "strategy=mirrored", "gpus=4"],
               _values("strategy.input", "towers", "distribute")),
    "reduce": ("cross-device reduction", "mlp/default, mirrored x4", [*_MLP, "strategy=mirrored", "gpus=4"], [
        ("strategy.cross_device_ops=auto (default: reduce_to_one_device on CPUs)", []),
        ("strategy.cross_device_ops=tensorflow (collective ring)", ["strategy.cross_device_ops=tensorflow"]),
        ("strategy.cross_device_ops=hierarchical_copy", ["strategy.cross_device_ops=hierarchical_copy"])]),
}


def _machine() -> str:
    """What the figures below ran on: the host CPU and its cores (the jobs read the same; see devices.host_cpu)."""
    from runner.devices import host_cpu

    return f"{host_cpu()}, {os.cpu_count()} cores"


def speed_settings(args: argparse.Namespace) -> int:
    """One table: each setting's values side by side, images/s as a ratio to the group's default."""
    from runner.tracking import ensure_experiment, resolve_uri

    uri, experiment = resolve_uri(args.tracking_uri), "bench_settings"
    ensure_experiment(uri, experiment)
    out: list[str] = []
    emit(out, [f"# benchmark settings: each job a fresh process; {time.ctime()}; {_machine()}", "",
               "| setting | model, strategy | value | images/s ± stderr | x default | test accuracy |",
               "|---|---|---|---|---|---|"])
    failed = False
    for group in args.groups:
        what, where, job, values = SPEED_SETTINGS[group]
        base = None  # the default's images/s (the group's first row); None if that job failed
        for i, (label, extra) in enumerate([*values, (f"{values[0][0]}, again", values[0][1])]):
            steps = [f"train.steps={args.steps}"] if args.steps else []
            m = run_job([*job, *extra, *steps, "train.checkpoint_every=0", f"data.test_limit={args.test_limit}"],
                        uri, experiment)
            if "error" in m or "images_per_sec" not in m:
                failed = True
                emit(out, [f"| {what} | {where} | `{label}` | failed: {m.get('error', 'no timed steps')[:80]} | | |"])
                continue
            base = m["images_per_sec"] if i == 0 else base
            rate = f"{m['images_per_sec']:,.0f} ± {m['images_per_sec_stderr']:,.0f}"
            ratio = f"{m['images_per_sec'] / base:.2f}" if base else "-"
            emit(out, [f"| {what} | {where} | `{label}` | {rate} | {ratio} "
                       f"| {m['test_accuracy']:.4f} |"])
    if args.out:
        with open(args.out, "w") as f:
            f.write("\n".join(out) + "\n")
    return 1 if failed else 0


def settings(args: argparse.Namespace) -> list[Setting]:
    """One setting per model x variant, with its steps (given, or DEFAULT_STEPS)."""
    out = []
    for model in args.models:
        for variant in args.variants:
            steps, per_call = DEFAULT_STEPS.get((model, variant), (120, 10))
            out.append(Setting(model, variant, args.steps or steps, args.steps_per_call or per_call, args.batch,
                               args.data, args.test_limit, args.optimizer))
    return out


def emit(out: list[str], lines: list[str]) -> None:
    """Print lines now (a long grid shows each table as it finishes) and keep them for --out."""
    print("\n".join(lines), flush=True)
    out += lines


def grid(args: argparse.Namespace) -> int:
    """Every model/variant x strategy x pipeline x N beside the runner's single device and Keras fit."""
    from runner.tracking import ensure_experiment, resolve_uri

    uri, experiment = resolve_uri(args.tracking_uri), f"bench_{args.command}"
    ensure_experiment(uri, experiment)  # create the store once, before the jobs
    jobs, todo = plan(args.strategies, args.pipelines, args.gpus), settings(args)
    runner_jobs = sum(job.kind in ("single", "runner") for job in jobs) * len(todo) * args.repeats
    total = len(jobs) * len(todo) * args.repeats
    rounds = f" in {args.repeats} rounds" if args.repeats > 1 else ""
    out: list[str] = []
    emit(out, [f"# benchmark {args.command}: {total} jobs{rounds} ({runner_jobs} runner, {total - runner_jobs} keras "
               f"fit), each in a fresh process; {time.ctime()}; {_machine()}", ""])
    progress, tables = Progress(total), []
    for setting in todo:
        tables.append(measure(setting, jobs, uri, experiment, progress, args.repeats))
        emit(out, format_table(tables[-1]))
    emit(out, targets(tables))
    if args.out:
        with open(args.out, "w") as f:
            f.write("\n".join(out) + "\n")
    return 1 if any("error" in m for t in tables for _, m in t.rows) else 0


def _ints(text: str) -> list[int]:
    return [int(v) for v in text.split(",")]


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text} is not a positive count")
    return value


def _names(text: str) -> list[str]:
    return [v for v in text.split(",") if v]


def _grid_parser(sub: argparse._SubParsersAction, name: str, full: bool) -> argparse.ArgumentParser:
    """`grid` (the whole issue grid by default) and `strategies` (one model, 2 and 4 devices) share the options."""
    helps = {"grid": "every model/variant x strategy x pipeline x N vs single device and Keras fit, with targets",
             "strategies": "data-parallel strategies x pipelines vs single device and Keras fit, one model"}
    g = sub.add_parser(name, help=helps[name])
    g.add_argument("--models", "--model", dest="models", type=_names,
                   default=["mlp", "cnn", "nin"] if full else ["mlp"])
    g.add_argument("--variants", "--variant", dest="variants", type=_names,
                   default=["tiny", "default"] if full else ["default"])
    g.add_argument("--gpus", type=_ints, default=[1, 2, 4, 8] if full else [2, 4])
    g.add_argument("--strategies", type=_names, default=[*DATA_PARALLEL, "single"] if full else list(DATA_PARALLEL))
    g.add_argument("--steps", type=int, default=None, help="steps per job (default: per model/variant)")
    g.add_argument("--steps-per-call", type=int, default=None, help="steps per compiled call (default: per model)")
    g.add_argument("--test-limit", type=int, default=None, help="evaluate runner jobs on the first N test images")
    g.add_argument("--repeats", type=_positive, default=1,
                   help="run every job this many times, in rounds; rows show the median and the range")
    g.add_argument("--optimizer", default="adam", choices=OPTIMIZERS,
                   help="for runner jobs and Keras fit alike (default adam, the runner's default)")
    g.add_argument("--out", default=None, help="also write the markdown to this file")
    return g


def _check_steps(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """At least 20 timed steps in at least two timed calls (a standard error needs two), or exit 2."""
    for s in settings(args) if args.command != "pipelines" else []:
        n = timed_steps(s.steps, s.steps_per_call)
        if n < MIN_TIMED_STEPS or n < 2 * s.steps_per_call:
            parser.error(f"{s.name}: --steps {s.steps} --steps-per-call {s.steps_per_call} times only {n} steps "
                         f"(the first call is warm-up, a short tail is not timed); need >= {MIN_TIMED_STEPS} steps "
                         "in >= 2 calls")


def _check_settings_steps(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """With --steps: every row of the chosen groups still times >= 20 steps in >= 2 calls, or exit 2."""
    for group in args.groups if args.steps else []:
        _, _, job, values = SPEED_SETTINGS[group]
        for label, extra in values:
            per_call = int([o for o in [*job, *extra] if o.startswith("train.steps_per_call=")][-1].split("=")[1])
            n = timed_steps(args.steps, per_call)
            if n < MIN_TIMED_STEPS or n < 2 * per_call:
                parser.error(f"--steps {args.steps} times only {n} steps of `{label}` ({per_call} per call; the "
                             f"first call is warm-up); need >= {MIN_TIMED_STEPS} steps in >= 2 calls")


def main(argv: list[str] | None = None) -> int:
    """Command line of the benchmarks."""
    parser = argparse.ArgumentParser(prog="python -m runner.bench", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("pipelines", help="input pipeline alone vs training step, per pipeline x strategy x N")
    p.add_argument("--gpus", type=_ints, default=[1, 2, 4])
    p.add_argument("--strategies", type=_names, default=["replicated", "mirrored"])
    p.add_argument("--model", default="mlp")
    p.add_argument("--variant", default="default")
    p.add_argument("--steps", type=int, default=400)
    p.add_argument("--steps-per-call", type=int, default=50)
    for parsed in (p, _grid_parser(sub, "grid", True), _grid_parser(sub, "strategies", False)):
        parsed.add_argument("--pipelines", type=_names, default=list(PIPELINES))
        parsed.add_argument("--batch", type=int, default=128)
        parsed.add_argument("--data", default="mnist", choices=["mnist", "synthetic"])
        parsed.add_argument("--tracking-uri", default=None)
    st = sub.add_parser("settings", help="each speed setting's values side by side, as ratios to the default")
    st.add_argument("--groups", type=_names, default=list(SPEED_SETTINGS), help=f"of {','.join(SPEED_SETTINGS)}")
    st.add_argument("--steps", type=int, default=None, help="steps per job (default: the group's)")
    st.add_argument("--test-limit", type=int, default=1000, help="evaluate on the first N test images")
    st.add_argument("--tracking-uri", default=None)
    st.add_argument("--out", default=None, help="also write the markdown to this file")
    args = parser.parse_args(argv)
    if args.command == "settings":
        unknown = sorted(set(args.groups) - set(SPEED_SETTINGS))
        if unknown:
            parser.error(f"unknown settings group {unknown[0]!r}; choose from {', '.join(SPEED_SETTINGS)}")
        _check_settings_steps(parser, args)
        return speed_settings(args)
    _check_steps(parser, args)
    return pipelines(args) if args.command == "pipelines" else grid(args)


if __name__ == "__main__":
    sys.exit(main())
