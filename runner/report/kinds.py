"""What a run's figures are, so that figures of different units or metrics never share a table's column, a ranking,
a plot's axis or a sweep parent's metric.

A run's kind is read from the run itself, as the report's rows and the verdict's runs carry it: the unit its
throughput counts (`data_pipelines.Spec.unit`), its task's score and what it was timed to (`tasks.Target`'s
metric). A sweep over an image model, a language model and a click model is three kinds, reported one part each; a
run that says nothing (refused before it timed or evaluated anything) takes its model's kind.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Iterable, TypeVar

from runner.tasks import METRICS

T = TypeVar("T")  # a report row or a verdict run: anything with the fields `_said` reads


@dataclass(frozen=True)
class Kind:
    """The unit and metrics a part of a report shares."""

    unit: str = "images"  # images, tokens or examples: what its rates count
    score: str = "accuracy"  # its task's final test score (runner.tasks.METRICS: accuracy, auc)
    target: str = "accuracy"  # what its time to target is timed to (accuracy, loss, auc)

    def __str__(self) -> str:
        return f"{self.unit}/s, test {METRICS[self.score].said}, time to {METRICS[self.target].said}"


def _said(row: Any) -> dict[str, str]:
    """What a row says of its own kind: only the figures it measured (a rate, a score, a target) say anything."""
    named = {"unit": ("rate", "unit"), "score": ("score", "score_metric"), "target": ("target", "target_metric")}
    return {key: getattr(row, name) for key, (figure, name) in named.items() if not math.isnan(getattr(row, figure))}


def _kinds(rows: list[Any]) -> list[Kind | None]:
    """Each row's kind: what it says, else what its model's other rows say, else the default; None for a row whose
    model says nothing at all."""
    by_model: dict[str, list[dict[str, str]]] = {}
    for row in rows:
        by_model.setdefault(row.model, []).append(_said(row))
    out: list[Kind | None] = []
    for row in rows:
        own, model = _said(row), by_model[row.model]
        known = {key: own.get(key) or next((s[key] for s in model if key in s), None)
                 for key in ("unit", "score", "target")}
        known["target"] = known["target"] or known["score"]  # timed to nothing: its time column names its score
        out.append(Kind(**{k: v for k, v in known.items() if v}) if any(known.values()) else None)
    return out


def split(rows: Iterable[T]) -> list[tuple[Kind, list[T]]]:
    """The rows in parts of one kind each, in the order their kinds first appear and each in the rows' order; rows
    of models that said nothing join the first part, where they mix no figures."""
    rows = list(rows)
    kinds = _kinds(rows)
    order = list(dict.fromkeys(k for k in kinds if k is not None)) or [Kind()]
    return [(kind, [r for r, k in zip(rows, kinds) if (k or order[0]) == kind]) for kind in order] if rows else []


def one(rows: Iterable[Any]) -> Kind:
    """The one kind of `rows`; ValueError where they are of several (they must be split first: `split`)."""
    parts = split(rows)
    if len(parts) > 1:
        raise ValueError("rows of several kinds (" + "; ".join(str(k) for k, _ in parts) + "): split them first")
    return parts[0][0] if parts else Kind()


def names(kinds: list[Kind]) -> list[str]:
    """A short name per kind, for file names: '' for a single kind; else its unit, where the units tell the kinds
    apart, else its unit, score and target."""
    if len(kinds) < 2:
        return [""] * len(kinds)
    if len({k.unit for k in kinds}) == len(kinds):
        return [k.unit for k in kinds]
    return [f"{k.unit}_{k.score}_{k.target}" for k in kinds]
