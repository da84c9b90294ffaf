"""How well the cost model's predictions (runner/predict/) matched what was measured, over a table of runs.

Per group of rows that compete (one model on one device count): the median relative error, the rank correlation
(Spearman) of predicted and measured rates, how many of the pairs measured apart beyond the run-to-run spread the
prediction ordered right, and what the measurement says of the predicted fastest (`Judgement.verdict`). Repeats of a
combination are combined by their median; their ranges give the spread, and their halves ranked against each other
(the retest) say how well the measurement orders the group itself.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Iterable

TIE = 0.10  # predicted rates closer than this are called a tie: the model is not finer than that


@dataclass
class Measured:
    """One combination of a group: its predicted rate and its runs' measured rates."""

    label: str
    predicted: float
    rates: list[float] = field(default_factory=list)

    @property
    def rate(self) -> float:
        return statistics.median(self.rates)

    @property
    def spread(self) -> float | None:
        """Relative range of its runs, None for a single run."""
        return (max(self.rates) - min(self.rates)) / self.rate if len(self.rates) > 1 else None

    def halves(self) -> tuple[float, float] | None:
        """The median of its even-numbered runs and of its odd-numbered ones (runs in round order), None for one."""
        return (statistics.median(self.rates[0::2]), statistics.median(self.rates[1::2])) \
            if len(self.rates) > 1 else None


def combine(rows: list[tuple[str, float, float]]) -> list[Measured]:
    """(label, predicted, measured) rows, repeats of a label combined, in first-seen order."""
    out: dict[str, Measured] = {}
    for label, predicted, measured in rows:
        out.setdefault(label, Measured(label, predicted)).rates.append(measured)
    return list(out.values())


def _ranks(values: list[float]) -> list[float]:
    """Each value's rank from 0; ties share their mean rank."""
    return [(sum(v < x for v in values) + sum(v <= x for v in values) - 1) / 2 for x in values]


def spearman(a: list[float], b: list[float]) -> float | None:
    """Rank correlation of a and b (None with fewer than 3 values or no spread in either)."""
    if len(a) < 3 or len(set(a)) < 2 or len(set(b)) < 2:
        return None
    return statistics.correlation(_ranks(a), _ranks(b))  # Pearson's of the ranks


@dataclass
class Judgement:
    """The figures of one group."""

    combos: int
    median_error: float
    spearman: float | None
    retest: float | None  # Spearman of the halves of every combination's runs against each other; None: a single run
    spread: float | None  # the largest relative range of a repeated combination; None: no repeats
    pairs_ordered: int  # of `pairs`, those the prediction ordered right
    pairs: int  # pairs whose measured rates differ by more than the spread, and predicted ones by more than TIE
    predicted_fastest: str
    measured_fastest: str
    fastest_ratio: float  # the predicted fastest's measured rate / the measured fastest's
    margin: float | None = None  # the measured fastest's rate / the next one's; None: one combination
    runner_up: str = ""  # the next one measured
    predicted_ties: list[str] = field(default_factory=list)  # predicted within TIE of the predicted fastest
    pairs_tied: int = 0  # pairs measured apart that the prediction called a tie (within TIE): no order claimed

    def beyond_noise(self, ratio: float) -> bool:
        """Whether two rates `ratio` apart (>= 1) differ by more than the run-to-run spread (as the pairs counted)."""
        return ratio - 1 > (self.spread or 0.0)

    @property
    def verdict(self) -> str:
        """What the measurement says of the predicted fastest: confirmed only where repeats measured it the fastest
        beyond the run-to-run spread; not refuted where it measured within the spread of the fastest (or the fastest,
        but within the spread of the next); refuted where another measured faster beyond it; undecided on single runs
        (no spread to judge by)."""
        if self.spread is None:
            return "undecided"
        if self.predicted_fastest != self.measured_fastest:
            return "refuted" if self.beyond_noise(1 / self.fastest_ratio) else "not refuted"
        return "confirmed" if self.margin is not None and self.beyond_noise(self.margin) else "not refuted"

    @property
    def confirmed(self) -> bool:
        return self.verdict == "confirmed"


