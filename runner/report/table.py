"""What `runner report` shows (runner/cli/report.py): runs from MLflow compared in a table, a verdict and three plots.

The table has one row per run: its combination, its rate (images/s, tokens/s or examples/s: what the data counts)
± standard error, speedup and efficiency against the matching 1-device run, time to the target, the test score,
whether it learns the same as the 1-device run, wall time and status; then one `verdict:` line per model, a model's
runs of another setting (`settings`) named as another model (runner/report/verdict.py), and the plots
(runner/report/plots.py), logged to the sweep's parent run if there is one; one table and one set of plots per kind
of run (`_by_kind`). How to call it and what it chooses: docs/scaling-and-time-to-accuracy.md.
"""

from __future__ import annotations

import logging
import math
import statistics
import string
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from runner import tracking
from runner.data_pipelines import rate_unit
from runner import tasks
from runner.registry import spelled
from runner.report import kinds, plots, prediction, verdict
from runner.strategies import baseline
from runner.tasks import METRICS

log = logging.getLogger(__name__)


REUSED = "sweep.reused."  # a sweep parent's tag per job sweep.resume skipped: `sweep.reused.<run id>` = its overrides
COMBINATION = ("strategy.", "pipeline.", "gpus")  # the params that differ between a model's combinations
CONFIG_SPELLING = {str(v): spelled(v) for v in (True, False, None)}  # a logged param ("True") as overrides spell it
PLOTS = ("scaling", "time_to_accuracy", "accuracy")  # a report's plots, each a PNG per kind of run in --out
RUN_ID_LENGTH = 32  # an MLflow run id's hex digits; --parent takes a prefix of one
PREFIX_SHOWN = 5  # the runs an ambiguous --parent prefix's error names


class ReportError(Exception):
    """Nothing to report, or not what was asked for; the message is one line naming what exists."""


@dataclass(kw_only=True)
class Row(verdict.Run):
    """One run, as the report shows it: what the verdict reads of it (`verdict.Run`, so rows are its runs) and the
    rest of the table's columns."""

    run_id: str
    kind: str
    simulated: bool
    wall_seconds: float
    mfu: float = math.nan
    speedup: float = math.nan
    efficiency: float = math.nan
    same: bool | None = None  # learns the same as the model's 1-device run
    predicted: float = math.nan  # the cost model's images/s for this combination (runner/predict/)
    task: str = ""  # its task's name (runner.tasks.TASKS): whether its loss is a figure the table shows
    round: str = ""  # its sweep.round tag ("2 of 2"): which of a combination's sweep.repeats it is


def row_of(run: Any, status: str | None = None) -> Row:
    """An MLflow run as a row: what it measured, in its own unit and metric (the one place a report reads them);
    `status` shown instead of the stored one (a dead run's)."""
    tags, m = run.data.tags, run.data.metrics
    variant = tags.get("model.variant", "")
    unit = rate_unit({**m, **tags}) or "images"
    task = tasks.of_run(tags, m)
    score = task.score.name
    metric = next((k for k in tasks.METRICS if f"target_{k}" in m), score)  # what the run was timed to
    return Row(
        run_id=run.info.run_id,  # the model's label (runner.models.label); from model and variant in older runs
        model=tags.get("model.label") or (f"{tags.get('model', '?')}/{variant}" if variant else tags.get("model", "?")),
        pipeline=tags.get("pipeline", "?"), strategy=tags.get("strategy", "?"),
        devices=int(tags.get("devices.count", 0)) * int(tags.get("devices.workers", 1)),  # a cluster's: all of them
        kind=tags.get("devices.kind", "?"),
        simulated=tags.get("devices.simulated") == "true", rate=m.get(f"{unit}_per_sec", math.nan),
        stderr=m.get(f"{unit}_per_sec_stderr", math.nan), score=m.get(f"test_{score}", math.nan),
        wall_seconds=m.get("wall_seconds", math.nan), status=status or run.info.status,
        scaling=tags.get("batch_scaling", "strong"), host_only=tags.get("devices.requested") == "0",
        mfu=m.get("mfu", math.nan), loss=m.get("test_loss", math.nan),
        time_to_target=m.get(f"time_to_{metric}_seconds", math.nan), target=m.get(f"target_{metric}", math.nan),
        predicted=m.get(f"predicted_{unit}_per_sec", math.nan), unit=unit, target_metric=metric, score_metric=score,
        seed=run.data.params.get("train.seed", ""), task=task.name, round=tags.get("sweep.round", ""),
        first_check=m.get(tasks.FIRST_CHECK) == 1.0,
    )


