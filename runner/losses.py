"""The task's loss, written once: every strategy's step, evaluation, the floor and the FLOP count call it."""

from __future__ import annotations

from typing import Any


def cross_entropy(y: Any, logits: Any) -> Any:
    """Cross-entropy per example (b,): sigmoid of one float32 logit (b, 1) against a binary label `y` (b,) (a click
    model); else sparse categorical of `logits` (b, *positions, classes) against int labels `y` (b, *positions),
    averaged over the positions where an example has labels at several (a language
    model's next token at each), so that every position weighs the same. Unreduced over the batch: the caller
    divides by the global batch (Keras' `Loss` objects would also divide by the replicas inside `strategy.run`)."""
    import keras
    import tensorflow as tf

    if logits.shape[-1] == 1:  # one logit (b, 1), the log-odds of label 1 (Spec target "binary"); y (b,) or (b, 1)
        labels = tf.reshape(tf.cast(y, logits.dtype), (-1, 1))
        return keras.losses.binary_crossentropy(labels, logits, from_logits=True)  # (b,)
    loss = keras.losses.sparse_categorical_crossentropy(y, logits, from_logits=True)  # (b, *positions)
    if loss.shape.rank > 1:
        loss = tf.reduce_mean(loss, axis=list(range(1, loss.shape.rank)))  # (b,)
    return loss


def auc(labels: Any, scores: Any) -> float:
    """The area under the ROC curve of `scores` (n,) for binary `labels` (n,): the probability that a random positive
    scores above a random negative (ties count half), exactly, from the ranks (Mann-Whitney U). NaN without both
    classes."""
    import numpy as np

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
