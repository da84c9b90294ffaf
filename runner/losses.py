"""The task's loss, written once: every strategy's step, evaluation, the floor and the FLOP count call it."""

from __future__ import annotations

from typing import Any


def cross_entropy(y: Any, logits: Any) -> Any:
    """Sparse categorical cross-entropy per example (b,) of float32 `logits` (b, *positions, classes) against int
    labels `y` (b, *positions): averaged over the positions where an example has labels at several (a language
    model's next token at each), so that every position weighs the same. Unreduced over the batch: the caller
    divides by the global batch (Keras' `Loss` objects would also divide by the replicas inside `strategy.run`)."""
    import keras
    import tensorflow as tf

    loss = keras.losses.sparse_categorical_crossentropy(y, logits, from_logits=True)  # (b, *positions)
    if loss.shape.rank > 1:
        loss = tf.reduce_mean(loss, axis=list(range(1, loss.shape.rank)))  # (b,)
    return loss