@dataclass(frozen=True)
class Selection:
    """What a report covers: an experiment, and a sweep parent or not; `said` is the line that tells the user."""

    experiment: str
    experiment_id: str
    parent: str | None
    said: str


def select(client: Any, experiment: str | None, parent: str | None, latest_sweep: bool) -> Selection:
    """The runs a report covers: as asked, or (nothing asked) the newest sweep in the store, else the newest
    experiment. Raises ReportError naming what exists when the ask cannot be met."""
    store = client.search_experiments()
    experiments = [e for e in store  # MLflow's own Default: only when asked for by name
                   if e.name != "Default" or e.experiment_id != "0" or experiment == "Default"]
    names = ", ".join(sorted(e.name for e in experiments)) or "none"
    pool = [e for e in experiments if experiment is None or e.name == experiment]  # names are unique
    if experiment is not None and not pool:
        raise ReportError(f"no experiment {experiment!r} in {client.tracking_uri}; experiments: {names}")
    if not pool:
        raise ReportError(f"no experiments in {client.tracking_uri}: run `python -m runner` first")
    if parent:
        run = parent_run(client, parent, store, pool if experiment is not None else store)
        if experiment is not None and run.info.experiment_id not in {e.experiment_id for e in pool}:
            raise ReportError(f"--parent {parent} is a run of experiment "
                              f"{_name(experiments, run.info.experiment_id)!r}, not {experiment!r}; give either")
        if (sweep := run.data.tags.get("mlflow.parentRunId")) and run.data.tags.get("sweep") != "parent":
            raise ReportError(f"--parent {parent}: run {run.info.run_id} is a job of sweep {sweep}, not a sweep's "
                              f"parent; report with --parent {sweep}")
        return Selection(_name(pool, run.info.experiment_id), run.info.experiment_id, run.info.run_id,
                         f"report: sweep parent run {run.info.run_id}")
    sweeps = client.search_runs([e.experiment_id for e in pool], "tags.sweep = 'parent'",
                                order_by=["start_time DESC"], max_results=1)
    if sweeps and (latest_sweep or experiment is None):
        run = sweeps[0]
        where = run.data.tags.get("mlflow.runName", run.info.run_id)
        return Selection(_name(pool, run.info.experiment_id), run.info.experiment_id, run.info.run_id,
                         f"report: {where} (parent run {run.info.run_id}) in experiment "
                         f"{_name(pool, run.info.experiment_id)!r}, the newest sweep")
    if latest_sweep:
        raise ReportError(f"no sweep in experiment {experiment!r} (run one with `python -m runner -m ...`), or "
                          f"leave out --latest-sweep to report its runs")
    exp = pool[0] if experiment is not None else max(pool, key=lambda e: e.last_update_time or 0)
    why = "" if experiment is not None else ", the newest experiment (no sweep in the store)"
    return Selection(exp.name, exp.experiment_id, None, f"report: all runs of experiment {exp.name!r}{why}")


def parent_run(client: Any, parent: str, store: list[Any], asked: list[Any]) -> Any:
    """The run `--parent` names: by its full id, or by a prefix of it (the 8 characters the MLflow UI and the logs
    show), as git takes a commit's: looked up among the runs of the `asked` experiments, else of the whole `store`
    (so that a run of another experiment is said as such). Raises ReportError where no run has it, or several do
    (naming a few)."""
    from mlflow.exceptions import MlflowException

    missing = ReportError(f"--parent {parent}: no run with that id in {client.tracking_uri}")
    if len(parent) < RUN_ID_LENGTH and all(c in string.hexdigits for c in parent):  # safe in a LIKE filter
        found = _starting_with(client, parent.lower(), asked) or _starting_with(client, parent.lower(), store)
        if len(found) > 1:
            ids = ", ".join(r.info.run_id for r in found[:PREFIX_SHOWN]) + (", ..." * (len(found) > PREFIX_SHOWN))
            raise ReportError(f"--parent {parent}: the ids of several runs start with it ({ids}); give more of the id")
        if not found:
            raise missing
        return found[0]
    try:
        return client.get_run(parent)
    except MlflowException as e:
        # no such run, or an id no run can have (`d46a%`); else the store itself, said as any other store error
        if e.error_code not in ("RESOURCE_DOES_NOT_EXIST", "INVALID_PARAMETER_VALUE"):
            raise
        raise missing from None


