"""`runner check` / `python -m runner.cli.check`: does every strategy and pipeline work on this machine's devices?

    runner check                       the machine's GPUs (or 2 simulated CPU devices on a machine without any)
    runner check gpus=4                4 devices (logical GPUs carved from GPU 0 when fewer are real)
    runner check strategy=mirrored,replicated pipeline=sharded train.precision=mixed_float16 --tolerance 1e-2

For every strategy x pipeline that applies to the devices (multi-process strategies aside), one fresh process trains
the smoke model for a few compiled steps, unshuffled and with the same seed as a one-device reference run, and
reports where the variables and the compute were placed (TensorFlow's placer log), the largest relative loss
difference from the reference (with the same examples in the same order, towers only change the summation order)
and the rate of a timed call in the data's unit (docs/devices-and-clusters.md). Then one table, one line
`check: N of M combinations OK` (exit 1 if any is not) and one MLflow run in experiment `check`.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, TextIO

from runner.cli.arguments import Parser, positive, tolerance
from runner.errors import UserError, last_line

STEPS = 10  # compiled one-step calls whose losses are compared
TIMED_STEPS = 30  # steps of the one timed call
TOLERANCE = 1e-3  # float32 on CPUs agrees to ~1e-6; GPUs' TF32 matmuls and reduction orders need more room
BASE = ["debug=smoke", "pipeline.shuffle_buffer=0", "mlflow.experiment=check"]  # unshuffled: the same data order
RESULT = "check-result: "  # the child's line on stdout: one combination's measurement, as JSON
BEGIN = "check-begin: "  # the child's line on stderr before each combination: its placer log follows
CHOICES = ("strategy=", "pipeline=", "gpus=")  # what the check varies; every other override applies to all rows
# TensorFlow's placer log line (with log_device_placement): "<node>: (<op>): /job:.../device:GPU:1".
_PLACED = re.compile(r"placer\.cc:\d+\] \S+: \((\w+)\): \S*device:(\w+:\d+)")
COMPUTE_OPS = ("MatMul", "BatchMatMulV2", "Conv2D", "Conv2DBackpropInput", "Conv2DBackpropFilter")


@dataclass
class Combination:
    """One row of the check: a strategy (with options) and a pipeline, as overrides."""

    label: str
    overrides: list[str]


@dataclass
class Outcome:
    """What one combination's process measured (or why it failed), and what the parent concluded."""

    label: str
    losses: list[float] = field(default_factory=list)
    variables: list[str] = field(default_factory=list)  # devices holding variables, e.g. ["CPU:0", "CPU:1"]
    compute: dict[str, int] = field(default_factory=dict)  # device -> matmuls/convolutions placed there
    devices: list[str] = field(default_factory=list)  # the run's devices
    rate: float = 0.0  # `unit`s per second of the timed call
    unit: str = ""  # what the rate counts: images, tokens or examples (the data's Spec.unit)
    tags: dict[str, str] = field(default_factory=dict)
    error: str = ""
    diff: float = float("nan")
    problems: list[str] = field(default_factory=list)
    per_tower: list[str] = field(default_factory=list)  # the model's layers computing per tower (`per_tower_layers`)
    note: str = ""  # why its losses were not compared with one device's

    @property
    def ok(self) -> bool:
        return not self.error and not self.problems


# ---- the child: the combinations of one device count, one after another in one process ------------------------


def _short(device: str) -> str:
    """'/job:localhost/replica:0/task:0/device:CPU:1' -> 'CPU:1'."""
    return device.rsplit("device:", 1)[-1]


def measure(overrides: list[str], steps: int, timed: int) -> dict[str, Any]:
    """Build the combination as a run does (experiment.build), train `steps` one-step calls and one timed call."""
    from runner.config import compose, validate
    from runner.experiment import build
    from runner.tracking import NoRun

    plan = validate(compose(overrides))
    built = build(plan, NoRun(), log_placement=True)  # the placer logs each op's device, read by the parent
    import tensorflow as tf

    batches = built.strategy.batches(plan.pipeline, built.examples, plan.train.seed)
    loop = built.strategy.train_loop(batches)
    losses = [float(loop(tf.constant(1))[0]) for _ in range(steps)]
    start = time.perf_counter()
    done = int(loop(tf.constant(timed))[1])  # steps run: fewer if the loss stopped being finite
    seconds = time.perf_counter() - start
    units = done * plan.train.global_batch_size * plan.spec.units_per_example
    return {"losses": losses, "rate": units / seconds, "unit": plan.spec.unit, "per_tower": per_tower_layers(plan),
            "variables": sorted({_short(d) for d in built.strategy.variable_devices().values()}),
            "devices": [_short(d) for d in built.devices.names],
            "tags": {**built.devices.as_tags(), **built.strategy.describe()}}


