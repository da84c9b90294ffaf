"""The task contract: what is learned from an example and how it is scored, written once for every layer.

A dataset names its task (`data_pipelines.Spec.target`); `TASKS` maps the name to a `Task`, which owns the loss,
the metrics (each with its direction) and the labels' dtype and shape. Every later stage reads the task, none looks
at shapes to choose a loss or a metric; a new kind of target is one `Task` here (and data that names it).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from runner.lazy import keras, tf


@dataclass(frozen=True)
class Metric:
    """A test figure a run logs as `test_<name>` and may be timed to (`train.target_<name>`)."""

    name: str  # its key in metrics and config (accuracy, auc, loss, mae)
    said: str  # as a column, an axis or a sentence names it (accuracy, AUC, loss, MAE)
    higher: bool  # higher is better (a target is met at or over it; else at or under it)
    bounded: bool = True  # in [0, 1]: two runs' figures compared by their difference, else relative to the first

    @property
    def short(self) -> str:
        """Its name in a table's header."""
        return "acc." if self.name == "accuracy" else self.said

    def level(self, value: float) -> str:
        """A level of this figure as a line says it: an accuracy in percent to the digit it was given (0.995 is
        99.5%, not 100%), any other to 4 significant digits."""
        return f"{100 * value:.4g}%" if self.name == "accuracy" else f"{value:.4g}"

    def met(self, value: float, target: float) -> bool:
        """Whether `value` reaches `target` in this metric's direction."""
        return value >= target if self.higher else value <= target

    def best(self, values: list[float]) -> float:
        """The best of `values` in this metric's direction (NaN where there are none)."""
        finite = [v for v in values if not math.isnan(v)]
        return (max if self.higher else min)(finite) if finite else math.nan


LOSS = Metric("loss", "loss", higher=False, bounded=False)
ACCURACY = Metric("accuracy", "accuracy", higher=True)
AUC = Metric("auc", "AUC", higher=True)
MAE = Metric("mae", "MAE", higher=False, bounded=False)
METRICS = {m.name: m for m in (ACCURACY, LOSS, AUC, MAE)}
# A run's metric: 1.0 where its target was met at its first evaluation (its time to it is the start-up's, the first
# call's tracing: no ranking of training), 0.0 where later; absent where not met
FIRST_CHECK = "target_met_at_first_check"


@dataclass(frozen=True)
class Task:
    """What is learned from an example: its labels, the loss, the score a report shows beside the loss."""

    name: str  # `Spec.target`
    score: Metric  # the test figure a report shows beside the loss
    labels_dtype: str = "int32"  # "int32" (class ids, 0/1) or "float32" (values)
    per_position: bool = False  # a label at every input position (b, length): a language model's next token
    one_output: bool = False  # one output per example (a log-odds, a value), not one logit per class
    metrics: tuple[Metric, ...] = ()  # every figure evaluation logs besides the loss (the score among them)
    said: str = "{classes} classes"  # what an example's label is, as a sentence says it ("{classes}": the count)
    # How a run's last line says its test figures: (metric, format) in order; () says the score, then the loss
    headline: tuple[tuple[str, str], ...] = ()

    def __str__(self) -> str:
        return self.name

    @property
    def targets(self) -> tuple[Metric, ...]:
        """What a run of this task may be timed to: its loss, or one of its metrics."""
        return (LOSS, *self.metrics)

    def loss(self, y: Any, outputs: Any) -> Any:
        """The loss per example (b,), unreduced (the caller divides by the global batch)."""
        raise NotImplementedError

    def sums(self, y: Any, outputs: Any) -> dict[str, Any]:
        """Per metric averaged over examples (all but an AUC): its sum over the batch, as a float32 scalar."""
        raise NotImplementedError


@dataclass(frozen=True)
class Classes(Task):
    """One of `classes` per example (b,), or at every position (b, length): sparse categorical cross-entropy of the
    logits, averaged over the positions; the accuracy (per position)."""

    def loss(self, y: Any, outputs: Any) -> Any:
        loss = keras.losses.sparse_categorical_crossentropy(y, outputs, from_logits=True)  # (b, *positions)
        return tf.reduce_mean(loss, axis=list(range(1, loss.shape.rank))) if loss.shape.rank > 1 else loss

    def sums(self, y: Any, outputs: Any) -> dict[str, Any]:
        correct = tf.cast(tf.equal(tf.argmax(outputs, -1, output_type=y.dtype), y), tf.float32)  # (b, *positions)
        if correct.shape.rank > 1:  # each example's share of correct positions
            correct = tf.reduce_mean(correct, axis=list(range(1, correct.shape.rank)))
        return {"accuracy": tf.reduce_sum(correct)}