def _starting_with(client: Any, prefix: str, experiments: list[Any]) -> list[Any]:
    """The runs of `experiments` whose id starts with `prefix` (lowercase hex): up to one more than an ambiguous
    prefix's error names, so that it can say there are more."""
    if not experiments:
        return []
    return client.search_runs([e.experiment_id for e in experiments], f"attributes.run_id LIKE '{prefix}%'",
                              max_results=PREFIX_SHOWN + 1)


def _name(experiments: list[Any], experiment_id: str) -> str:
    return next((e.name for e in experiments if e.experiment_id == experiment_id), experiment_id)


def fetch(client: Any, selection: Selection, filter_string: str,
          tolerance: verdict.Tolerance = verdict.Tolerance()) -> list[Row]:
    """The runs of a selection (a sweep parent's children, or the experiment's runs but parents), with their speedups
    and whether each learns the same as one device within `tolerance`; one whose process is gone from this host is
    closed KILLED and shown DEAD (`_dead`)."""
    from mlflow.exceptions import MlflowException

    try:
        runs = jobs(client, selection.experiment_id, selection.parent, filter_string) if selection.parent else \
            client.search_runs([selection.experiment_id], filter_string, max_results=5000)
    except MlflowException as e:
        if e.error_code != "INVALID_PARAMETER_VALUE":
            raise
        raise ReportError(f"--filter {filter_string!r}: {e.message} (MLflow's search syntax)") from None
    for parent in [r for r in runs if r.data.tags.get("sweep") == "parent"]:  # an experiment's: closed if dead
        tracking.close_dead_sweep(client, parent.info.run_id)
    runs = [r for r in runs if r.data.tags.get("sweep") != "parent"]
    return add_speedups(rows_of(runs, [_dead(client, r) for r in runs]), tolerance)


def rows_of(runs: list[Any], statuses: list[str | None] | None = None) -> list[Row]:
    """The runs as rows (`row_of`, with `statuses` shown instead of the stored ones), each model's runs of another
    setting (`settings`) named as another model: other work, its own verdict, speedups and parent figures."""
    rows = [row_of(r, status) for r, status in zip(runs, statuses or [None] * len(runs))]
    params = [{k.replace(".kwargs.", ".", 1): CONFIG_SPELLING.get(v, v) for k, v in r.data.params.items()}
              for r in runs]  # a model function's keyword `model.hidden`, logged as model.kwargs.hidden before
    for row, setting in zip(rows, settings(params, rows)):
        row.model += f" {setting}" if setting else ""
    return rows


def jobs(client: Any, experiment_id: str, parent: str, filter_string: str = "") -> list[Any]:
    """A sweep's jobs' runs (matching `filter_string`): its parent's children, and the FINISHED runs of earlier
    sweeps that its jobs were skipped for (sweep.resume: the parent's `REUSED` tags), so that a resumed sweep's
    table and verdict cover all of its jobs."""
    where = [filter_string] if filter_string else []
    runs = client.search_runs([experiment_id], " and ".join([*where, f"tags.mlflow.parentRunId = '{parent}'"]),
                              max_results=5000)
    reused = [key.removeprefix(REUSED) for key in client.get_run(parent).data.tags if key.startswith(REUSED)]
    if reused:
        ids = ", ".join(f"'{run_id}'" for run_id in reused)
        runs += client.search_runs([experiment_id], " and ".join([*where, f"attributes.run_id IN ({ids})"]),
                                   max_results=5000)
    return runs


