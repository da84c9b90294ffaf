"""`floors`: each built-in model's step beside its floor at 1, 2 and 4 devices, its MFU and plain Keras fit, in rounds.

Every round runs, for each model, the runner on one device, Keras fit, and the runner on each `--gpus` count (the
data-parallel extremes: a copy per device, all-reduced; one copy on the host), each in a fresh process, so that a
slow spell of the host hits every model and job alike; rows show medians over the rounds and their range. The
runner / Keras ratio is taken within each round (the two jobs ran back to back) before its median. The floor is a
lower bound (runner/measure/floor.py): a median step / floor below 1.0 fails, as would a measurement beating a limit.
"""

from __future__ import annotations

import argparse
import statistics
import time

from runner.bench.grid import FLOOR_TARGET, check, keras_target
from runner.bench.jobs import Job, Progress, Setting, emit, failed, median_range, medians, run_one, save
from runner.bench.jobs import setting_for, stamp, sweep
from runner.models import MODELS, variants
from runner.report.table import markdown, markdown_row
from runner.strategies import baseline, doing, name_of

MFU_LIMIT = 1.0  # above it the peak is wrong, not the machine
FLOOR_COLUMNS = ("step ms", "floor: forward + backward ms", "floor: update ms", "step / floor")
# On N devices the data-parallel extremes, each with its own default pipeline: a copy per device, all-reduced
# (tf_cnn_benchmarks' replicated with NCCL), and one copy on the host (its parameter server on the CPU)
MULTI = (("--variable_update=replicated --all_reduce_spec=nccl", "split"),
         ("--variable_update=parameter_server --local_parameter_device=cpu", "per_tower"))


def _optimizers(todo: list[Setting]) -> str:
    """The settings' optimizer, or each model's where they differ (`--optimizer` not given: each model's own)."""
    used = {s.model: s.optimizer for s in todo}
    return used.popitem()[1] if len(set(used.values())) == 1 else ", ".join(f"{o} ({m})" for m, o in used.items())


def multi_jobs(gpus: list[int]) -> list[Job]:
    """The runner's jobs on each device count above 1."""
    named = [(name_of(doing(flags)), pipeline) for flags, pipeline in MULTI]
    return [Job("runner", n, f"runner {s} / {p}", s, p) for n in gpus if n > 1 for s, p in named]


def built_in() -> list[str]:
    """The registered models with a target accuracy of their own: the built-in MNIST examples."""
    return [n for n in MODELS.names() if MODELS.get(n).target_accuracy is not None]


def floor_settings(args: argparse.Namespace) -> list[Setting]:
    """One setting per model: its default variant (if it has variants) and its steps (given, or DEFAULT_STEPS)."""
    # variants(model) refuses a model that is not registered
    return [setting_for(args, model, "default" if "default" in variants(model) else None) for model in args.models]


def _row(setting: Setting, runs: list[dict], fits: list[dict]) -> tuple[str, dict[str, list[float | None]]]:
    """One model's markdown row and the per-round figures its targets are judged on."""
    ok = [m for m in runs if "rate" in m]
    ratios = [r["rate"] / k["rate"] for r, k in zip(runs, fits) if "rate" in r and "rate" in k]
    # a finished run without MFU (left out above 1, or no peak) does not show it held: None, judged as failing
    figures = {"step_over_floor": [m["step_time_over_floor"] for m in ok if "step_time_over_floor" in m],
               "mfu": [m.get("mfu") for m in ok], "vs_keras": ratios}
    errors = [m["error"] for m in [*runs, *fits] if "error" in m]
    cells = [setting.name + failed(errors, 60), str(setting.batch), *medians(runs, ("rate", ",.0f")),
             *medians(fits, ("rate", ",.0f")), median_range(ratios, ".2f"),
             *medians(runs, ("step_time_ms", ".2f"), ("floor_compute_ms", ".2f"), ("floor_update_ms", ".2f"),
                      ("step_time_over_floor", ".2f"), ("mfu", ".1%"), ("peak_gflops", ",.0f"))]
    return markdown_row(cells), figures


def _multi_row(setting: Setting, job: Job, runs: list[dict]) -> tuple[str, list[float]]:
    """One runner job's row on N devices and its step / floor per round."""
    errors = [m["error"] for m in runs if "error" in m]
    cells = [setting.name + failed(errors, 60), job.label, str(job.gpus),
             *medians(runs, ("rate", ",.0f"), ("step_time_ms", ".2f"), ("floor_compute_ms", ".2f"),
                      ("floor_update_ms", ".3f"), ("step_time_over_floor", ".2f"))]
    return markdown_row(cells), [m["step_time_over_floor"] for m in runs if "step_time_over_floor" in m]


