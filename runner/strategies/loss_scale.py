"""Dynamic loss scaling for `train.precision=mixed_float16`: one scale shared by every optimizer of a step.

The loss is multiplied by S before the backward pass, so small float16 gradients do not round to zero, and the
gradients divided by S in float32 before the update. Keras' `LossScaleOptimizer`'s rule: start at
`train.loss_scale`; on an inf or NaN gradient skip the update and halve S; after `train.loss_scale_period` finite
steps in a row, double S. Not Keras' wrapper per optimizer: a strategy with several (a copy, shard or cell per
device) would have each decide alone, and one device could skip a step another applies.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from runner.lazy import tf


@dataclass(frozen=True)
class LossScaling:
    """The settings, as plain values (from train.loss_scale and train.loss_scale_period)."""

    initial: float = 2.0**15
    period: int = 2000  # finite steps in a row before the scale doubles


def all_finite(grads: list[tf.Tensor]) -> tf.Tensor:
    """True when every element of every gradient is finite (a scalar bool); a table's rows (tf.IndexedSlices) read
    as they are, not as the whole table."""
    values = [g.values if isinstance(g, tf.IndexedSlices) else g for g in grads]
    return tf.reduce_all([tf.reduce_all(tf.math.is_finite(v)) for v in values])


class NoLossScale:
    """float32 and bfloat16: nothing scaled, every step applied."""

    patience = 1
    variables: list = []

    def scaled(self, loss: tf.Tensor) -> tf.Tensor:
        return loss

    def factor(self) -> tf.Tensor:
        return tf.constant(1.0)

    def unscale(self, grads: list[tf.Tensor]) -> list[tf.Tensor]:
        return grads

    def apply_if_finite(self, finite: Callable[[], tf.Tensor], apply: Callable[[], object]) -> None:
        apply()


class LossScale:
    """The scale and its counters, as variables on `device` (checkpointed with the strategy's objects)."""

    # Consecutive steps with a non-finite loss after which training stops: a skipped step is not a failure, a loss
    # that stays inf or NaN is (float32 and bfloat16 stop at the first, as nothing would skip it).
    patience = 10

    def __init__(self, settings: LossScaling, device: str):
        self.period = settings.period
        with tf.device(device):
            self.scale = tf.Variable(settings.initial, trainable=False, dtype=tf.float32, name="loss_scale")
            self.good_steps = tf.Variable(0, trainable=False, dtype=tf.int64, name="loss_scale_good_steps")
            self.skipped = tf.Variable(0, trainable=False, dtype=tf.int64, name="skipped_steps")
        self.variables = [self.scale, self.good_steps, self.skipped]

    def scaled(self, loss: tf.Tensor) -> tf.Tensor:
        """The loss times the scale: what the backward pass starts from."""
        return loss * self.scale

    def factor(self) -> tf.Tensor:
        """The scale's value now, for a computation that cannot read the variable (an XLA cluster elsewhere)."""
        return tf.convert_to_tensor(self.scale)

    def unscale(self, grads: list[tf.Tensor]) -> list[tf.Tensor]:
        """Gradients of the scaled loss divided back (float32, as the variables); a table's rows (tf.IndexedSlices)
        stay rows (divided as a tensor they became the whole table)."""
        return [tf.IndexedSlices(g.values / self.scale, g.indices, g.dense_shape) if isinstance(g, tf.IndexedSlices)
                else g / self.scale for g in grads]

    def apply_if_finite(self, finite: Callable[[], tf.Tensor], apply: Callable[[], object]) -> None:
        """Run `apply()` (every update of the step) when `finite()` is true, else skip it; then adjust the scale."""

        def applied() -> None:
            apply()
            grow = self.good_steps >= self.period - 1
            self.scale.assign(tf.where(grow, self.scale * 2.0, self.scale))
            self.good_steps.assign(tf.where(grow, tf.constant(0, tf.int64), self.good_steps + 1))

        def skipped() -> None:
            self.scale.assign(self.scale * 0.5)
            self.good_steps.assign(0)
            self.skipped.assign_add(1)

        tf.cond(finite(), applied, skipped)

    def state(self) -> dict[str, float]:
        """The metrics logged after each call: the current scale and the updates skipped so far."""
        return {"loss_scale": float(self.scale.numpy()), "skipped_steps": float(self.skipped.numpy())}