def settings(params: list[dict[str, str]], rows: list[Row]) -> list[str]:
    """Each run's setting, where runs of one model differ in more than their combination: the config keys (logged
    params) that take several values among runs of the same model and combination, with this run's values
    (`train.precision=mixed_bfloat16`), else ''. A key one value holds for most of the model's runs is said only where
    a run's differs (one odd run beside a sweep), a key split evenly on every run (a sweep over it); a run that did not
    log a key (an older runner) is compared on the others. Left out: what makes a repeat (the seed, the cluster's
    addresses: `config.REPEATS`), what changes nothing computed (`config.UNCOMPUTED`) and what follows from the rest
    (`_derived`). Keys outside the combination's own (`COMBINATION`) are compared across all the model's runs, so that
    runs on other data are never one model's baseline and speedups.
    Without this, runs of two precisions were one combination's repeats."""
    from runner.config import UNCOMPUTED

    work: dict[tuple[str, str], list[tuple[Row, dict[str, str]]]] = {}
    for row, given in zip(rows, params):
        work.setdefault((row.model, row.combination), []).append((row, given))
        # and across the model's combinations, the keys that are not a combination's own (its data, its training)
        work.setdefault((row.model, ""), []).append((row, {k: v for k, v in given.items() if not k.startswith(
            COMBINATION)}))
    varied: dict[str, set[str]] = {}
    for (model, _), group in work.items():
        for key in {k for _, given in group for k in given if not k.startswith(UNCOMPUTED)}:
            values = {given[key] for row, given in group if key in given and key not in _derived(row)}
            if len(values) > 1:
                varied.setdefault(model, set()).add(key)
    counts = {(m, k): Counter(g[k] for r, g in zip(rows, params) if r.model == m and k in g and k not in _derived(r))
              for m, keys in varied.items() for k in keys}

    def said(row: Row, key: str, value: str) -> bool:
        (top, n), = counts[row.model, key].most_common(1)
        return key not in _derived(row) and (value != top or 2 * n <= counts[row.model, key].total())

    return [" ".join(f"{k}={given[k]}" for k in sorted(varied.get(row.model, ())) if k in given
                     and said(row, k, given[k])) for row, given in zip(rows, params)]


def _derived(row: Row) -> tuple[str, ...]:
    """The params of `row` that are not a setting: what a repeat's may differ in, the batch its scaling derives from
    the other and the learning rates after the batch rule."""
    from runner.config import REPEATS

    return (*REPEATS, "train.effective_learning_rate", "train.effective_table_learning_rate",
            "train.global_batch_size" if row.scaling == "weak" else "train.per_device_batch_size")


def _dead(client: Any, run: Any) -> str | None:
    """`DEAD (last wrote 3 min ago)` for a run left RUNNING by a process gone from this host, which is closed KILLED
    here (no process will ever end it); None for any other run."""
    if not tracking.abandoned(run):
        return None
    history = [m.timestamp for key in run.data.metrics for m in client.get_metric_history(run.info.run_id, key)]
    last = max([run.info.start_time, *history]) / 1000  # system metrics every few seconds: about when it died
    from mlflow.exceptions import MlflowException

    from runner.errors import one_line

    try:
        tracking.close_dead(client, run)
    except MlflowException as e:  # a store this user may read, not write: shown as dead, left as it is
        log.warning("run %s is left RUNNING: the store refused to close it (%s)", run.info.run_id, one_line(e))
    return f"DEAD (last wrote {_ago(time.time() - last)} ago)"


def _ago(seconds: float) -> str:
    """A duration as a person says it: `12 s`, `3 min`, `5 h`, `2 days`."""
    whole = max(int(seconds), 0)
    if whole < 60:
        return f"{whole} s"
    if whole < 3600:
        return f"{whole // 60} min"
    return f"{whole // 3600} h" if whole < 2 * 86400 else f"{whole // 86400} days"


def _baseline(row: Row, finished: list[Row]) -> float:
    """The rate `row`'s speedup is over: the median of its combination's 1-device runs (their repeats, as the
    verdict takes them), else of the baseline strategy's; NaN where there are none."""
    key = (row.model, row.pipeline, row.strategy, row.scaling, 1)
    same = [r.rate for r in finished if (r.model, r.pipeline, r.strategy, r.scaling, r.devices) == key]
    reference = (row.model, baseline(), row.scaling, 1)  # the strategy every other is compared with
    single = [r.rate for r in finished if (r.model, r.strategy, r.scaling, r.devices) == reference]
    return statistics.median(same or single) if same or single else math.nan


