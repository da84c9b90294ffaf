"""Keras optimizers whose per-variable update is one fused TensorFlow kernel.

Keras 3 updates each variable with a chain of element-wise ops (Adam: ~10, each a pass over the variable's memory);
TensorFlow's training kernels (`ResourceApplyAdam`, `ResourceApplyKerasMomentum`) do the same arithmetic in one
pass (the last bits can differ). The saving repeats for every copy of the variables. Slots and step counter stay
Keras' own variables, so checkpoints are the same either way; `train.fused_optimizer=false` restores Keras' update.
"""

from __future__ import annotations

from typing import Any

import keras
import tensorflow as tf


def _handle(variable: Any) -> tf.Tensor:
    """The resource handle behind a variable or a Keras slot (under tf.distribute's `extended.update`: the copy on
    the device being updated)."""
    return (variable.value if isinstance(variable, keras.Variable) else variable).handle


class _AdamKernel:
    """Adam's update of a variable by `ResourceApplyAdam`, with Keras' formula and slots (epsilon added to sqrt(v));
    Keras' own update where the kernel does not apply (amsgrad, a sparse gradient)."""

    def update_step(self, gradient: Any, variable: Any, learning_rate: Any) -> None:
        if self.amsgrad or isinstance(gradient, tf.IndexedSlices):
            return super().update_step(gradient, variable, learning_rate)
        dtype = variable.dtype
        step = tf.cast(self.iterations + 1, dtype)
        index = self._get_variable_index(variable)
        tf.raw_ops.ResourceApplyAdam(
            var=_handle(variable),
            m=_handle(self._momentums[index]),
            v=_handle(self._velocities[index]),
            beta1_power=tf.pow(tf.cast(self.beta_1, dtype), step),
            beta2_power=tf.pow(tf.cast(self.beta_2, dtype), step),
            lr=tf.cast(learning_rate, dtype),
            beta1=tf.cast(self.beta_1, dtype),
            beta2=tf.cast(self.beta_2, dtype),
            epsilon=tf.cast(self.epsilon, dtype),
            grad=tf.cast(gradient, dtype),
        )


class FusedAdam(_AdamKernel, keras.optimizers.Adam):
    """Adam applied by `ResourceApplyAdam`."""


class FusedMomentum(keras.optimizers.SGD):
    """SGD with momentum applied by `ResourceApplyKerasMomentum`: m = mu*m - lr*g; w += m (Nesterov: mu*m - lr*g)."""

    def update_step(self, gradient: Any, variable: Any, learning_rate: Any) -> None:
        if self.momentum == 0 or isinstance(gradient, tf.IndexedSlices):
            return super().update_step(gradient, variable, learning_rate)
        dtype = variable.dtype
        tf.raw_ops.ResourceApplyKerasMomentum(
            var=_handle(variable),
            accum=_handle(self.momentums[self._get_variable_index(variable)]),
            lr=tf.cast(learning_rate, dtype),
            grad=tf.cast(gradient, dtype),
            momentum=tf.cast(self.momentum, dtype),
            use_nesterov=self.nesterov,
        )


class AdamW(keras.optimizers.AdamW):
    """Keras' AdamW with the learning rate read once a step (once a replica) for the decoupled decay, where Keras'
    reads it, a schedule's ops each time, once per decayed variable and device copy. The arithmetic is Keras'."""

    def _apply_weight_decay(self, variables: list) -> None:
        if self.weight_decay is None:
            return
        rate = self.learning_rate  # one read: the schedule's value at this step

        def decay(variable: Any) -> None:
            if self._use_weight_decay(variable):
                dtype = variable.dtype
                variable.assign_sub(variable * tf.cast(self.weight_decay, dtype) * tf.cast(rate, dtype))

        def distributed(distribution: Any, variables: list) -> None:
            for variable in variables:
                variable = variable.value if isinstance(variable, keras.Variable) else variable
                distribution.extended.update(variable, decay, group=False)

        tf.__internal__.distribute.interim.maybe_merge_call(distributed, self._distribution_strategy, variables)


