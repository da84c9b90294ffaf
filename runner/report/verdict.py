"""The answer to "which pipeline and strategy is fastest on my devices, and does it still learn the same?", from a
table of runs, as one `verdict:` line per model (with its setting: runner.report.table.settings) and kind of run
(runner/report/kinds.py).

Fastest means: lowest time to the target (training seconds) among the combinations that reached it; where none
did, highest throughput, and the line says so. Repeats of a combination (pipeline, strategy, device count) are
combined by their median. The margin over the runner-up counts as real only beyond the noise (`_beyond_noise`): how
much a whole run moves from one start to the next, the run-to-run spread of the same table (`run_to_run_spread`).
"Learns the same" compares each run's final test score and loss with the 1-device run of its model and seed
(`reference_for`).
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from typing import Iterable

from runner.report import kinds
from runner.strategies import baseline
from runner.tasks import METRICS


@dataclass(frozen=True)
class Tolerance:
    """How close a run's final test score and loss must be to the 1-device run's to count as learning the same: a
    bounded score by its difference, an unbounded one (the loss) by its relative difference."""

    accuracy: float = 0.01  # absolute difference of a bounded score (test accuracy, AUC)
    loss: float = 0.10  # relative difference of an unbounded figure (test loss)

    def within(self, metric: str, value: float, base: float) -> bool:
        """Whether `value` of `metric` is within tolerance of the 1-device run's `base`."""
        if METRICS[metric].bounded:
            return abs(value - base) <= self.accuracy
        return abs(value - base) <= self.loss * abs(base)

    def said(self, score: str) -> str:
        """The tolerance, in the words of a run whose score is `score`."""
        bound = f"{self.accuracy:g}" if METRICS[score].bounded else f"{self.loss:.0%}"
        return f"|Δ test {METRICS[score].said}| <= {bound}, |Δ test loss| <= {self.loss:.0%}"


@dataclass
class Run:
    """What the verdict needs of one run (runner.report.table's `Row` is one, with the table's other columns)."""

    model: str
    pipeline: str
    strategy: str
    devices: int
    rate: float = math.nan  # throughput in `unit`/s
    stderr: float = math.nan
    score: float = math.nan  # the final test figure of its task (`score_metric`)
    loss: float = math.nan
    time_to_target: float = math.nan  # NaN: the target was not reached (or none was set)
    target: float = math.nan
    status: str = "FINISHED"
    scaling: str = "strong"
    host_only: bool = False  # gpus=0: the host CPU, not one of the devices
    unit: str = "images"  # what `rate` counts: images, tokens or examples (data_pipelines.Spec.unit)
    target_metric: str = "accuracy"  # what `target` is (runner.tasks.METRICS: met at or over a score, under a loss)
    score_metric: str = "accuracy"  # what `score` is: its task's score (accuracy, a click model's AUC)
    seed: str = ""  # train.seed: a run learns the same as the 1-device run of its own seed, where there is one
    first_check: bool = False  # its target met at its first evaluation: its time to it is the start-up's

    @property
    def combination(self) -> str:
        """What a run did, as the verdict names it: runs doing the same work share it (their repeats)."""
        where = " on the host CPU" if self.host_only else ""
        return f"{self.strategy}/{self.pipeline} x{self.devices}{where}" + (" (weak)" if self.scaling == "weak" else "")


@dataclass
class Combination:
    """The runs of one pipeline x strategy x devices, combined: median figures and their spread."""

    name: str
    runs: list[Run] = field(default_factory=list)

    def values(self, key: str) -> list[float]:
        return [v for r in self.runs if not math.isnan(v := getattr(r, key))]

    def median(self, key: str) -> float:
        values = self.values(key)
        return statistics.median(values) if values else math.nan


def learns_same(run: Run, base: Run | None, tolerance: Tolerance) -> bool | None:
    """Whether `run` ends within `tolerance` of `base` (its model's 1-device run); None: nothing to compare."""
    if base is None or any(math.isnan(v) for v in (run.score, run.loss, base.score, base.loss)):
        return None
    return tolerance.within(run.score_metric, run.score, base.score) and tolerance.within("loss", run.loss, base.loss)