def floors(args: argparse.Namespace) -> int:
    """Each built-in model's one-device step against its floor and Keras fit, in `args.rounds` rounds."""
    todo = floor_settings(args)  # the runner's baseline and Keras fit on one device, then the multi-device jobs
    base, keras = Job("baseline", 1, f"runner {baseline()}", baseline(), "split"), Job("keras", 1, "keras fit")
    every = [base, keras, *multi_jobs(args.gpus)]
    progress, t0 = Progress(len(todo) * len(every) * args.rounds), time.perf_counter()
    runs: dict[tuple[Setting, Job], list[dict]] = {(s, j): [] for s in todo for j in every}
    with sweep(args.tracking_uri, "bench_floors") as bench:
        for r in range(args.rounds):
            for setting in todo:
                for job in every:
                    runs[setting, job].append(run_one(setting, job, bench, progress, r))
    out: list[str] = []
    unit = next((m["unit"] for done in runs.values() for m in done if "unit" in m), "images")  # the data's
    others = ", ".join(str(n) for n in args.gpus if n > 1) or "no other"
    emit(out, [
        f"## Each model's step against its floor: {args.rounds} round{'s' * (args.rounds != 1)}, {stamp()}", "",
        f"Runner {base.strategy} (split pipeline) and Keras fit on one device, then the runner on "
        f"{others} devices, each in a fresh process, every model and job in every round; optimizer "
        f"{_optimizers(todo)}, data {args.data}; {len(todo) * len(every) * args.rounds} jobs in "
        f"{time.perf_counter() - t0:.0f} s. Medians over the rounds (lowest-highest).", "",
        *markdown(["model", "global batch", f"runner {unit}/s", f"keras fit {unit}/s", "runner / keras (per round)",
                   "step ms", *FLOOR_COLUMNS[1:], "MFU", "peak GFLOP/s"])])
    judged = []
    for setting in todo:
        line, figures = _row(setting, runs[setting, base], runs[setting, keras])
        emit(out, [line])
        judged.append((setting, figures))
    above = [(f"{s.name} {base.where}", f["step_over_floor"]) for s, f in judged]
    unbounded: dict[int, str] = {}  # devices -> why the floor was not measured there
    if multi := multi_jobs(args.gpus):
        emit(out, ["", *markdown(["model", "job", "devices", f"{unit}/s", *FLOOR_COLUMNS])])
        for setting in todo:
            for job in multi:
                line, ratios = _multi_row(setting, job, runs[setting, job])
                emit(out, [line])
                skipped = {m.get("floor") for m in runs[setting, job]} - {None}
                if skipped:  # the run said why it measured no floor on these devices
                    unbounded.setdefault(job.gpus, skipped.pop())
                else:
                    above.append((f"{setting.name} {job.where}", ratios))
    emit(out, ["", *targets(judged), above_floor(above),
               *(f"- n/a floors at x{n}: {why}" for n, why in sorted(unbounded.items()))])
    save(out, args.out)
    return 1 if any("error" in m for ms in runs.values() for m in ms) else 0


def above_floor(rows: list[tuple[str, list[float]]]) -> str:
    """The floor is a lower bound: every job's median step / floor over the rounds at least 1.0."""
    items = [(where, statistics.median(ratios) if ratios else None) for where, ratios in rows]
    return check("every step >= its floor (median step / floor >= 1.0)", items, lambda v: v >= 1.0, "lowest")


def targets(judged: list[tuple[Setting, dict[str, list[float | None]]]]) -> list[str]:
    """Per model: the median step / floor and runner / Keras against their targets; MFU at most 1 in every run."""
    lines = []
    for s, figures in judged:
        floor = statistics.median(figures["step_over_floor"]) if figures["step_over_floor"] else None
        vs = statistics.median(figures["vs_keras"]) if figures["vs_keras"] else None
        need = keras_target(s)
        lines.append(check(f"{s.name}: one-device step <= {FLOOR_TARGET}x its floor (median)",
                           [(f"runner {baseline()}", floor)], lambda v: v <= FLOOR_TARGET, "highest"))
        lines.append(check(f"{s.name}: runner 1 device >= {need}x keras fit (median of rounds)",
                           [("runner / keras", vs)], lambda v, n=need: v >= n, "lowest"))
    mfu = [(s.name, v) for s, figures in judged for v in figures["mfu"]]  # the runner's one-device runs: what it judges
    lines.append(check(f"MFU <= {MFU_LIMIT:.0%} in every one-device runner run", mfu, lambda v: v <= MFU_LIMIT,
                       "highest", "{:.1%}"))
    return lines