def per_tower_layers(plan: Any) -> list[str]:
    """The model's layers whose output depends on which examples a tower gets: dropout (its masks) and batch
    normalization not synchronized (each tower's batch statistics). With them no strategy's losses can equal one
    device's, so the check compares placement and rate alone (a fresh build, after the measurement)."""
    import keras

    from runner.measure.flops import leaf_layers

    random = (keras.layers.Dropout, keras.layers.GaussianDropout, keras.layers.GaussianNoise, keras.layers.AlphaDropout)
    return sorted({type(layer).__name__ for layer in leaf_layers(plan.model.build(plan.spec))
                   if (isinstance(layer, random) and getattr(layer, "rate", getattr(layer, "stddev", 0)))
                   or (isinstance(layer, keras.layers.BatchNormalization) and not layer.synchronized)})


def placed(log: str) -> dict[str, int]:
    """Device -> matmuls and convolutions TensorFlow's placer put there, from a stretch of its log."""
    return dict(Counter(device for op, device in _PLACED.findall(log) if op in COMPUTE_OPS))


def measured(overrides: list[str], steps: int, timed: int, log: TextIO) -> dict[str, Any]:
    """One combination's RESULT: `measure`'s figures (or the error) and where its compute was placed, read from
    `log` (this process's own stderr, opened for reading), so the parent never reads a log still being written."""
    os.write(2, f"{BEGIN}{' '.join(overrides)}\n".encode())
    log.seek(0, os.SEEK_END)
    try:
        result = measure(overrides, steps, timed)
    except Exception as e:  # noqa: BLE001 - any failure is this combination's result, reported by the parent
        result = {"error": f"{type(e).__name__}: {e}".splitlines()[0][:300]}
    return {**result, "compute": placed(log.read())}


def child(steps: int, timed: int, log_path: str) -> int:
    """`python -m runner.cli.check --each --log FILE ...`: measure the combinations read from stdin (a JSON list of
    override lists) in turn, each begun by a BEGIN line on stderr (FILE, where its placer log follows) and ended by
    its RESULT line on stdout (`measured`): one TensorFlow start for all of them, as they share one device count.
    What an earlier combination built is never freed (freeing a used tf.data iterator can wait seconds)."""
    with open(log_path, errors="replace") as log:
        for overrides in json.loads(sys.stdin.read()):
            sys.stdout.write(RESULT + json.dumps(measured(overrides, steps, timed, log)) + "\n")
            sys.stdout.flush()
    os._exit(0)  # skip TensorFlow's teardown (runner.cli.main._exit_now says why)


# ---- the parent: which combinations, the processes that measure them, the verdict -------------------------------


def measure_all(found: list[Combination], steps: int, timed: int,
                done: Callable[[int, Outcome], None] = lambda n, outcome: None) -> list[Outcome]:
    """Measure the combinations (one device count) in a fresh process, in order, calling `done` with each outcome
    (and its number, from 1) as it comes. A process that dies takes only the combination it was measuring with it:
    a new one goes on with the rest."""
    outcomes: list[Outcome] = []
    while len(outcomes) < len(found):
        for outcome in _one_process(found[len(outcomes):], steps, timed):
            outcomes.append(outcome)
            done(len(outcomes), outcome)
    return outcomes


def _one_process(found: list[Combination], steps: int, timed: int) -> Iterator[Outcome]:
    """The outcomes of one child process, as its result lines come (`measured`), its stderr appended to a file; the
    last is an error if the process ended before measuring them all."""
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "0"}  # the placer logs at INFO
    with tempfile.TemporaryDirectory(prefix="runner-check-") as folder:
        path = Path(folder) / "stderr.log"
        cmd = [sys.executable, "-m", "runner.cli.check", "--each", "--log", str(path), "--steps", str(steps),
               "--timed", str(timed)]
        with path.open("a") as log:
            proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log, text=True,
                                    env=env)
        proc.stdin.write(json.dumps([c.overrides for c in found]))
        proc.stdin.close()
        measured = 0
        for line in proc.stdout:
            if line.startswith(RESULT):
                result = json.loads(line.removeprefix(RESULT))
                known = {k: v for k, v in result.items() if k in Outcome.__dataclass_fields__}
                yield Outcome(found[measured].label, **known)
                measured += 1
        proc.wait()
        if measured < len(found):
            # the last line it said while measuring its last combination (after its last BEGIN), not the placer's
            lines = path.read_text(errors="replace").split(BEGIN)[-1].splitlines()[1:]
            said = last_line("\n".join(line for line in lines if "placer.cc" not in line), "no output")
            yield Outcome(found[measured].label, error=f"exit {proc.returncode}: {said}")