def one_device(runs: Iterable[Run]) -> Run | None:
    """The reference run of a model: on 1 device, `single` first (the strategy every other is compared with)."""
    candidates = [r for r in runs if r.devices == 1 and not r.host_only and r.status == "FINISHED"]
    return min(candidates, key=lambda r: (r.strategy != baseline(), r.pipeline != "split"), default=None)


def reference_for(run: Run, runs: Iterable[Run]) -> Run | None:
    """The 1-device run `run` is compared with: of its own seed where there is one (another seed learns otherwise
    on any device), else the model's (`one_device`)."""
    runs = list(runs)
    return one_device(r for r in runs if r.seed == run.seed) or one_device(runs)


def _combinations(runs: list[Run]) -> list[Combination]:
    groups: dict[str, Combination] = {}
    for run in runs:
        groups.setdefault(run.combination, Combination(run.combination)).runs.append(run)
    return list(groups.values())


@dataclass(frozen=True)
class Spread:
    """How much runs doing the same work differed: (largest - smallest) / median, and which runs showed it."""

    relative: float
    source: str

    def __str__(self) -> str:
        return f"run-to-run spread {self.relative:.0%}, {self.source}"


def _relative(values: list[float]) -> float:
    return (max(values) - min(values)) / statistics.median(values)


def run_to_run_spread(combos: list[Combination], key: str, compared: Iterable[Combination] = ()) -> Spread | None:
    """The largest spread between runs of the same work in this table: the repeats of one combination, or the
    1-device runs of different strategies other than the `compared` ones (a margin judged by its own runs would
    always be beyond the noise); None when no two such runs do the same work."""
    found = [Spread(_relative(c.values(key)), f"repeats of {c.name}") for c in combos if len(c.values(key)) > 1]
    judged = {c.name for c in compared}
    one_device = [c.median(key) for c in combos if c.name not in judged
                  and c.runs[0].devices == 1 and not c.runs[0].host_only and not math.isnan(c.median(key))]
    if len(one_device) > 1:
        found.append(Spread(_relative(one_device), f"{len(one_device)} one-device runs"))
    return max(found, key=lambda s: s.relative, default=None)


def _beyond_noise(best: Combination, other: Combination, key: str, spread: Spread | None) -> bool | None:
    """Whether best's advantage on `key` exceeds the noise: the margin of the medians beyond the run-to-run spread it
    is said with and, where both were repeated, their ranges apart too (two repeats each fall apart by chance one
    time in three); None when the noise is unknown."""
    if spread is None:
        return None
    a, b = best.values(key), other.values(key)
    apart = min(a) > max(b) if key == "rate" else max(a) < min(b)
    faster, slower = (best, other) if key == "rate" else (other, best)
    return faster.median(key) / slower.median(key) - 1 > spread.relative and (apart or len(a) < 2 or len(b) < 2)


