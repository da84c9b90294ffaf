"""`grid` and `strategies`: every model/variant x strategy x pipeline x device count beside the runner's single device
and Keras fit, one table per model/variant, and whether each target holds in this run."""

from __future__ import annotations

import argparse
from typing import Callable

from runner.bench.jobs import MIN_TIMED_STEPS, Job, Progress, Setting, Table, cell, emit, measure, save
from runner.bench.jobs import setting_for, stamp, sweep
from runner.errors import UserError
from runner.measure.hooks import INPUT_BOUND_RATIO
from runner.models import variants
from runner.report import prediction
from runner.report.table import markdown
from runner.strategies import baseline, data_parallel, sharding

# The default grid's models (`grid --models`): the built-in MNIST examples the issue asks about; any registered
# model can be named (every one, `--models` with MODELS.names(), is several times the jobs).
GRID_MODELS = ("mlp", "cnn", "nin")
# The strategies of one process that train a model replica per device, from the registry's roles.
DATA_PARALLEL = tuple(data_parallel())
RUNNER_KINDS = ("baseline", "runner")  # the Job kinds the runner runs (the others: Keras fit)

# The targets.
KERAS_TARGET = {"mlp": 1.5}  # runner single / Keras fit on one device; other models (and a user's): keras_target
SCALING_TARGET = {2: 0.9, 4: 0.9, 8: 0.6}  # every data-parallel strategy x pipeline on N devices / runner single
FLOOR_TARGET = 1.15  # one-device step / its floor (runner/measure/floor.py) at the model's default batch
INPUT_TARGET = float(INPUT_BOUND_RATIO)  # pipeline alone / training step: the bound a run itself warns at
OVERHEAD_TARGET_S = 10.0  # process start to first step
RSS_TARGET_MB = 1536.0  # a tiny (smoke) MLP job


def plan(strategies: list[str], pipelines: list[str], gpus: list[int]) -> list[Job]:
    """The jobs of one table, in the order they run: single device and Keras fit first, single again last."""
    base = baseline()
    jobs = [Job("baseline", 1, f"runner {base} (before the grid)", base, "split"), Job("keras", 1, "keras fit")]
    for n in gpus:
        jobs.append(Job("keras_mirrored", n, "keras fit + MirroredStrategy"))
        for strategy in strategies:
            if strategy == base and n != 1:
                continue  # the baseline takes one device
            jobs += [Job("runner", n, f"runner {strategy} / {p}", strategy, p) for p in pipelines]
    return jobs + [Job("baseline", 1, f"runner {base} (after the grid)", base, "split")]


COLUMNS = ("what", "devices", "{unit}/s ± stderr", "predicted {unit}/s", "timed steps", "x runner {base}",
           "x keras fit", "step / floor", "MFU", "optimizer state / device (MB)", "pipeline alone (batches/s)",
           "pipeline / step", "peak RSS (MB)", "overhead (s)")


def _ratio(value: float, base: float | None) -> str:
    return f"{value / base:.2f}" if base else "-"


def format_row(job: Job, m: dict, table: Table) -> list[str]:
    """One table row's cells; a failed job shows its error, a job timed over fewer than 20 steps is flagged."""
    if "error" in m:
        return [job.label, str(job.gpus), f"failed: {m['error'][:100].replace('|', '/')}", *[""] * (len(COLUMNS) - 3)]
    ips, steps, runs = m["rate"], int(m.get("timed_steps", 0)), m.get("rate_runs")
    spread = f"({min(runs):,.0f}-{max(runs):,.0f})" if runs else f"± {m['rate_stderr']:,.0f}"
    alone = "input_batches_per_sec" in m
    disturbed = f" (calibration disturbed: others used {m['predicted_disturbed']:.0%} of the CPUs)" \
        if "predicted_disturbed" in m else ""
    return [job.label, str(job.gpus), f"{ips:,.0f} {spread}", cell(m, "predicted_rate", ",.0f") + disturbed,
            f"{steps}" + (f" (under {MIN_TIMED_STEPS}!)" if steps < MIN_TIMED_STEPS else ""),
            _ratio(ips, table.rate("baseline")), _ratio(ips, table.rate("keras")),
            cell(m, "step_time_over_floor", ".2f"), cell(m, "mfu", ".1%"),
            cell(m, "optimizer_state_bytes_per_device", ".2f", 2**20), cell(m, "input_batches_per_sec", ",.0f"),
            f"{m['input_batches_per_sec'] / m['step_batches_per_sec']:.1f}x" if alone else "-",
            cell(m, "peak_rss_mb", ",.0f"), cell(m, "seconds_to_first_step", ".1f")]