def judge(outcome: Outcome, reference: Outcome, tolerance: float) -> None:
    """Fill in the loss difference and what is wrong with placement or loss (nothing: OK)."""
    if outcome.error:
        return
    idle = [d for d in outcome.devices if not outcome.compute.get(d)]
    stray = [d for d in outcome.compute if d not in outcome.devices]
    homes = [d for d in outcome.variables if d not in outcome.devices and d != "CPU:0"]  # host CPU: parameter server
    outcome.problems += [f"no compute on {', '.join(idle)}"] if idle else []
    outcome.problems += [f"compute on {', '.join(stray)}, not a device of the run"] if stray else []
    outcome.problems += [f"variables on {', '.join(homes)}"] if homes else []
    pairs = list(zip(outcome.losses, reference.losses))
    outcome.diff = max((abs(a - b) / max(abs(b), 1e-12) for a, b in pairs), default=float("nan"))
    if len(outcome.losses) == len(reference.losses) and outcome.diff <= tolerance:
        return
    if outcome.per_tower and len(outcome.losses) == len(reference.losses):
        outcome.note = (f"losses not compared: the model's {', '.join(outcome.per_tower)} computes per tower (dropout "
                        "masks, batch statistics)")
        return
    outcome.problems.append(f"loss differs from one device by {outcome.diff:.1e} (tolerance {tolerance:g})")


def _chosen(group: str, overrides: list[str], dirs: tuple[Path, ...]) -> list[str]:
    """The options of `group` named on the command line (`strategy=a,b`), else all of them."""
    from runner.config import group_options

    named = [o.split("=", 1)[1] for o in overrides if o.startswith(f"{group}=")]
    return named[-1].split(",") if named else group_options(group, dirs)


def combinations(overrides: list[str], gpus: int,
                 dirs: tuple[Path, ...]) -> tuple[list[Combination], dict[str, dict[str, str]]]:
    """The strategy x pipeline combinations that validate for `gpus` devices, and why the others do not apply (per
    strategy, per pipeline)."""
    from runner.cli.overrides import explain
    from runner.config import compose, validate
    from runner.errors import ConfigError
    from runner.strategies import STRATEGIES

    rest = [o for o in overrides if not o.startswith(CHOICES)]
    chosen = _chosen("strategy", overrides, dirs)
    variants = [(s, []) for s in chosen]
    # NVIDIA's all-reduce, where GPUs have it (else refused in one line), for a strategy with that choice
    variants += [(s, ["strategy.cross_device_ops=nccl"]) for s in chosen if s in STRATEGIES.names()
                 and "cross_device_ops" in {f.name for f in dataclasses.fields(STRATEGIES.get(s))}]
    found, skipped = [], {}
    for name, options in variants:
        strategy = " ".join([name, *options])
        for pipeline in _chosen("pipeline", overrides, dirs):
            full = [*BASE, *rest, f"strategy={name}", *options, f"pipeline={pipeline}", f"gpus={gpus}"]
            if name in STRATEGIES.names() and STRATEGIES.get(name).multi_process:
                skipped.setdefault(strategy, {})[pipeline] = ("trains across processes; run `runner check` on each "
                                                              "worker's machine")
                continue
            try:
                validate(compose(full))
            except ConfigError as e:
                skipped.setdefault(strategy, {})[pipeline] = explain(e)
                continue
            found.append(Combination(f"{strategy} / {pipeline}", full))
    return found, skipped