def add_speedups(rows: list[Row], tolerance: verdict.Tolerance = verdict.Tolerance()) -> list[Row]:
    """Speedup = images/s (tokens/s, ...) over the baseline's; efficiency = speedup / devices; learns the same as
    1 device."""
    finished = [r for r in rows if r.status == "FINISHED" and not math.isnan(r.rate)]
    for row in rows:
        peers = [r for r in finished if r.unit == row.unit]  # a model's runs of another unit are other work
        base = _baseline(row, peers)
        if not math.isnan(base) and row.status == "FINISHED" and row.devices:
            row.speedup = row.rate / base
            row.efficiency = row.speedup / row.devices
        reference = verdict.reference_for(row, [r for r in peers if r.model == row.model])
        if reference is not None and row.status == "FINISHED":
            row.same = verdict.learns_same(row, reference, tolerance)
    return sorted(rows, key=lambda r: (r.model, r.pipeline, r.strategy, r.scaling, r.devices,
                                       r.seed.zfill(20), r.round.partition(" ")[0].zfill(20)))  # 2 before 10


def _time_to(kind: kinds.Kind) -> str:
    """The time column's name: `time to acc.`, `time to loss`, `time to AUC` (the target's metric, as said)."""
    return f"time to {METRICS[kind.target].short}"


def _score(kind: kinds.Kind) -> str:
    """The score column's name: `test acc.`, a click model's `test AUC` (its task's score, as said)."""
    return f"test {METRICS[kind.score].short}"


def _loss(rows: list[Row], kind: kinds.Kind) -> list[str]:
    """The test loss column's name, or none: shown where the runs were timed to their loss (the metric timed to is in
    the table) or their task says its loss first (a language model's, in nats per token: runner.tasks headline)."""
    said = [tasks.TASKS[r.task] for r in rows if r.task in tasks.TASKS]
    if kind.target != "loss" and not any(t.headline[:1] and t.headline[0][0] == "loss" for t in said):
        return []
    return ["test loss (nats/token)" if said and all(t.per_position for t in said) else "test loss"]


def _by_kind(rows: list[Row], each: Callable[[list[Row], kinds.Kind], str]) -> str:
    """`each` kind's text (runner/report/kinds.py): for rows of one kind, its text alone; for several, one text per
    kind under a line naming its models and kind, so that no column holds two units or two metrics."""
    parts = kinds.split(rows)
    if len(parts) < 2:
        return each(rows, parts[0][0] if parts else kinds.Kind())
    return "\n\n".join(f"{', '.join(sorted({r.model for r in part}))}: {kind}\n\n{each(part, kind)}"
                        for kind, part in parts)


def _fmt(value: float, spec: str) -> str:
    return "-" if math.isnan(value) else format(value, spec)


def markdown_row(cells: list[str]) -> str:
    """One line of a Markdown table (an empty cell as `| |`)."""
    return "|" + "|".join(f" {c} " if c else " " for c in cells) + "|"


def markdown(head: list[str], rows: list[list[str]] = ()) -> list[str]:
    """A Markdown table's lines: the header, its rule and the rows; every table of `report` and the bench."""
    return [markdown_row(head), "|---" * len(head) + "|", *map(markdown_row, rows)]


def _rounds(rows: list[Row]) -> bool:
    """Whether runs of one combination (and seed) differ in their sweep.round, so that a table shows it: a sweep's
    repeats (sweep.repeats=2) would otherwise be rows alike but for their figures."""
    rounds: dict[tuple, set[str]] = {}
    for r in rows:
        rounds.setdefault((r.model, r.combination, r.seed), set()).add(r.round)
    return any(len(said - {""}) > 1 for said in rounds.values())


def _tells_apart(rows: list[Row]) -> list[str]:
    """The columns that tell a combination's runs apart, where they differ: `seed` (runs of one combination that
    differ only in train.seed are its repeats, `_derived`, which would otherwise look alike), `round` (`_rounds`)."""
    return ["seed"] * (len({r.seed for r in rows if r.seed}) > 1) + ["round"] * _rounds(rows)


def _apart(row: Row, columns: list[str]) -> list[str]:
    """A row's cells of the `_tells_apart` columns (`-` where it has none)."""
    return [getattr(row, column) or "-" for column in columns]