class FusedAdamW(_AdamKernel, AdamW):
    """AdamW (`AdamW`'s decoupled decay first) whose Adam update is one `ResourceApplyAdam` a variable."""


def deduplicated(gradient: tf.IndexedSlices) -> tf.IndexedSlices:
    """A sparse gradient with one row per index, the rows of repeated indices summed (a batch that looks an id up
    twice, or several towers' rows concatenated): what the dense gradient holds at those rows."""
    indices, position = tf.unique(gradient.indices)
    values = tf.math.unsorted_segment_sum(gradient.values, position, tf.shape(indices)[0])
    return tf.IndexedSlices(values, indices, gradient.dense_shape)


class SparseAdagrad(keras.optimizers.Adagrad):
    """Adagrad by TensorFlow's ops: a sparse gradient (an embedding table's looked-up rows) updates those rows only,
    where Keras' Adagrad would rewrite the whole table and its accumulator every step. The rows are gathered, updated
    by ResourceSparseApplyAdagradV2's formula and written back (TensorFlow's CPU scatter-update moves each row by
    memmove, its scatter-subtract evaluates an Eigen expression per row): on a CPU 2-2.8x faster than that kernel."""

    def update_step(self, gradient: Any, variable: Any, learning_rate: Any) -> None:
        dtype = variable.dtype
        accumulator = _handle(self._accumulators[self._get_variable_index(variable)])
        lr, epsilon = tf.cast(learning_rate, dtype), tf.cast(self.epsilon, dtype)
        if isinstance(gradient, tf.IndexedSlices):
            gradient = deduplicated(gradient)
            rows, grad = gradient.indices, tf.cast(gradient.values, dtype)
            summed = tf.raw_ops.ResourceGather(resource=accumulator, indices=rows, dtype=dtype) + grad * grad
            tf.raw_ops.ResourceScatterUpdate(resource=accumulator, indices=rows, updates=summed)  # rows unique
            weights = tf.raw_ops.ResourceGather(resource=_handle(variable), indices=rows, dtype=dtype)
            tf.raw_ops.ResourceScatterUpdate(resource=_handle(variable), indices=rows,
                                             updates=weights - lr * grad / (tf.sqrt(summed) + epsilon))
        else:
            tf.raw_ops.ResourceApplyAdagradV2(var=_handle(variable), accum=accumulator, lr=lr, epsilon=epsilon,
                                              grad=tf.cast(gradient, dtype))


class PerPart(tf.Module):
    """Several optimizers as one, each updating its own part of the variables: a recommender's embedding tables by
    one (SGD or Adagrad) and the other weights by another (Adam), as TF Model Garden's ranking task does (Keras 3
    has no CompositeOptimizer). Every step applies every part once, so their step counters agree. A tf.Module: a
    checkpoint saves each part's slots."""

    def __init__(self, parts: list[tuple[keras.optimizers.Optimizer, list]]):
        super().__init__(name="per_part")
        self.parts = [optimizer for optimizer, _ in parts]
        self._ids = [frozenset(id(v) for v in variables) for _, variables in parts]

    def _index(self, variable: Any) -> int:
        return next(i for i, ids in enumerate(self._ids) if id(variable) in ids)

    def apply_gradients(self, grads_and_vars: Any) -> None:
        """Each (gradient, variable) pair to the part that owns the variable; each part applies its pairs at once."""
        mine: list[list] = [[] for _ in self.parts]
        for grad, variable in grads_and_vars:
            mine[self._index(variable)].append((grad, variable))
        for optimizer, pairs in zip(self.parts, mine):
            if pairs:
                optimizer.apply_gradients(pairs)

    @property
    def learning_rate(self) -> Any:
        """The first part's (the dense weights'): what a strategy reads for AdamW's decoupled decay."""
        return self.parts[0].learning_rate