def table(outcomes: list[Outcome], reference: Outcome) -> str:
    """The check's table in Markdown: one row per combination, the one-device reference first."""
    from runner.report.table import markdown

    head = ["combination", "variables on", "matmuls/convs per device", "max loss diff", f"{reference.unit}/s (1 call)",
            "x one device", "result"]
    rows = []
    for o in [reference, *outcomes]:
        compute = ", ".join(f"{d} {n}" for d, n in sorted(o.compute.items()))
        rate = f"{o.rate:,.0f}" if o.rate else ""
        ratio = f"{o.rate / reference.rate:.2f}" if rate and reference.rate else ""
        result = "reference" if o is reference else ("; ".join(["OK", *[o.note] * bool(o.note)]) if o.ok else
                                                     "; ".join([o.error] if o.error else o.problems))
        diff = "" if o is reference or o.diff != o.diff else f"{o.diff:.1e}"  # NaN: no losses to compare
        rows.append([o.label, ", ".join(o.variables), compute, diff, rate, ratio, result])
    return "\n".join(markdown(head, rows))


def _where(tags: dict[str, str]) -> str:
    """What a process trained on, from its device tags."""
    return ", ".join(f"{k.removeprefix('devices.')}={v}" for k, v in tags.items()
                     if k.startswith("devices.") and k != "devices.names")


def _merge(skipped: dict[str, dict[str, str]]) -> list[str]:
    """'s / p: why' lines, one per strategy when every pipeline of it has the same reason."""
    out = []
    for strategy, why in skipped.items():
        if len(set(why.values())) == 1:
            out.append(f"{strategy} (every pipeline checked): {next(iter(why.values()))}")
        else:
            out += [f"{strategy} / {pipeline}: {reason}" for pipeline, reason in why.items()]
    return out


def _record(outcomes: list[Outcome], reference: Outcome, text: str, args: argparse.Namespace, gpus: int,
            common: list[str]) -> str:
    """One MLflow run in the config's experiment (`check`): the table, a metric per combination, the devices."""
    from runner import tracking
    from runner.config import compose

    cfg = compose(common)
    uri = tracking.resolve_uri(cfg.mlflow.tracking_uri)
    tracking.open_store(uri, cfg.mlflow.experiment)
    tags = {"mlflow.runName": f"check gpus={gpus}", "runner.cli.check": "true", **reference.tags,
            **tracking.process_tags()}
    tags.update({k: v for o in outcomes[:1] for k, v in o.tags.items() if k.startswith("devices.")})
    run = tracking.Run(uri, cfg.mlflow.experiment, tags, final_wait=cfg.mlflow.final_wait)
    run.params({"gpus": gpus, "steps": args.steps, "timed_steps": args.timed, "tolerance": args.tolerance,
                "overrides": " ".join(args.overrides)})
    metrics = {"combinations": len(outcomes), "combinations_ok": sum(o.ok for o in outcomes)}
    for o in [reference, *outcomes]:
        key = re.sub(r"[^\w]+", "_", o.label).strip("_")
        metrics[f"{reference.unit}_per_sec.{key}"] = o.rate  # every row's unit: the config's data is the same
        if o.diff == o.diff:
            metrics[f"max_loss_diff.{key}"] = o.diff
    run.metrics(metrics, 0)
    run.text(text, "check.md")
    run.end("FINISHED")
    return run.run_id


def parser() -> argparse.ArgumentParser:
    p = Parser(prog="runner check", description=__doc__.split("\n\n")[0])
    p.add_argument("overrides", nargs="*", help="config overrides: gpus=N, strategy=a,b, pipeline=..., train.*")
    p.add_argument("--config-dir", "-cd", action="append", default=[], help="a folder of your own component YAMLs")
    p.add_argument("--steps", type=positive, default=STEPS,
                   help="one-step calls whose losses are compared (default: %(default)s)")
    p.add_argument("--timed", type=positive, default=TIMED_STEPS, help="steps of the timed call (default: %(default)s)")
    p.add_argument("--tolerance", type=tolerance, default=TOLERANCE,
                   help="largest relative loss difference allowed (default: %(default)s)")
    p.add_argument("--reprobe", action="store_true",
                   help="measure this machine's matmul peak again (stop other jobs first), print it and exit")
    p.add_argument("--each", action="store_true", help=argparse.SUPPRESS)  # internal: the child, combinations on stdin
    p.add_argument("--log", help=argparse.SUPPRESS)  # internal: the child's own stderr, where it reads its placements
    return p


def reprobe() -> int:
    """Measure the host CPU's matmul peak for every dtype it runs natively, keep the higher in the cache, print it."""
    from runner.measure.peak import DTYPES, probe_peak
    from runner.runtime.devices import setup

    setup(0)
    peaks = [probe_peak("/device:CPU:0", dtype, refresh=True) for dtype in DTYPES]
    for peak in filter(None, peaks):
        print(peak)
    if peaks[0] is None:  # float32 always runs: None means the machine was too busy to measure
        raise UserError("the peak was not measured: other processes kept the CPUs busy; stop them and run again")
    return 0


