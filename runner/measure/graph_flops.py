"""TensorFlow's own FLOP count of the traced training step: its profiler's per-op formulas over the pruned graph.

The independent count that checks `runner.measure.flops`' analytic one. Its total also includes bias adds, pooling,
dropout and loss ops (not ReLU: the profiler has no formula for it), and it charges a convolution's backward ops on
its *input* area, so for VALID-padded convolutions it exceeds the analytic count; for SAME padding and stride 1 the
two agree to within the extra ops.
"""

from __future__ import annotations

import logging
from typing import Any

from runner.tasks import CLASSES, Task


def _gradient_graph(model: Any, batch: int, training: bool, task: Task) -> Any:
    """The traced step (loss gradients, or logits if not `training`) as a tf.Graph with static shapes (weights enter
    as placeholders), pruned to what the outputs need as TF prunes a function body before running it."""
    import tensorflow as tf

    def specs(variables: list) -> list:
        return [tf.TensorSpec(v.shape, v.dtype) for v in variables]

    def step(x, y, weights, states):
        with tf.GradientTape() as tape:
            tape.watch(weights)
            logits, _ = model.stateless_call(weights, states, x, training=training)
            loss = tf.reduce_mean(task.loss(y, logits))
        return [loss, *tape.gradient(loss, weights)] if training else [logits]

    # the task's labels: a class, one per position, a click
    y_spec = tf.TensorSpec((batch, *model.output_shape[1:-1]), task.labels_dtype)
    func = tf.function(step).get_concrete_function(
        _input_specs(model, batch), y_spec, specs(model.trainable_variables), specs(model.non_trainable_variables)
    )
    pruned = tf.compat.v1.graph_util.extract_sub_graph(
        func.graph.as_graph_def(), [t.op.name for t in func.graph.outputs]
    )
    graph = tf.Graph()
    with graph.as_default():
        tf.import_graph_def(pruned, name="")
    return graph


def _input_specs(model: Any, batch: int) -> Any:
    """A TensorSpec of `batch` examples for the model's input, as the runner feeds it: one tensor, or for several
    inputs a dict of them by name (a recommender's named features)."""
    import tensorflow as tf

    specs = {t.name: tf.TensorSpec((batch, *t.shape[1:]), t.dtype) for t in model.inputs}
    return next(iter(specs.values())) if len(specs) == 1 else specs


def profiler_flops_per_example(model: Any, batch: int = 32, training: bool = True, task: Task = CLASSES) -> float:
    """TensorFlow profiler FLOPs per example of the traced step (`batch` examples; forward + loss + gradients, or
    the forward pass alone if not `training`; the loss `task`'s): the independent count (module docstring), the
    profiler's total over all op types. ValueError: some tensor of the traced graph has no static shape (its FLOPs
    would be silently missed)."""
    import tensorflow as tf

    logger = tf.get_logger()  # muted: graph pruning and the profiler's formulas warn that they are TF1 APIs
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        graph = _gradient_graph(model, batch, training, task)
        partial = [op.name for op in graph.get_operations() for t in op.outputs if not t.shape.is_fully_defined()]
        if partial:
            raise ValueError(f"the traced step has tensors without static shapes, e.g. {partial[:3]}")
        options = dict(tf.compat.v1.profiler.ProfileOptionBuilder.float_operation(), output="none")
        return tf.compat.v1.profiler.profile(graph, options=options, cmd="op").total_float_ops / batch
    finally:
        logger.setLevel(level)