def table(rows: list[Row], kind: kinds.Kind) -> str:
    """The comparison of rows of one kind as a Markdown table (seed and round columns where a combination's runs
    differ in them; a test loss column where it is the runs' figure, `_loss`), with a footnote where speedups are
    missing."""
    unit, same, apart, loss = kind.unit, {True: "yes", False: "no", None: "-"}, _tells_apart(rows), _loss(rows, kind)
    head = ["model", "pipeline", "strategy", "devices", "scaling", *apart, f"{unit}/s", "± stderr",
            f"predicted {unit}/s", "speedup", "efficiency", f"{_time_to(kind)} (s)", *loss, _score(kind),
            "learns same", "MFU", "wall s", "status"]
    lines = markdown(head, [
        [r.model, r.pipeline, r.strategy,
         "host CPU (gpus=0)" if r.host_only else f"{r.devices} {r.kind}{' (sim)' if r.simulated else ''}", r.scaling,
         *_apart(r, apart),
         _fmt(r.rate, ",.0f"), _fmt(r.stderr, ",.0f"), _fmt(r.predicted, ",.0f"), _fmt(r.speedup, ".2f"),
         _fmt(r.efficiency, ".2f"), _fmt(r.time_to_target, ".1f"), *[_fmt(r.loss, ".4f") for _ in loss],
         _fmt(r.score, ".4f"), same[r.same],
         _fmt(r.mfu, ".1%"), _fmt(r.wall_seconds, ".1f"), r.status] for r in rows])
    notes = []
    if any(math.isnan(r.speedup) and r.status == "FINISHED" for r in rows):
        notes.append("speedup/efficiency `-`: no 1-device run of that model, pipeline and strategy (or of `single`)")
    if any(math.isnan(r.time_to_target) and r.status == "FINISHED" for r in rows):
        notes.append(f"{_time_to(kind)} `-`: the run did not reach its target (or had none)")
    return "\n".join([*lines, *(f"\n{n}" for n in notes)])


def curves(client: Any, rows: list[Row]) -> dict[str, list[tuple[float, float]]]:
    """Each run's accuracy (or loss, for a loss target) against training seconds: its checks, then its final
    evaluation."""
    out = {}
    for r in rows:
        seconds = {m.step: m.value for m in client.get_metric_history(r.run_id, "check_train_seconds")}
        value = {m.step: m.value for m in client.get_metric_history(r.run_id, f"check_{r.target_metric}")}
        points = [(seconds[s], value[s]) for s in sorted(seconds) if s in value]
        run = client.get_run(r.run_id).data.metrics
        final = run.get(f"test_{r.target_metric}", math.nan)
        if "train_seconds" in run and not math.isnan(final):
            points.append((run["train_seconds"], final))
        out[r.run_id] = points
    return out


@dataclass
class Report:
    """What `report` made: the table, the verdict (and prediction) lines, the files, and where they were logged."""

    text: str
    lines: list[str]
    paths: list[Path]  # report.md and the plots
    logged: str  # where the files went besides `paths`, for the line that lists them ('' without a parent)


def report(client: Any, selection: Selection, filter_string: str, out: Path,
           tolerance: verdict.Tolerance = verdict.Tolerance()) -> Report:
    """Build the table, the verdict lines and the plots; log them to the parent run if there is one, unless they
    cover only the runs a filter matched (`report.md` names the filter): those would replace the sweep's whole report
    in the parent's `report/` folder."""
    rows = fetch(client, selection, filter_string, tolerance)
    if not rows:
        where = f"sweep parent run {selection.parent} in " if selection.parent else ""
        raise ReportError(f"no runs {f'matching --filter {filter_string!r} ' if filter_string else ''}to report in "
                          f"{where}experiment {selection.experiment!r}")
    text, lines = _by_kind(rows, table), conclusions(rows, tolerance)
    out.mkdir(parents=True, exist_ok=True)
    for stale in (p for plot in PLOTS for p in out.glob(f"{plot}*.png")):  # an earlier report's, of other kinds
        stale.unlink()
    filtered = [f"runs matching --filter {filter_string!r} only", ""] if filter_string else []
    (out / "report.md").write_text("\n".join([*filtered, text, "", *lines]) + "\n")
    parts = kinds.split(rows)
    paths = [path for (_, part), name in zip(parts, kinds.names([k for k, _ in parts]))
             for path in _plots(client, part, out, name)]
    return Report(text, lines, paths, _logged(client, selection.parent, filter_string, [out / "report.md", *paths]))