def one_device() -> list[str]:
    """The reference every combination is checked against: the baseline strategy (the registry's) on one device."""
    from runner.strategies import baseline

    return [f"strategy={baseline()}", "pipeline=split", "gpus=1"]


def _device_count(value: str) -> int:
    """gpus=VALUE as runner check takes it: one device count this machine can have, else one UserError line (a
    sweep's value: run it once per count), before the reference runs."""
    from runner.config import allowed
    from runner.hardware import This

    if "," in value or "(" in value:  # 2,4 or range(1,3)
        raise UserError(f"gpus={value}: runner check takes one device count (run it once per count)")
    if not value.isdigit():
        raise UserError(f"gpus={value} is not allowed; expected {allowed('gpus')}")
    This().check_devices(int(value), multi_process=False)
    return int(value)


def check(args: argparse.Namespace) -> int:
    """Run the reference and every combination, print the table and the verdict line; 0 if all are OK."""
    from runner.cli.overrides import searchpath
    from runner.config import compose, validate
    from runner.runtime.devices import nvidia_gpu_count
    from runner.strategies import baseline

    dirs = tuple(Path(d).expanduser().resolve() for d in args.config_dir)
    search = searchpath(dirs)
    common = [*BASE, *search, *(o for o in args.overrides if not o.startswith(CHOICES))]
    # gpus=N from the command line, else the GPUs this machine has, else 2 simulated CPU devices
    named = [o.split("=", 1)[1] for o in args.overrides if o.startswith("gpus=")]
    gpus = _device_count(named[-1]) if named else (nvidia_gpu_count() or 2)
    # The overrides every combination shares, refused once as they are (not once per combination)
    validate(compose([*common, *one_device()]))
    found, skipped = combinations([*search, *args.overrides], gpus, dirs)
    if not found:  # e.g. strategy=single at gpus=2: nothing to compare, said before the reference runs
        raise UserError(f"nothing to check with gpus={gpus}: " + "; ".join(_merge(skipped)))
    print(f"check: {len(found)} combinations on gpus={gpus}, {args.steps} steps each against one device "
          f"(unshuffled, same seed; loss tolerance {args.tolerance:g} relative)", flush=True)
    (reference,) = measure_all([Combination(f"one device: {baseline()} / split", [*common, *one_device()])],
                               args.steps, args.timed)
    if reference.error:
        raise UserError(f"the one-device reference run failed: {reference.error}")

    def done(n: int, outcome: Outcome) -> None:
        judge(outcome, reference, args.tolerance)
        print(f"  [{n}/{len(found)}] {outcome.label}: {'OK' if outcome.ok else 'FAILED'}", flush=True)

    outcomes = measure_all(found, args.steps, args.timed, done)
    text = table(outcomes, reference)
    print(f"\n{text}\n\nreference ran on: {_where(reference.tags)}")
    print(f"combinations ran on: {_where(outcomes[0].tags)}")  # one at least: `found` is not empty
    if skipped:
        print("not applicable here:\n" + "\n".join(f"  {s}" for s in _merge(skipped)))
    run_id = _record(outcomes, reference, text, args, gpus, common)
    failed = [o.label for o in outcomes if not o.ok]
    unchecked = sum(bool(o.note) for o in outcomes)
    print(f"check: {len(outcomes) - len(failed)} of {len(outcomes)} combinations OK"
          + (f" ({unchecked} on placement and rate alone: {reference.per_tower and ', '.join(reference.per_tower)} "
             "computes per tower)" if unchecked else "")
          + (f"; failed: {', '.join(failed)}" if failed else "") + f"  (mlflow run {run_id})")
    return 1 if failed else 0


def main(argv: list[str] | None = None) -> int:
    """Command line; a bad value or an unusable store raises, for the dispatcher (runner.cli.main.subcommand) to say in
    one `error:` line with status 2."""
    from runner.cli.overrides import check_group_overrides

    args = parser().parse_args(argv)
    if args.each:
        return child(args.steps, args.timed, args.log)
    if args.reprobe:
        return reprobe()
    if error := check_group_overrides([*args.overrides, *(f"--config-dir={d}" for d in args.config_dir)]):
        raise UserError(error)
    return check(args)


if __name__ == "__main__":
    from runner.cli.main import subcommand

    sys.exit(subcommand("check", sys.argv[1:]))