@dataclass
class Verdict:
    """The fastest combination of one model, and what supports the claim."""

    model: str
    basis: str  # "time to target" or "throughput"
    best: Combination
    runner_up: Combination | None
    over_runner_up: float | None  # how many times faster than the runner-up
    over_one_device: float | None  # how many times faster than the 1-device run
    beyond_noise: bool | None
    spread: Spread | None  # the run-to-run spread the noise was judged by
    target: float
    reached: int  # combinations that reached the target
    same: tuple[int, int]  # (combinations that learn the same, combinations compared)
    tolerance: Tolerance
    reference: str | None = None  # the 1-device run's combination the others are compared with (None: no such run)
    at_once: bool = False  # every run met the target at its first evaluation: ranked by throughput instead

    def line(self) -> str:
        """The `verdict:` line."""
        key = "time_to_target" if self.basis == "time to target" else "rate"
        value = self.best.median(key)
        metric = self.best.runs[0].target_metric
        level = METRICS[metric].level(self.target)
        target = f"{level} test accuracy" if metric == "accuracy" else f"test {METRICS[metric].said} {level}"
        seconds = f"{value:.1f}" if value >= 1 else f"{value:.2g}"  # 0.34 s and 0.31 s, not 0.3 s twice
        figure = f"{seconds} s to {target}" if key == "time_to_target" else \
            f"{value:,.0f} {self.best.runs[0].unit}/s"
        alone = self.runner_up is None  # one combination: nothing it was faster than
        parts = [f"verdict: {self.model}: {'only' if alone else 'fastest'} {self.best.name} ({figure})"
                 + (", no other combination finished to compare with" if alone else "")]
        if self.basis == "throughput":
            if self.at_once:
                why = f"every run met {target} at its first check (its time to it is start-up's, not training's)"
            else:
                why = f"no run reached {target}" if not math.isnan(self.target) else "no target was set"
            parts[0] += f", by throughput: {why}"
        if self.runner_up is not None and self.over_runner_up is not None:
            parts.append(f"{self.over_runner_up:.2f}x {self.runner_up.name}")
            noise = {True: "beyond the noise", False: "within the noise",
                     None: "noise unknown (single runs: repeat them, sweep.repeats=3, to know)"}[self.beyond_noise]
            parts.append(f"{noise} ({self.spread})" if self.beyond_noise is not None and self.spread else noise)
        if self.over_one_device is not None and (self.runner_up is None or self.runner_up.name != self.reference):
            parts.append(f"{self.over_one_device:.2f}x {self.reference}")  # named: the table's speedups may take another
        agree, compared = self.same
        said = self.tolerance.said(self.best.runs[0].score_metric)
        parts.append(f"learns the same as 1 device: {agree} of {compared} ({said})" if compared else
                     f"learns the same: no other run to compare with the 1-device run ({self.reference})"
                     if self.reference else "learns the same: no 1-device run to compare with")
        return "; ".join(parts)


def _speed(c: Combination, basis: str) -> float:
    """Larger is faster: images/s (tokens/s, examples/s), or 1 / time to the target."""
    return c.median("rate") if basis == "throughput" else 1.0 / c.median("time_to_target")


def decide(runs: list[Run], tolerance: Tolerance = Tolerance()) -> list[Verdict]:
    """One verdict per model over its finished runs (ties go to the first combination by name), per kind of run
    (runner/report/kinds.py): a model's runs of two units are two verdicts, never one ranking."""
    verdicts = []
    for _, part in kinds.split(runs):
        for model in sorted({r.model for r in part}):
            mine = [r for r in part if r.model == model and r.status == "FINISHED"]
            combos = sorted(_combinations(mine), key=lambda c: c.name)
            reached = [c for c in combos if c.values("time_to_target")]
            at_once = bool(reached) and all(r.first_check for c in reached for r in c.runs
                                            if not math.isnan(r.time_to_target))
            basis = "time to target" if reached and not at_once else "throughput"
            ranked = sorted([c for c in (reached or combos) if not math.isnan(_speed(c, basis))],
                            key=lambda c: -_speed(c, basis))
            if ranked:
                verdicts.append(_verdict(model, basis, ranked, mine, combos, len(reached), tolerance, at_once))
    return verdicts


def _verdict(model: str, basis: str, ranked: list[Combination], mine: list[Run], combos: list[Combination],
             reached: int, tolerance: Tolerance, at_once: bool = False) -> Verdict:
    best, runner_up = ranked[0], ranked[1] if len(ranked) > 1 else None
    key = "time_to_target" if basis == "time to target" else "rate"
    base = one_device(mine)
    base_combo = next((c for c in combos if base is not None and c.name == base.combination), None)
    over_base = (_speed(best, basis) / _speed(base_combo, basis)
                 if base_combo is not None and base_combo is not best and base_combo in ranked else None)
    verdicts = [learns_same(r, reference, tolerance) for r in mine if (reference := reference_for(r, mine)) is not r]
    judged = [v for v in verdicts if v is not None]
    targets = [r.target for r in mine if not math.isnan(r.target)]
    spread = run_to_run_spread(combos, key, [c for c in (best, runner_up) if c is not None])
    return Verdict(
        model, basis, best, runner_up,
        _speed(best, basis) / _speed(runner_up, basis) if runner_up is not None else None,
        over_base, _beyond_noise(best, runner_up, key, spread) if runner_up is not None else None, spread,
        targets[0] if targets else math.nan, reached, (sum(judged), len(judged)), tolerance,
        base.combination if base is not None else None, at_once,
    )