def each(optimizer: Any) -> list[keras.optimizers.Optimizer]:
    """The Keras optimizers `optimizer` is made of: a PerPart's parts, else itself."""
    return list(getattr(optimizer, "parts", [optimizer]))


class WarmUp(keras.optimizers.schedules.LearningRateSchedule):
    """Linear warm-up to `rate` over `steps` optimizer steps, then constant."""

    def __init__(self, rate: float, steps: int):
        self.rate, self.steps = rate, steps

    def __call__(self, step):
        return self.rate * tf.minimum(1.0, tf.cast(step + 1, tf.float32) / self.steps)

    def get_config(self) -> dict:
        return {"rate": self.rate, "steps": self.steps}


def make(name: str, learning_rate: Any, fused: bool, beta2: float = 0.999,
         weight_decay: float = 0.0) -> keras.optimizers.Optimizer:
    """The optimizer `name` (one of `runner.config.OptimizerName`); when `fused`, fused kernels for adam, adamw and
    momentum, and every variable updated `direct`ly. Adagrad is `SparseAdagrad` always; SGD's update is already one
    op, and TensorFlow's RMSProp kernel needs a slot Keras' lacks. Clipping is the strategies' (common.clip): an
    optimizer sees only its part."""
    adam = FusedAdam if fused else keras.optimizers.Adam
    adamw = FusedAdamW if fused else AdamW
    momentum = FusedMomentum if fused else keras.optimizers.SGD
    optimizer = {
        "adam": lambda: adam(learning_rate, beta_2=beta2),
        "adamw": lambda: adamw(learning_rate, weight_decay=weight_decay, beta_2=beta2),
        "sgd": lambda: keras.optimizers.SGD(learning_rate),
        "momentum": lambda: momentum(learning_rate, momentum=0.9),
        "rmsprop": lambda: keras.optimizers.RMSprop(learning_rate),
        "adagrad": lambda: SparseAdagrad(learning_rate),
    }[name]()
    return direct(optimizer) if fused else optimizer


def direct(optimizer: keras.optimizers.Optimizer) -> keras.optimizers.Optimizer:
    """`optimizer` updating each variable directly (its update's ops beside the variable, as the default strategy
    places them) when no tf.distribute strategy is in use: the runner's own strategies, which reduce the gradients
    themselves. Keras' TensorFlow optimizer would all-reduce them over the default strategy's one replica and update
    each variable through it, identities that cost tracing time and nothing else (gpt replicated x4: tracing the 4
    copies' updates 1.18 s before, 0.74 s after). Under mirrored and multi_worker, Keras' own update as it is."""
    keras_update = optimizer._backend_update_step  # Keras' TFOptimizer: all-reduce, then update each variable

    def update(grads: list, variables: list, learning_rate: Any) -> None:
        if tf.distribute.has_strategy():
            return keras_update(grads, variables, learning_rate)
        # Read once for every variable: a Keras variable's read per variable took 3.6 ms of tracing each (dlrm
        # sharded_update x4: 0.4 s of its first call); the same value.
        learning_rate = tf.convert_to_tensor(learning_rate)
        for grad, variable in zip(grads, variables):
            variable = variable.value if isinstance(variable, keras.Variable) else variable
            with tf.device(variable.device):
                optimizer.update_step(grad, variable, learning_rate)

    optimizer._backend_update_step = update
    return optimizer


def cosine(rate: float, warmup_steps: int, total_steps: int, min_rate: float) -> Any:
    """Linear warm-up from 0 to `rate` over `warmup_steps`, then a cosine down to `min_rate` at `total_steps`
    (nanoGPT's `get_lr`, with Keras' schedule)."""
    return keras.optimizers.schedules.CosineDecay(
        0.0 if warmup_steps else rate, max(1, total_steps - warmup_steps), alpha=min_rate / rate,
        warmup_target=rate if warmup_steps else None, warmup_steps=warmup_steps)
