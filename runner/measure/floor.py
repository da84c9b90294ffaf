"""A speed limit for the model's own shapes: the training step reduced to the work it cannot avoid.

MFU compares a run with the device's peak on one large matrix product, which a batch-128 MLP's small matrices can
never reach. The floor compares it with what its own work costs here, measured in the same process on the same
device: the forward and backward pass of the model at the run's global batch (every matmul and convolution at its
exact shape, timed alone: no input pipeline, no optimizer, no cross-device traffic; one pass after the other, as
training's steps must run, since each step's forward reads the weights the previous step wrote), plus one optimizer
update's memory traffic (the weights, their gradient and the optimizer's slots, each read and the changed ones
written) at the memory bandwidth measured by copying a large tensor. `train.probe_floor=true` measures it after
training and logs `floor_step_ms` and `step_time_over_floor` (the run's step time over the floor; 1.0 is the limit,
give or take the update overlapping the backward pass, which the floor adds in full). With N towers the passes are
the N towers' at their per-tower batch, all at once on their own devices: what they can do at best on this device
set, whether the devices share one processor (simulated ones) or each has its own.
"""

from __future__ import annotations

import math
import statistics
import time
from typing import Any

# Arrays an update touches per weight (read + written), by optimizer: weight and gradient read, weight written,
# and each slot read and written (adam: m and v; momentum: the velocity; rmsprop: the mean square; sgd: none).
TOUCHED = {"adam": 3 + 4, "momentum": 3 + 2, "rmsprop": 3 + 2, "sgd": 3}


def median_seconds(fn: Any, repeats: int = 5) -> float:
    """Median seconds of `fn()` after two warm-up calls (tracing, first allocations)."""
    fn()
    fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def forward_backward_seconds(model: Any, batch: int, device: str, calls: int = 10) -> float:
    """Seconds per forward and backward pass of `model` on `batch` images on `device` (gradients not applied)."""
    return towers_seconds([model], batch, [device], calls)


def towers_seconds(models: list[Any], batch: int, devices: list[str], calls: int = 10, repeats: int = 5,
                   call_seconds: float | None = None) -> float:
    """Seconds per step of forward and backward passes of every tower at once: `models[i]` on `batch` images on
    `devices[i]`, as the towers of a data-parallel step run (what N towers on shared cores do to each other shows).
    `call_seconds`: instead of `calls` steps per timed call, as many (3 to 20) as make a call last about that long,
    so that a call's own cost is noise beside its steps."""
    import keras
    import tensorflow as tf

    feeds = []
    for model, device in zip(models, devices):
        with tf.device(device):
            feeds.append((tf.random.uniform((batch, *model.input_shape[1:])),  # (b, H, W, C)
                          tf.random.uniform((batch,), maxval=model.output_shape[-1], dtype=tf.int32)))  # (b,)

    def tower(model: Any, device: str, x: tf.Tensor, y: tf.Tensor) -> tf.Tensor:
        with tf.device(device), tf.GradientTape() as tape:
            logits = tf.cast(model(x, training=True), tf.float32)  # (b, classes)
            loss = tf.reduce_mean(keras.losses.sparse_categorical_crossentropy(y, logits, from_logits=True))
        grads = tape.gradient(loss, model.trainable_variables)
        return tf.add_n([tf.reduce_sum(g[..., :1]) for g in grads])  # every gradient is needed

    @tf.function(autograph=False)
    def passes(steps: tf.Tensor) -> tf.Tensor:  # one trace for any number of steps
        def one(i, total):
            return i + 1, total + tf.add_n([tower(m, d, x, y) for m, d, (x, y) in zip(models, devices, feeds)])

        # One pass at a time: left to overlap (the loop's default), independent passes fill the cores in a way no
        # training step can, and the floor of a model of small matmuls (the MLP) comes out below what it costs.
        return tf.while_loop(lambda i, _: i < steps, one, (tf.constant(0), tf.constant(0.0)), parallel_iterations=1)[1]

    if call_seconds is not None:
        once = median_seconds(lambda: float(passes(tf.constant(1))), 1)
        calls = max(3, min(20, math.ceil(call_seconds / max(once, 1e-6))))
    steps = tf.constant(calls)
    return median_seconds(lambda: float(passes(steps)), repeats) / calls


def bandwidth_bytes_per_second(device: str, megabytes: int = 64) -> float:
    """Memory bandwidth of `device`: bytes read plus written per second copying a large tensor."""
    import tensorflow as tf

    with tf.device(device):
        source = tf.Variable(tf.zeros((megabytes << 18,)))  # megabytes of float32
        target = tf.Variable(tf.zeros((megabytes << 18,)))

    @tf.function
    def copy() -> None:
        target.assign(source * 1.0001)

    return 2 * (megabytes << 20) / median_seconds(lambda: copy())


def floor_step_ms(models: list[Any], batch: int, optimizer: str, devices: list[str]) -> dict[str, float]:
    """The floor of one training step in ms and its parts: the towers `models[i]` on `devices[i]` at `batch`
    images each, all at once, plus one optimizer update."""
    compute = towers_seconds(models, batch, devices)
    weights = sum(int(v.shape.num_elements()) for v in models[0].trainable_variables)
    traffic = TOUCHED[optimizer] * 4 * weights / bandwidth_bytes_per_second(devices[0])
    return {"floor_step_ms": 1000 * (compute + traffic), "floor_compute_ms": 1000 * compute,
            "floor_update_ms": 1000 * traffic}
