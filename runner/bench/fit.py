"""`published --held-out`: the spec sheet's constants fitted again with some published cells left out, and those cells
predicted with them: how far off a prediction is for a model, a system or a cluster no table fitted.

The shipped constants (`spec_sheet.FIT`) were fitted to every published cell, so their error there is in-sample.
Here each fold fits the constants (least squares on log(predicted / published), from a start that reads no table)
to the other cells only and predicts the left-out ones; a fold's predictions never read the cells they are scored
against (a test changes those and sees the same predictions). What no training cell uses cannot be fitted: an
architecture is then priced with a fitted one's scale (as `runner predict` prices Volta and later), an algorithm
as GEMM.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, replace
from typing import Any, Callable

from runner.bench.jobs import emit, save
from runner.bench.published import Cell, chosen, efficiency
from runner.predict.spec_sheet import FIT, Constants, Layer
from runner.report.prediction import TIE
from runner.report.table import markdown, markdown_row

# A start that reads no table: the spec sheet's peaks reached in full, little synchronisation, and a kernel launch's
# order as the fixed cost per kernel, which is never fitted (the tables' large batches cannot tell it from 0).
START = Constants(algorithms=dict.fromkeys(("gemm", "fast", "implicit"), 1.0), architecture={}, reference="",
                  memory=1.0, kernel_cycles=10_000, link=1.0, overlap=0.1, sync=0.01)
SCALARS = ("memory", "link", "sync")  # fitted in log space (positive); overlap in [0, 0.95]
# The limits a fit may not pass: a fraction of a peak is at most 1; the fast algorithms' saving over the counted
# multiplications at most 4x (Winograd F(4x4, 3x3) does 4x fewer; cuDNN's FFT tiles save less on 5x5 and up).
LIMITS = {"gemm": 1.0, "implicit": 1.0, "fast": 4.0, "memory": 1.0, "link": 1.0}


@dataclass(frozen=True)
class Sample:
    """A published cell and what prices it: the combination's plan and its model's layers."""

    cell: Cell
    plan: Any
    layers: list[Layer]

    def rate(self, constants: Constants) -> float:
        """The cell's predicted images/s with `constants`."""
        from runner.predict.grid import spec_sheet_prediction

        return spec_sheet_prediction(self.plan, self.layers, constants).rate


def samples(found: list[Cell]) -> list[Sample]:
    """Each cell's plan and model layers (each model built once): what pricing it again with other constants needs."""
    from runner.predict.grid import model_layers, plan_for

    cache: dict[tuple, Any] = {}
    plans = [plan_for(list(cell.overrides), refusals_raise=True)[1] for cell in found]
    return [Sample(cell, plan, model_layers(plan, cache)) for cell, plan in zip(found, plans)]


def fit(train: list[Sample]) -> Constants:
    """The constants that best predict `train` (least squares on the log error), from START and within LIMITS."""
    from scipy.optimize import least_squares

    present = list(dict.fromkeys(s.plan.hardware.accelerator.architecture for s in train))
    reference = "pascal" if "pascal" in present else present[0]  # scale 1: the others' are relative to it
    used = {layer.algorithm for s in train for layer in s.layers if layer.algorithm}
    algorithms = [a for a in START.algorithms if a in used]  # an algorithm no cell uses is priced as GEMM
    scaled = [a for a in present if a != reference]
    positive = [*algorithms, *scaled, *SCALARS]  # fitted as logarithms; the overlap, a fraction, as it is

    def constants(x: Any) -> Constants:
        *logs, overlap = x
        value = dict(zip(positive, map(math.exp, logs)))
        gemm = value.get("gemm", START.algorithms["gemm"])
        return replace(START, algorithms={a: value.get(a, gemm) for a in START.algorithms},
                       architecture={reference: 1.0, **{a: value[a] for a in scaled}}, reference=reference,
                       overlap=float(overlap), **{k: value[k] for k in SCALARS})

    start = [math.log(START.algorithms[a]) for a in algorithms] + [0.0] * len(scaled)
    start += [math.log(getattr(START, k)) for k in SCALARS] + [START.overlap]
    lower = [-math.inf] * len(positive) + [0.0]
    upper = [math.log(LIMITS[n]) if n in LIMITS else math.inf for n in positive] + [0.95]
    start = [min(x, u - 1e-3) for x, u in zip(start, upper)]  # strictly inside: the start may sit on a limit
    return constants(least_squares(lambda x: errors(train, constants(x)), start, bounds=(lower, upper)).x)


def errors(found: list[Sample], constants: Constants) -> list[float]:
    """log(predicted / published) per sample."""
    return [math.log(s.rate(constants) / s.cell.published) for s in found]