def format_table(table: Table) -> list[str]:
    """The header naming the setting, the two bases of the ratios, and the rows."""
    s, single, keras = table.setting, table.rate("baseline"), table.rate("keras")
    unit = table.unit
    columns = [c.format(unit=unit, base=baseline()) for c in COLUMNS]  # images/s, tokens/s, examples/s: the data's
    if table.repeats > 1:
        columns[2] = f"{unit}/s, median (lowest-highest) of {table.repeats} runs"
    each = (f" Each row is the median of {table.repeats} runs of its job, run in {table.repeats} rounds over all "
            "the jobs." if table.repeats > 1 else "")
    return [
        f"## {s.name}: global batch {s.batch}, {s.steps} steps ({s.steps_per_call} per call, the first call "
        f"untimed), data {s.data}, optimizer {s.optimizer}, {table.date}",
        "",
        f"x runner {baseline()}: over {single or 0:,.0f} {unit}/s (the mean of the two runner {baseline()} rows); "
        f"x keras fit: over {keras or 0:,.0f} {unit}/s. {len(table.rows)} jobs in {table.seconds:.0f} s.{each}",
        "",
        *markdown(columns, [format_row(job, m, table) for job, m in table.rows]),
        "",
    ]


def keras_target(setting: Setting) -> float:
    """Runner single / Keras fit on one device that `setting` must reach: the built-in model's own, not a user's."""
    return 1.0 if setting.extra else KERAS_TARGET.get(setting.model, 1.0)


def check(name: str, items: list[tuple[str, float | None]], holds: Callable[[float], bool], worst: str,
          fmt: str = "{:.2f}x") -> str:
    """`- PASS|FAIL name: k of n hold; <worst> value (where)`, the value shown by `fmt`; a failed job (None) does not
    hold."""
    if not items:
        return f"- n/a {name}: not measured in this run"
    ok = [v is not None and holds(v) for _, v in items]
    measured = [(v, where) for where, v in items if v is not None]
    text = f"- {'PASS' if all(ok) else 'FAIL'} {name}: {sum(ok)} of {len(ok)} hold"
    if measured:
        value, where = (max if worst == "highest" else min)(measured, key=lambda item: item[0])  # first of ties
        text += f"; {worst} {fmt.format(value)} ({where})"
    failed = len(items) - len(measured)
    return text + (f"; {failed} failed" if failed else "")


def predict_rows(table: Table) -> None:
    """Add the cost model's prediction (runner/predict/) to every runner row of the table, calibrating this machine
    now, after the table's jobs, where the cache lacks it."""
    from runner.predict.grid import predict_all

    rows = [(job, m) for job, m in table.rows if job.kind in RUNNER_KINDS and "error" not in m]
    combos = [[f"strategy={job.strategy}", f"pipeline={job.pipeline}", f"gpus={job.gpus}", *table.setting.overrides()]
              for job, _ in rows]
    for (_, m), outcome in zip(rows, predict_all(combos)):
        if outcome.prediction is not None:
            m["predicted_rate"] = outcome.prediction.rate
            if outcome.disturbed:  # its calibration measured under others' load: marked in the row
                m["predicted_disturbed"] = outcome.disturbed


def prediction_lines(table: Table) -> list[str]:
    """Per device count: how the predictions fared against the measured rows (runner/report/prediction.py), a row's
    repeats by their rates in round order."""
    groups = prediction.grouped(
        (f"{table.setting.name} x{job.gpus}", f"{job.strategy}/{job.pipeline}", m["predicted_rate"], r)
        for job, m in sorted(table.rows, key=lambda row: row[0].gpus) if job.kind == "runner" and "predicted_rate" in m
        for r in m.get("rate_runs", [m["rate"]]))
    return [f"- {text}" for text in prediction.group_lines(groups)]


def table_targets(table: Table) -> list[str]:
    """Per model/variant: runner single vs Keras fit, and every data-parallel strategy x pipeline per N."""
    s, single, keras = table.setting, table.rate("baseline"), table.rate("keras")
    need = keras_target(s)
    vs_keras = [(f"runner {baseline()} / keras fit", single / keras if single and keras else None)]
    lines = [check(f"{s.name}: runner 1 device >= {need}x keras fit", vs_keras, lambda v: v >= need, "lowest")]
    for n, floor in SCALING_TARGET.items():
        items = [(f"{job.strategy}/{job.pipeline}", m["rate"] / single if single and "rate" in m else None)
                 for job, m in table.rows if job.kind == "runner" and job.gpus == n and job.strategy in DATA_PARALLEL]
        if items:
            lines.append(check(f"{s.name}: every data-parallel strategy x pipeline at {n} devices >= {floor}x "
                               f"runner {baseline()}", items, lambda v, f=floor: v >= f, "lowest"))
    return lines + prediction_lines(table)


