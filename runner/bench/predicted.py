"""`predicted`: the cost model against a measured grid. Reads the finished runner runs of an experiment (a bench
grid's, or a sweep's), predicts each one's combination from its own command line (runner/predict/, calibrating this
machine where the cache lacks it), and prints predicted beside measured per row and, per model and device count,
the accuracy figures of runner/report/prediction.py."""

from __future__ import annotations

import argparse
import shlex
import time

from runner.bench.jobs import emit, save, stamp
from runner.cli.overrides import config_dirs, searchpath
from runner.data_pipelines import rate_unit
from runner.errors import UserError, one_line
from runner.report.prediction import group_lines, grouped
from runner.report.table import markdown, markdown_row
from runner.tracking import resolve_uri


def _overrides(command: str) -> list[str]:
    """A run's overrides from its command line (`python -m runner ...`, `runner ...`), without where it was tracked
    or wrote its folder; a sweep job's `--config-dir D` and search path become one `hydra.searchpath` (the user's
    config folders, for their own components)."""
    words = shlex.split(command)
    args = words[words.index("runner") + 1:] if "runner" in words else words
    values = {value for flag, value in zip(args, args[1:]) if flag in ("--config-dir", "-cd")}
    kept = [w for w in args if not w.startswith(("mlflow.", "-", "hydra.")) and w not in values]
    return kept + searchpath(config_dirs(args))


def _runs(uri: str, experiment: str) -> list[tuple[str, float]]:
    """(command line, measured rate: images/s, tokens/s or examples/s) of every finished run of `experiment` that
    timed its steps."""
    from mlflow.exceptions import MlflowException
    from mlflow.tracking import MlflowClient

    client = MlflowClient(uri)
    try:
        exp = client.get_experiment_by_name(experiment)
    except MlflowException as e:  # a store that does not answer: was a traceback
        raise UserError(f"--tracking-uri {uri} cannot be read: {one_line(e)}") from None
    if exp is None:
        names = sorted(e.name for e in client.search_experiments())
        raise UserError(f"--experiment {experiment}: no such experiment in {uri}; it has: {', '.join(names) or 'none'}")
    found = client.search_runs([exp.experiment_id], "attributes.status = 'FINISHED'", max_results=5000)
    timed = [(r, f"{rate_unit(r.data.metrics)}_per_sec") for r in found if r.data.tags.get("sweep") != "parent"]
    return [(r.data.tags["mlflow.source.name"], r.data.metrics[key]) for r, key in timed
            if key in r.data.metrics and "mlflow.source.name" in r.data.tags]


def predicted(args: argparse.Namespace) -> int:
    """Predict every measured run's combination and judge the predictions per model and device count."""
    from runner.predict.grid import calibration, predict_all

    t0 = time.perf_counter()
    measured = _runs(resolve_uri(args.tracking_uri), args.experiment)
    commands = sorted({c for c, _ in measured})
    outcomes = dict(zip(commands, predict_all([_overrides(c) for c in commands], args.recalibrate)))
    runs, calibrated = [], {}
    for command, rate in measured:
        if (o := outcomes[command]).prediction is not None:
            head, devices = o.label.removesuffix(f" {o.setting}").rsplit(" x", 1)
            model, combo = head.split(" ", 1)
            group = f"{model} x{devices}, {o.prediction.unit}/s"  # a group's rates in one unit
            runs.append((group, f"{combo} {o.setting}".rstrip(), o.prediction.rate, rate))
            calibrated[runs[-1][:2]] = calibration(o)
    marked = any(c != "-" for c in calibrated.values())  # a column only where some calibration was disturbed
    groups = dict(sorted(grouped(runs).items()))
    unpredicted = sorted({f"{outcomes[c].label}: {outcomes[c].error}" for c in commands if outcomes[c].error})
    combinations = sum(len(combos) for combos in groups.values()) + len(unpredicted)  # a repeat is no combination
    out: list[str] = []
    emit(out, [f"## The cost model against the measured runs of `{args.experiment}`: {stamp()}", "",
               f"{len(measured)} runs of {combinations} combinations, predicted in {time.perf_counter() - t0:.0f} s "
               "(calibrations included). Measured: the median of a combination's runs (lowest-highest).", "",
               *markdown(["model, devices, unit", "combination", "predicted", "measured", "error",
                          *(["calibration"] if marked else [])])])
    for group, combos in groups.items():
        for c in sorted(combos, key=lambda c: -c.rate):
            rng = f" ({min(c.rates):,.0f}-{max(c.rates):,.0f})" if len(c.rates) > 1 else ""
            emit(out, [markdown_row([group, c.label, f"{c.predicted:,.0f}", f"{c.rate:,.0f}{rng}",
                                     f"{(c.predicted - c.rate) / c.rate:+.0%}",
                                     *([calibrated[group, c.label]] if marked else [])])])
    lines = group_lines(groups, least=1)
    emit(out, ["", *(f"- {text}" for text in lines), *(f"- not predicted: {u}" for u in unpredicted)])
    save(out, args.out)
    return 0 if lines else 1