@dataclass(frozen=True)
class Fold:
    """One held-out check: what was left out, and every cell's rate predicted with the constants fitted without it."""

    name: str
    held: list[Cell]
    rates: dict[Cell, float]

    @property
    def errors(self) -> list[float]:
        """predicted / published - 1 of each left-out cell."""
        return [self.rates[c] / c.published - 1 for c in self.held]

    def efficiency_gaps(self) -> list[float]:
        """Predicted minus published scaling efficiency (points) at the largest count of each left-out group (its
        one-GPU rate predicted with the same constants, whether left out or not)."""
        gaps = []
        for group in dict.fromkeys(c.group for c in self.held):
            members = [c for c in self.rates if c.group == group]
            most = max(members, key=lambda c: c.gpus)
            if most in self.held and len(members) > 1:
                pred = efficiency([(c.gpus, self.rates[c]) for c in members])
                gaps.append(100 * (pred - efficiency([(c.gpus, c.published) for c in members])))
        return gaps

    def fastest(self) -> tuple[int, int]:
        """Of the left-out settings (system, model, batch, GPUs) whose published modes differ beyond TIE (a setting
        where they all lie within it has no fastest to predict), in how many the predicted fastest was the published
        one and no other mode was predicted within TIE of it (`runner predict`'s tie: no answer), and how many."""
        settings: dict[tuple, list[Cell]] = {}
        for cell in self.held:
            settings.setdefault((cell.hardware, cell.model, cell.batch, cell.gpus), []).append(cell)
        decisive = [cells for cells in settings.values() if _apart(sorted(c.published for c in cells))]
        right = sum(_apart(sorted(self.rates[c] for c in cells))
                    and max(cells, key=self.rates.get) == max(cells, key=lambda c: c.published) for cells in decisive)
        return right, len(decisive)


def _apart(rates: list[float]) -> bool:
    """Whether the highest of `rates` (ascending) leads the next beyond TIE."""
    return len(rates) > 1 and rates[-2] < (1 - TIE) * rates[-1]


FOLDS: dict[str, Callable[[Cell], str]] = {  # how cells are grouped for leaving out, one group at a time
    "model": lambda c: c.model,
    "system": lambda c: c.hardware,
    "machines": lambda c: "several machines" if c.nodes > 1 else "",  # fitted on one machine's cells alone
}


def held_out(found: list[Sample], by: str) -> list[Fold]:
    """For each group of `FOLDS[by]` (but ''), every cell predicted with the constants fitted to the others."""
    group = FOLDS[by]
    groups = {group(s.cell) for s in found}
    if len(groups) < 2:  # leaving the only group out leaves nothing to fit to
        return []
    out = []
    for name in sorted(groups - {""}):
        constants = fit([s for s in found if group(s.cell) != name])
        out.append(Fold(f"{by}={name}", [s.cell for s in found if group(s.cell) == name],
                        {s.cell: s.rate(constants) for s in found}))
    return out


def lines(found: list[Sample]) -> list[str]:
    """The held-out table in markdown: the shipped constants (this fit on every cell: in-sample), then each fold, and
    each way of leaving out with its folds together."""
    everything = [s.cell for s in found]
    out = markdown(["cells predicted", "constants fitted to", "cells", "median error", "largest error",
                    "efficiency gap at the most GPUs (median, largest)", "fastest mode right"])
    out.append(_row("all (shipped constants)", "all (in-sample)",
                    [Fold("all", everything, {s.cell: s.rate(FIT) for s in found})]))
    for by in FOLDS:
        folds = held_out(found, by)
        out += [_row(fold.name, "the others", [fold]) for fold in folds]
        out += [_row(f"**each {by} left out**", "the others", folds)] if len(folds) > 1 else []
    return out + ["", f"fastest mode right: of the settings (system, model, batch, GPUs) whose published modes differ "
                      f"beyond {TIE:.0%}, those whose published fastest was predicted fastest, no other mode within "
                      f"{TIE:.0%} of it (-: no such setting)"]


def _row(name: str, fitted: str, folds: list[Fold]) -> str:
    """One row: the folds' left-out cells' errors, efficiency gaps and fastest modes, together."""
    misses = [abs(e) for f in folds for e in f.errors]
    gaps = [g for f in folds for g in f.efficiency_gaps()]
    right, decisive = map(sum, zip(*(f.fastest() for f in folds)))
    largest = round(max(gaps, key=abs), 1) + 0.0 if gaps else 0.0  # + 0.0: -0.0 printed as +0.0
    spread = f"{statistics.median(map(abs, gaps)):.1f}, {largest:+.1f} points" if gaps else "-"
    return markdown_row([name, fitted, str(len(misses)), f"{statistics.median(misses):.1%}", f"{max(misses):.1%}",
                         spread, f"{right} of {decisive}" if decisive else "-"])


def held_out_command(args: Any) -> int:
    """`python -m runner.bench published --held-out`: print (and with --out write) the held-out table."""
    out = lines(samples(chosen(args)))
    emit([], out)
    save(out, args.out)
    return 0