def sharded_update_targets(table: Table) -> list[str]:
    """Each strategy that shards the weight update against the one whose step it shards (`StrategyBase.unsharded`,
    same pipeline and N), its optimizer state per device against one device's, and the one-device step against the
    step's own floor (runner/measure/floor.py)."""
    s, rows = table.setting, {(job.strategy, job.pipeline, job.gpus): m for job, m in table.rows
                              if job.kind == "runner"}
    single = [m for job, m in table.rows if job.kind == "baseline"]
    key = "optimizer_state_bytes_per_device"
    state = next((m[key] for m in single if key in m), None)
    lines = []
    for sharded, unsharded in ((n, sharding(n)) for n in DATA_PARALLEL if sharding(n)):
        mine = [(f"{pipeline} x{n}", m, n, rows.get((unsharded, pipeline, n)))
                for (strategy, pipeline, n), m in rows.items() if strategy == sharded]
        versus = [(where, m["rate"] / other["rate"] if "rate" in m and "rate" in other else None)
                  for where, m, _, other in mine if other is not None]  # a pair this run has (--strategies may not)
        shares = [(where, m[key] * n / state if m.get(key) and state else None) for where, m, n, _ in mine]
        lines += [check(f"{s.name}: {sharded} >= {unsharded}, same pipeline and devices", versus, lambda v: v >= 1.0,
                        "lowest"),
                  check(f"{s.name}: {sharded} optimizer state per device x N <= one device's + 1%", shares,
                        lambda v: v <= 1.01, "highest", "{:.3f}")]
    floors = [(f"runner {baseline()}", m.get("step_time_over_floor")) for m in single]
    return lines + [check(f"{s.name}: runner {baseline()} step <= {FLOOR_TARGET}x its floor", floors,
                          lambda v: v <= FLOOR_TARGET, "highest")]


def _items(tables: list[Table], value: str | Callable[[dict], float | None], kinds: tuple[str, ...],
           only: Callable[[Setting], bool] = lambda s: True) -> list[tuple[str, float | None]]:
    """(where, figure) of every job of those kinds; `value` a figure's key or how to make it from a job's figures."""
    get = value if callable(value) else lambda m: m.get(value)
    return [(f"{t.setting.name} {job.where}", get(m)) for t in tables if only(t.setting)
            for job, m in t.rows if job.kind in kinds]


def targets(tables: list[Table]) -> list[str]:
    """The summary block: each target of the issue and whether it holds in this run."""
    lines = ["## Targets (this run)", ""]
    for table in tables:
        lines += table_targets(table) + sharded_update_targets(table)
    pipeline = _items(tables, lambda m: m["input_batches_per_sec"] / m["step_batches_per_sec"]
                      if "input_batches_per_sec" in m else None, RUNNER_KINDS)
    lines.append(check(f"pipeline alone >= {INPUT_TARGET:g}x the step rate, every runner job", pipeline,
                       lambda v: v >= INPUT_TARGET, "lowest", "{:.1f}x"))
    overhead = _items(tables, "seconds_to_first_step", RUNNER_KINDS)
    lines.append(check(f"job overhead (process start to first step) <= {OVERHEAD_TARGET_S:g} s, every runner job",
                       overhead, lambda v: v <= OVERHEAD_TARGET_S, "highest", "{:.1f} s"))
    rss = _items(tables, "peak_rss_mb", RUNNER_KINDS, lambda s: s.model == "mlp" and s.variant == "tiny")
    lines.append(check(f"peak RSS of a tiny (smoke) MLP runner job <= {RSS_TARGET_MB:g} MB, any devices", rss,
                       lambda v: v <= RSS_TARGET_MB, "highest", "{:,.0f} MB"))
    steps = _items(tables, "timed_steps", (*RUNNER_KINDS, "keras", "keras_mirrored"))
    lines.append(check(f"at least {MIN_TIMED_STEPS} timed steps after warm-up, every job", steps,
                       lambda v: v >= MIN_TIMED_STEPS, "fewest", "{:.0f}"))
    return lines


def settings(args: argparse.Namespace) -> list[Setting]:
    """One setting per model x variant, with its steps (given, or DEFAULT_STEPS). A variant none of the models has
    is refused (UserError), naming theirs: it chose nothing, and the models without variants ran alone."""
    known = list(dict.fromkeys(v for model in args.models for v in variants(model) if v is not None))
    unknown = [v for v in args.variants if v not in known]
    if known and unknown:  # models without variants alone take any --variants (the command's default among them)
        raise UserError(f"--variants {','.join(unknown)}: not a variant of {', '.join(args.models)}; choose from "
                        f"{', '.join(known)}")
    return [setting_for(args, model, variant, tuple(args.override))
            for model in args.models for variant in variants(model) if variant is None or variant in args.variants]


def grid(args: argparse.Namespace) -> int:
    """Every model/variant x strategy x pipeline x N beside the runner's single device and Keras fit."""
    jobs, todo = plan(args.strategies, args.pipelines, args.gpus), settings(args)
    runner_jobs = sum(job.kind in RUNNER_KINDS for job in jobs) * len(todo) * args.repeats
    total = len(jobs) * len(todo) * args.repeats
    rounds = f" in {args.repeats} rounds" if args.repeats > 1 else ""
    out: list[str] = []
    emit(out, [f"# benchmark {args.command}: {total} jobs{rounds} ({runner_jobs} runner, {total - runner_jobs} keras "
               f"fit), each in a fresh process; {stamp()}", ""])
    progress, tables = Progress(total), []
    with sweep(args.tracking_uri, f"bench_{args.command}") as bench:
        for setting in todo:
            tables.append(measure(setting, jobs, bench, progress, args.repeats))
            predict_rows(tables[-1])
            emit(out, format_table(tables[-1]))
    emit(out, targets(tables))
    save(out, args.out)
    return 1 if any("error" in m for t in tables for _, m in t.rows) else 0
