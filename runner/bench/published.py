"""`published`: the spec-sheet cost model (runner/predict/spec_sheet.py) against published measurements.

Each table of runner/bench/published/*.csv is one system's images/s per model, batch, mode and GPU count, with its
source in the file's header. Every row is predicted from the hardware's spec sheet (conf/hardware/) and the preset of
its model (`experiment=tf_cnn_<model>`) by `runner.predict.grid.predict_all`, which never reads these files; only
this module puts the two side by side: per system and model, predicted and published images/s at each GPU count,
the error, and the scaling efficiency at the largest count (rate over GPUs x the one-GPU rate), both ways.
"""

from __future__ import annotations

import argparse
import csv
import statistics
from dataclasses import dataclass
from pathlib import Path

from runner.bench.jobs import emit, save
from runner.report.table import markdown, markdown_row
from runner.strategies import doing

TABLES = Path(__file__).with_name("published")


def flags(mode: str, device: str) -> str:
    """A table's mode and device columns as tf_cnn_benchmarks' flags (what `strategies.doing` reads)."""
    extra = {"cpu": " --local_parameter_device=cpu", "gpu": " --local_parameter_device=gpu",
             "nccl": " --all_reduce_spec=nccl"}.get(device, "")  # no_nccl, or none: the mode's default
    return f"--variable_update={mode}{extra}"


@dataclass(frozen=True)
class Cell:
    """One published measurement and what predicts it."""

    hardware: str
    model: str
    batch: int
    mode: str
    gpus: int
    nodes: int
    published: float  # images/s
    overrides: tuple[str, ...]

    @property
    def group(self) -> tuple[str, str, int, str]:
        return self.hardware, self.model, self.batch, self.mode


def cells(folder: Path = TABLES) -> list[Cell]:
    """Every row of every table in `folder`, with the overrides that predict it."""
    out = []
    for path in sorted(folder.glob("*.csv")):
        lines = [line for line in path.read_text().splitlines() if line and not line.startswith("#")]
        for row in csv.DictReader(lines):
            overrides = (f"experiment=tf_cnn_{row['model']}", *doing(flags(row["mode"], row["device"])),
                         f"hardware={row['hardware']}", f"hardware.nodes={row['nodes']}", f"gpus={row['gpus']}",
                         f"train.per_device_batch_size={row['batch_per_gpu']}")
            mode = f"{row['mode']} {row['device']}".strip()
            out.append(Cell(row["hardware"], row["model"], int(row["batch_per_gpu"]), mode, int(row["gpus"]),
                            int(row["nodes"]), float(row["images_per_sec"]), overrides))
    return out


def predicted(found: list[Cell]) -> dict[Cell, float | None]:
    """Each cell's predicted images/s (None where there is no prediction), from the spec sheets alone."""
    from runner.predict.grid import predict_all

    outcomes = predict_all([list(c.overrides) for c in found])
    return {c: o.prediction.rate if o.prediction else None for c, o in zip(found, outcomes)}


@dataclass(frozen=True)
class Summary:
    """How far the predictions are from the tables."""

    errors: list[float]  # |predicted / published - 1| per cell
    efficiency_gaps: dict[tuple, float]  # group -> predicted minus published efficiency at its largest count (points)

    @property
    def median(self) -> float:
        return statistics.median(self.errors)


def efficiency(rows: list[tuple[int, float]]) -> float:
    """Scaling efficiency at the largest GPU count of (gpus, rate) rows: rate / (gpus x the one-GPU rate)."""
    (g1, r1), (gn, rn) = min(rows), max(rows)
    return rn / gn / (r1 / g1)


def summarise(rates: dict[Cell, float | None]) -> tuple[Summary, list[str]]:
    """The markdown (a table per system and model: GPUs, published, predicted, error; the efficiency line; then one
    row per system and model: the error at each GPU count and the efficiency at the largest, both ways) and the
    summary figures."""
    lines, errors, gaps = [], [], {}
    compact = markdown(["system", "model", "batch", "tf_cnn mode", "error at 1, 2, 4, 8 ... GPUs",
                        "efficiency at the most: predicted / published"])
    for group in dict.fromkeys(cell.group for cell in rates):
        members = [(cell, rate) for cell, rate in rates.items() if cell.group == group]
        hardware, model, batch, mode = group
        lines += [f"**{hardware} {model}**, batch {batch} per GPU, tf_cnn_benchmarks {mode}", "",
                  *markdown(["GPUs", "published images/s", "predicted images/s", "error"])]
        each, most = [], "-"
        for cell, rate in sorted(members, key=lambda m: m[0].gpus):
            error = rate / cell.published - 1 if rate else None
            errors += [abs(error)] if error is not None else []
            shown = f"{error:+.0%}" if error is not None else "not predicted"
            lines.append(markdown_row([str(cell.gpus), f"{cell.published:,.1f}", f"{rate or 0:,.1f}", shown]))
            each.append(f"{cell.gpus}: {shown if error is not None else '-'}")
        priced = [(c.gpus, r) for c, r in members if r]
        if len(priced) == len(members) > 1:
            pub, pred = efficiency([(c.gpus, c.published) for c, _ in members]), efficiency(priced)
            gaps[group] = 100 * (pred - pub)
            lines.append(f"\nscaling efficiency at {max(priced)[0]} GPUs: predicted {pred:.0%}, published {pub:.0%}")
            most = f"{max(priced)[0]}: {pub + gaps[group] / 100:.0%} / {pub:.0%}"
        lines.append("")
        compact.append(markdown_row([*map(str, group), ", ".join(each), most]))
    summary = Summary(errors, gaps)
    lines += [*compact, ""]
    worst = max(gaps.values(), key=abs) if gaps else 0.0
    lines.append(f"{len(errors)} cells: median error {summary.median:.1%}, largest {max(errors):.1%}; "
                 f"efficiency at the largest count within 5 points in {sum(abs(g) <= 5 for g in gaps.values())} of "
                 f"{len(gaps)} groups (largest gap {worst:+.1f} points)")
    return summary, lines


def chosen(args: argparse.Namespace) -> list[Cell]:
    """The cells of the systems --hardware names (all without it)."""
    return [c for c in cells() if not args.hardware or c.hardware in args.hardware]


def published(args: argparse.Namespace) -> int:
    """Print (and with --out write) predicted against published, per system and model."""
    _, lines = summarise(predicted(chosen(args)))
    emit([], lines)
    save(lines, args.out)
    return 0