def judge(combos: list[Measured]) -> Judgement:
    """The accuracy figures of one group of combinations."""
    spreads = [c.spread for c in combos if c.spread is not None]
    spread = max(spreads) if spreads else None
    measured_apart = [(a, b) for i, a in enumerate(combos) for b in combos[i + 1:]
                      if abs(a.rate - b.rate) / min(a.rate, b.rate) > (spread or 0.0)]
    apart = [(a, b) for a, b in measured_apart  # a pair predicted within TIE is a tie: no order to be right or wrong
             if abs(a.predicted - b.predicted) / min(a.predicted, b.predicted) > TIE]
    ordered = sum((a.rate > b.rate) == (a.predicted > b.predicted) for a, b in apart)
    halves = [c.halves() for c in combos]
    retest = spearman([h[0] for h in halves], [h[1] for h in halves]) if all(halves) else None
    best_predicted = max(combos, key=lambda c: c.predicted)
    best_measured, *others = sorted(combos, key=lambda c: -c.rate)
    return Judgement(
        len(combos), statistics.median(abs(c.predicted - c.rate) / c.rate for c in combos),
        spearman([c.predicted for c in combos], [c.rate for c in combos]), retest, spread, ordered, len(apart),
        best_predicted.label, best_measured.label, best_predicted.rate / best_measured.rate,
        best_measured.rate / others[0].rate if others else None, others[0].label if others else "",
        [c.label for c in combos if c is not best_predicted and c.predicted >= (1 - TIE) * best_predicted.predicted],
        len(measured_apart) - len(apart))


def line(group: str, j: Judgement) -> str:
    """One line in words: errors, order, and what the measurement says of the predicted fastest (`verdict`)."""
    if j.combos == 1:  # nothing to order or to be fastest among
        return f"prediction: {group}: 1 combination, error {j.median_error:.0%}"
    known = j.spread is not None
    noise = f"run-to-run spread {j.spread:.0%}" if known else "single runs: noise unknown, every pair counts"
    rho = f"Spearman {j.spearman:.2f}" if j.spearman is not None else "Spearman -"
    if j.retest is not None:
        rho += f" (the repeats against each other {j.retest:.2f})"
    tied = f", {j.pairs_tied} predicted within {TIE:.0%} (a tie) left out" if j.pairs_tied else ""
    if j.pairs:
        order = f"{j.pairs_ordered} of {j.pairs} pairs {'apart beyond the noise ' if known else ''}ordered right{tied}"
    elif j.pairs_tied:
        order = f"no pair to order: those measured apart were predicted within {TIE:.0%} (a tie)"
    else:
        order = "every combination within the noise of the others (a tie)"
    fastest = f"predicted fastest {j.predicted_fastest}"
    if j.predicted_ties:  # the model called it no faster than these
        fastest += f" (a tie: {', '.join(j.predicted_ties)} predicted within {TIE:.0%} of it)"
    if j.predicted_fastest == j.measured_fastest:  # by throughput, as predicted (a verdict may rank by time)
        fastest += f": measured the fastest by throughput, {j.margin:.2f}x the next ({j.runner_up})"
    else:
        fastest += f": measured {j.fastest_ratio:.2f}x the throughput of the fastest ({j.measured_fastest})"
    fastest += {"confirmed": ", beyond the noise: confirmed",
                "not refuted": ": not refuted (within the noise)",
                "refuted": f", beyond the noise: refuted (the model was wrong by {1 - j.fastest_ratio:.0%})",
                "undecided": ": undecided (single runs)"}[j.verdict]
    return (f"prediction: {group}: {j.combos} combinations, median error {j.median_error:.0%}, {rho}, {order} "
            f"({noise}); {fastest}")


def grouped(rows: Iterable[tuple[str, str, float, float]]) -> dict[str, list[Measured]]:
    """(group, combination, predicted, measured) rows, one per run: each group's combinations, repeats combined;
    groups in first-seen order."""
    groups: dict[str, list[tuple[str, float, float]]] = {}
    for group, *row in rows:
        groups.setdefault(group, []).append(tuple(row))
    return {group: combine(runs) for group, runs in groups.items()}


def group_lines(groups: dict[str, list[Measured]], least: int = 2) -> list[str]:
    """The line of every group with `least` or more combinations, in the given order."""
    return [line(group, judge(combos)) for group, combos in groups.items() if len(combos) >= least]