def _logged(client: Any, parent: str | None, filter_string: str, files: list[Path]) -> str:
    """Log the report's files to the sweep's parent run, closed first if its sweep is gone and no job runs
    (tracking.close_dead_sweep), and say where they went besides --out: nowhere without a parent, for a filtered
    report (it would replace the parent's report of the whole sweep), or while a gone sweep's job still runs."""
    if not parent:
        return ""
    if filter_string:
        return (f"; not logged to parent run {parent}: a --filter'ed report would replace its sweep's whole one "
                "(leave out --filter to log it)")
    closed = tracking.close_dead_sweep(client, parent)
    if tracking.abandoned(client.get_run(parent)):
        return (f"; not logged to parent run {parent}: its sweep's process is gone and a job still runs (`runner "
                "report` again once it ends closes the parent and logs them)")
    for path in files:
        client.log_artifact(parent, str(path), "report")
    if closed:
        return f"; logged to parent run {parent}, closed {closed} first (its sweep's process is gone)"
    return f"; logged to parent run {parent}"


def _plots(client: Any, rows: list[Row], out: Path, name: str) -> list[Path]:
    """The three plots of rows of one kind, named `scaling.png`, ... (`scaling_<name>.png` where a report has
    several kinds), none where no run measured a rate or a score; returns their paths."""
    suffix = f"_{name}" if name else ""
    if all(math.isnan(r.rate) and math.isnan(r.score) for r in rows):  # failed runs alone: three empty axes
        return []
    paths = [out / f"{plot}{suffix}.png" for plot in PLOTS]
    plots.scaling(rows, paths[0])
    plots.time_to_accuracy(rows, curves(client, rows), paths[1])
    plots.accuracy(rows, paths[2])
    return paths


def compact(rows: list[Row], kind: kinds.Kind) -> str:
    """One line per job of one kind, the figures a sweep's end shows: combination (and seed, round where they
    differ), rate (and the predicted where runs logged one), time to the target, the test loss (`_loss`) and
    score, status."""
    predicted = [f"predicted {kind.unit}/s"] if any(not math.isnan(r.predicted) for r in rows) else []
    apart, loss = _tells_apart(rows), _loss(rows, kind)
    head = ["model", "combination", *apart, f"{kind.unit}/s", *predicted, f"{_time_to(kind)} (s)", *loss,
            _score(kind), "status"]
    return "\n".join(markdown(head, [
        [r.model, f"{r.strategy}/{r.pipeline} x{r.devices}", *_apart(r, apart), _fmt(r.rate, ",.0f"),
         *([_fmt(r.predicted, ",.0f")] if predicted else []), _fmt(r.time_to_target, ".1f"),
         *[_fmt(r.loss, ".4f") for _ in loss], _fmt(r.score, ".4f"), r.status] for r in rows]))


def conclusions(rows: list[Row], tolerance: verdict.Tolerance = verdict.Tolerance()) -> list[str]:
    """The `verdict:` lines, then, per model and device count with two or more predicted combinations, how the
    predictions fared (runner/report/prediction.py)."""
    groups = prediction.grouped((f"{r.model} x{r.devices}", f"{r.strategy}/{r.pipeline}", r.predicted, r.rate)
                                for r in rows
                                if r.status == "FINISHED" and not math.isnan(r.predicted) and not math.isnan(r.rate))
    return [v.line() for v in verdict.decide(rows, tolerance)] + prediction.group_lines(dict(sorted(groups.items())))


def sweep_end(client: Any, parent: str) -> list[str]:
    """What the end of a sweep prints: its jobs' compact table (one per kind), the verdict, and where to look
    further."""
    from runner.tracking import ui

    run = client.get_run(parent)
    experiment = client.get_experiment(run.info.experiment_id).name
    selection = Selection(experiment, run.info.experiment_id, parent, "")
    rows = fetch(client, selection, "")
    return ["", _by_kind(rows, compact), "", *conclusions(rows), "",
            f"experiment: {experiment!r}; table, plots and verdict: runner report --experiment {experiment} --parent "
            f"{parent}",
            ui.where_to_look(client.tracking_uri, run.info.experiment_id)]