@dataclass(frozen=True)
class Binary(Task):
    """A 0/1 label per example and one logit (its log-odds): sigmoid cross-entropy; the accuracy at logit > 0 and,
    over the whole test set, the AUC (`auc`), the score."""

    def loss(self, y: Any, outputs: Any) -> Any:
        labels = tf.reshape(tf.cast(y, outputs.dtype), (-1, 1))
        return keras.losses.binary_crossentropy(labels, outputs, from_logits=True)  # (b,)

    def sums(self, y: Any, outputs: Any) -> dict[str, Any]:
        guess = tf.cast(outputs[:, 0] > 0, y.dtype)
        return {"accuracy": tf.reduce_sum(tf.cast(tf.equal(guess, y), tf.float32))}


@dataclass(frozen=True)
class Regression(Task):
    """A float value per example and one output: mean squared error; the mean absolute error, the score."""

    def loss(self, y: Any, outputs: Any) -> Any:
        return tf.square(outputs[:, 0] - tf.cast(y, outputs.dtype))  # (b,)

    def sums(self, y: Any, outputs: Any) -> dict[str, Any]:
        return {"mae": tf.reduce_sum(tf.abs(outputs[:, 0] - tf.cast(y, outputs.dtype)))}


CLASSES = Classes("class", ACCURACY, metrics=(ACCURACY,))  # the default: images to classes
TASKS: dict[str, Task] = {
    "class": CLASSES,
    "next_token": Classes("next_token", ACCURACY, per_position=True, metrics=(ACCURACY,),
                          said="the next token at each position",
                          headline=(("loss", "validation loss {:.4f} nats/token"),
                                    ("accuracy", "next-token accuracy {:.4f}"))),
    "binary": Binary("binary", AUC, one_output=True, metrics=(ACCURACY, AUC), said="a binary label",
                     headline=(("auc", "test AUC {:.4f}"), ("loss", "test log loss {:.4f}"),
                               ("accuracy", "accuracy {:.4f}"))),
    "regression": Regression("regression", MAE, labels_dtype="float32", one_output=True, metrics=(MAE,),
                             said="a value"),
}


@dataclass(frozen=True)
class Target:
    """What a run is timed to: a test figure (`metric`, a METRICS name) reaching `value` in its direction."""

    metric: str
    value: float

    def met(self, scores: dict[str, float]) -> bool:
        """Whether an evaluation's scores ({"loss", *the task's metrics}) reach the target."""
        return METRICS[self.metric].met(scores[self.metric], self.value)

    @property
    def keys(self) -> tuple[str, str, str]:
        """The run's metric names: the target, the training seconds and the steps to it."""
        return f"target_{self.metric}", f"time_to_{self.metric}_seconds", f"steps_to_{self.metric}"

    def __str__(self) -> str:
        return f"test {METRICS[self.metric].said} {self.value:.4g}"


def target_of(train: Any) -> Target | None:
    """The run's target: the one train.target_<metric> set (validation allows one and resolves -1, the model's own
    accuracy), else None."""
    return next((Target(name, float(value)) for name in METRICS
                 if (value := getattr(train, f"target_{name}", None)) is not None), None)


def of_run(tags: dict[str, str], metrics: dict[str, float]) -> Task:
    """The task of a logged run: its `task` tag, else by what it logged (a test AUC: a click model's)."""
    if tags.get("task") in TASKS:
        return TASKS[tags["task"]]
    return TASKS["binary"] if "test_auc" in metrics else CLASSES


def from_labels(dtype: str) -> str | None:
    """The task of labels stored as `dtype` (a user's y file): integers are classes; None: no task takes them."""
    kind = dtype.rstrip("0123456789")  # float64 labels are a float32 task's, as they are cast
    return "class" if "int" in dtype else next((n for n, t in TASKS.items()
                                                if t.labels_dtype.rstrip("0123456789") == kind), None)


def auc(labels: Any, scores: Any) -> float:
    """The exact area under the ROC curve of `scores` (n,) for binary `labels` (n,), from the ranks (Mann-Whitney U,
    ties count half); NaN without both classes."""
    labels, scores = np.asarray(labels).reshape(-1), np.asarray(scores, np.float64).reshape(-1)
    positives = int(labels.sum())
    negatives = len(labels) - positives
    if not positives or not negatives:
        return float("nan")
    order = np.argsort(scores, kind="mergesort")
    ranks = np.empty(len(scores))
    ranks[order] = np.arange(1, len(scores) + 1)
    _, tie, counts = np.unique(scores, return_inverse=True, return_counts=True)  # tied scores: their mean rank
    ranks = (np.bincount(tie, ranks) / counts)[tie]
    return float((ranks[labels == 1].sum() - positives * (positives + 1) / 2) / (positives * negatives))
