"""The report's pictures of runs of one kind (runner/report/kinds.py), readable at the size MLflow previews them:
`scaling.png`, `time_to_accuracy.png` and `accuracy.png`."""

from __future__ import annotations

import math
import statistics
from collections import Counter
from pathlib import Path
from typing import Any, Callable

from runner.report import kinds
from runner.tasks import METRICS

FONT = 10  # points, for labels, ticks and legends


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plt.rcParams.update({"font.size": FONT, "legend.fontsize": FONT - 1, "axes.titlesize": FONT + 1})
    return plt


def _label(row: Any) -> str:
    return f"{row.model} {row.strategy}/{row.pipeline}"


def _labels(rows: list[Any]) -> list[str]:
    """Each row's label with its device count, and its seed where the rows' seeds differ (`seed 0`); a
    combination's repeats numbered by their sweep round where they have one, else in order (#1, #2), so that none
    hides another."""
    seeds = len({getattr(r, "seed", "") for r in rows} - {""}) > 1
    plain = [f"{_label(r)} x{r.devices}" + (f" seed {r.seed}" if seeds and r.seed else "") for r in rows]
    seen: Counter[str] = Counter()
    numbered = []
    for label, r in zip(plain, rows):
        seen[label] += 1
        rounds = {getattr(o, "round", "") for o, other in zip(rows, plain) if other == label}
        number = r.round.partition(" ")[0] if len(rounds) == plain.count(label) and "" not in rounds else seen[label]
        numbered.append(f"{label} #{number}" if plain.count(label) > 1 else label)
    return numbered


def _medians(rows: list[Any], figure: Callable[[Any], float]) -> tuple[list[int], list[float], list[list[float]]]:
    """Per device count of `rows`: the median of `figure` over its repeats, and how far the lowest and the highest
    lie below and above it (0 and 0 for a single run): one point and its range per count, not a zigzag."""
    by: dict[int, list[float]] = {}
    for r in rows:
        if not math.isnan(figure(r)):
            by.setdefault(r.devices, []).append(figure(r))
    xs = sorted(by)
    ys = [statistics.median(by[n]) for n in xs]
    return xs, ys, [[y - min(by[n]) for n, y in zip(xs, ys)], [max(by[n]) - y for n, y in zip(xs, ys)]]


def scaling(rows: list[Any], path: Path) -> None:
    """Throughput (left) and speedup (right) against devices, one line per pipeline x strategy (the median of its
    repeats, their range as error bars) beside the ideal linear line; a sorted bar chart of the throughput when there
    is one device count."""
    plt, unit = _pyplot(), kinds.one(rows).unit
    done = [r for r in rows if r.status == "FINISHED" and not math.isnan(r.rate)]
    if len({r.devices for r in done}) < 2:
        return _bars(plt, done, unit, path)
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 5))
    groups: dict[str, list[Any]] = {}
    for r in done:
        groups.setdefault(_label(r), []).append(r)
    counts, one = sorted({r.devices for r in done}), []
    for label, rs in sorted(groups.items()):
        xs, ys, err = _medians(rs, lambda r: r.rate)
        color = _curve(left, xs, ys, err, label)
        one += [y for x, y in zip(xs, ys) if x == 1]
        _curve(right, *_medians(rs, lambda r: r.speedup), label, color)
    if one:  # ideal: the best 1-device median times the devices
        left.plot(counts, [max(one) * n for n in counts], "k--", alpha=0.6, label="ideal (linear)")
    right.plot(counts, counts, "k--", alpha=0.6, label="ideal (linear)")
    repeats = " (median, range of repeats)" if len(done) > len({(_label(r), r.devices) for r in done}) else ""
    shared = "; simulated devices share the host's cores" if any(getattr(r, "simulated", False) for r in done) else ""
    left.set(xlabel="devices", ylabel=f"{unit}/s", title=f"Throughput{repeats}")
    right.set(xlabel=f"devices{shared}", ylabel="speedup over 1 device", title=f"Speedup{repeats}")
    for ax in (left, right):
        ax.set_xticks(counts)
        ax.grid(alpha=0.3)
    _legend_below(left)
    _save(plt, fig, path)


def _curve(ax: Any, xs: list[int], ys: list[float], err: list[list[float]], label: str, color: Any = None) -> Any:
    """A curve of medians on `ax`, with the range of the repeats as error bars where there are repeats; its colour."""
    if not xs:
        return color
    (line,) = ax.plot(xs, ys, "o-", label=label, color=color)
    if any(any(e) for e in err):
        ax.errorbar(xs, ys, yerr=err, fmt="none", ecolor=line.get_color(), capsize=3)
    return line.get_color()


def _bars(plt: Any, done: list[Any], unit: str, path: Path) -> None:
    done = sorted(done, key=lambda r: r.rate)
    fig, ax = plt.subplots(figsize=(9, max(2.5, 0.45 * len(done) + 1.2)))
    labels = _labels(done)
    bars = ax.barh(labels, [r.rate for r in done], color="tab:blue")
    ax.bar_label(bars, labels=[f"{r.rate:,.0f}" for r in done], padding=3)
    ax.set(xlabel=f"{unit}/s", title="Throughput (one device count: no scaling curve)")
    ax.set_xlim(0, max([r.rate for r in done], default=1) * 1.2)
    _save(plt, fig, path)


def time_to_accuracy(rows: list[Any], curves: dict[str, list[tuple[float, float]]], path: Path) -> None:
    """The test figure the runs were timed to against training seconds, one curve per run (`curves`: run id ->
    [(seconds, value), ...]), the target as a horizontal line, a star where it was confirmed on the full test set."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(9, 5))
    stars = 0
    for r, label in zip(rows, _labels(rows)):
        points = sorted(curves.get(r.run_id, []))
        if points:
            (line,) = ax.plot(*zip(*points), "o-", markersize=3, label=label)
            if not math.isnan(r.time_to_target):  # a check on the slice touching the line is not a confirmation
                ax.plot([r.time_to_target], [r.target], "*", markersize=15, color=line.get_color(),
                        markeredgecolor="k", label="_nolegend_")
                stars += 1
    if stars:  # one legend entry for every star, in no run's colour
        ax.plot([], [], "*", markersize=12, color="w", markeredgecolor="k",
                label="target confirmed on the full test set")
    metric = METRICS[kinds.one(rows).target]
    named = f"test {metric.said}"
    targets = {r.target for r in rows if not math.isnan(r.target)}
    for target in targets:
        ax.axhline(target, color="k", linestyle="--", alpha=0.6, label=f"target {metric.level(target)}")
    ax.set(xlabel="training seconds (evaluation excluded)", ylabel=named,
           title="Time to accuracy" if metric.name == "accuracy" else f"Time to a {named}")
    ax.grid(alpha=0.3)
    if ax.lines:
        _legend_below(ax)
    _save(plt, fig, path)


def accuracy(rows: list[Any], path: Path) -> None:
    """Final test score per combination: dots on an axis zoomed to the data, values printed."""
    plt, score = _pyplot(), METRICS[kinds.one(rows).score]
    done = sorted([r for r in rows if r.status == "FINISHED" and not math.isnan(r.score)], key=lambda r: r.score)
    fig, ax = plt.subplots(figsize=(9, max(2.5, 0.45 * len(done) + 1.2)))
    labels = _labels(done)
    values = [r.score for r in done]
    ax.plot(values, labels, "o", color="tab:green", markersize=8)
    for value, label in zip(values, labels):
        ax.annotate(f"{value:.4f}", (value, label), textcoords="offset points", xytext=(8, -3))
    low, high = (min(values), max(values)) if values else (0.0, 1.0)
    pad = max((high - low) * 0.25, 0.002)
    ax.set_xlim(low - pad, high + pad * 2)
    named = score.said
    ax.set(xlabel=f"final test {named}", title=f"Test {named} per combination (axis zoomed to the data)")
    ax.grid(axis="x", alpha=0.3)
    _save(plt, fig, path)


def _legend_below(ax: Any) -> None:
    """The legend under the axes, where it hides no curve or point (a label naming a model's setting is long)."""
    ax.legend(loc="upper left", bbox_to_anchor=(0, -0.16), frameon=False)  # below the x label


def _save(plt: Any, fig: Any, path: Path) -> None:
    fig.tight_layout()
    fig.savefig(path, dpi=110, bbox_inches="tight")  # the legend below the axes too
    plt.close(fig)
