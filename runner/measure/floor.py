"""A lower bound of the training step's time for the model's own shapes: the work no step can avoid or overlap.

MFU compares a run with the device's peak on one large matrix product, which a batch-128 MLP's small matrices can
never reach. The floor compares it with what its own work costs here, measured in the same process on the same
devices, counting only what every step of every strategy must do, one part after the other:
- the towers' forward and backward passes, all at once on their own devices at the run's per-tower batch, with no
  input pipeline, optimizer or cross-device traffic (`towers_seconds`, the fastest repeat);
- the update of the first layer's weights and of every embedding table (each the first layer of its own lookups):
  the last gradients the backward pass produces and the first weights the next forward reads, so no strategy can
  overlap them with compute. Counted as memory traffic: dense weights at the bandwidth of the whole device set (a
  sharded update's best case), a table's looked-up rows at the speed of gathering them (`tables_update_seconds`).
  The other layers' updates can overlap the backward pass and are not counted.
`train.probe_floor=true` measures it after training and logs `floor_step_ms` and `step_time_over_floor` (at least
1.0, give or take the spread of repeated runs); not on simulated CPU devices (`not_a_bound`).
"""

from __future__ import annotations

import contextlib
import functools
import math
import os
import statistics
import timeit
from typing import Any

from runner.config import ROWS_ONLY, TOUCHED
from runner.tasks import CLASSES, Task


def not_a_bound(simulated: bool, kind: str, count: int, cores: int | None = None) -> str | None:
    """Why the floor would not bound the step on these devices, or None where it does (one device; real GPUs).
    On simulated CPU devices sharing the host's cores the executor interleaves the towers, and whole steps measured
    faster than their towers' passes alone, however timed (docs/benchmarks.md)."""
    cores = cores or os.cpu_count() or 1
    if simulated and kind == "CPU" and count > 1:
        return (f"not measured: on {count} simulated CPU devices sharing {cores} core{'s' * (cores > 1)} the towers' "
                "passes timed alone do not bound the step (runner/measure/floor.py)")
    return None


def median_seconds(fn: Any, repeats: int = 5, statistic: Any = statistics.median) -> float:
    """Median (or `statistic`: min for the fastest) seconds of `fn()` after two warm-up calls (tracing, first
    allocations)."""
    fn()
    fn()
    return statistic(timeit.repeat(fn, "gc.enable()", number=1, repeat=repeats))  # the collector on, as in training


def random_batch(model: Any, batch: int, task: Task = CLASSES) -> tuple[Any, Any]:
    """Random inputs of `model`'s shapes and dtypes (float values in [0, 1); ids 0 and 1, which any vocabulary or
    table has), a dict by name for a model of several named inputs, and random labels of the task's dtype in its
    classes, (b, *positions) as its outputs have them (a single output: label 0, or a value in [0, 1))."""
    import tensorflow as tf

    def one(t: Any) -> tf.Tensor:
        shape = (batch, *t.shape[1:])
        return tf.random.uniform(shape, maxval=2, dtype=tf.int32) if "int" in str(t.dtype) else \
            tf.random.uniform(shape)

    x = {t.name: one(t) for t in model.inputs} if len(model.inputs) > 1 else one(model.inputs[0])
    shape = (batch, *model.output_shape[1:-1])
    if task.labels_dtype != "int32":
        return x, tf.random.uniform(shape, dtype=task.labels_dtype)
    return x, tf.random.uniform(shape, maxval=model.output_shape[-1], dtype=tf.int32)


def towers_seconds(models: list[Any], batch: int, devices: list[str], calls: int = 10, repeats: int = 5,
                   call_seconds: float | None = None, fastest: bool = False,
                   batches: list[tuple[Any, Any]] | None = None, jit: bool = False,
                   task: Task = CLASSES) -> float:
    """Seconds per step of forward and backward passes of every tower at once: `models[i]` on `batch` images on
    `devices[i]`, as the towers of a data-parallel step run (what N towers on shared cores do to each other shows).
    `call_seconds`: instead of `calls` steps per timed call, as many (3 to 20) as make a call last about that long,
    so that a call's own cost is noise beside its steps. `fastest`: the fastest repeat, not the median (a floor:
    a slow spell of the host only ever adds time). `batches`: tower i's (x, y), real examples, in place of random
    ones (embedding lookups cost what their ids' spread makes them cost). `jit`: each tower's passes one XLA
    cluster on its device. `task`: what the outputs are scored by (its loss, its labels)."""
    import tensorflow as tf

    feeds = []
    for i, (model, device) in enumerate(zip(models, devices)):
        with tf.device(device):
            feeds.append(random_batch(model, batch, task) if batches is None else tf.nest.map_structure(tf.identity,
                                                                                                  batches[i]))

    def tower(model: Any, device: str, x: tf.Tensor, y: tf.Tensor) -> tf.Tensor:
        with tf.device(device), tf.GradientTape() as tape:
            logits = tf.cast(model(x, training=True), tf.float32)  # (b, *positions, classes)
            loss = tf.reduce_mean(task.loss(y, logits))
        grads = tape.gradient(loss, model.trainable_variables)
        values = [g.values if isinstance(g, tf.IndexedSlices) else g for g in grads]  # a table's rows: its values
        return tf.add_n([tf.reduce_sum(v[..., :1]) for v in values])  # every gradient is needed

    if jit:
        tower = tf.function(tower, jit_compile=True, autograph=False)

    @tf.function(autograph=False)
    def passes(steps: tf.Tensor) -> tf.Tensor:  # one trace for any number of steps
        def on(device: str, *args: Any) -> tf.Tensor:
            with tf.device(device):  # where an XLA cluster runs: the device it is called under
                return tower(*args)

        def one(i, total):
            return i + 1, total + tf.add_n([on(d, m, d, x, y) for m, d, (x, y) in zip(models, devices, feeds)])

        # One pass at a time: left to overlap (the loop's default), independent passes fill the cores in a way no
        # training step can, and the floor of a model of small matmuls (the MLP) comes out below what it costs.
        return tf.while_loop(lambda i, _: i < steps, one, (tf.constant(0), tf.constant(0.0)), parallel_iterations=1)[1]

    if call_seconds is not None:
        once = median_seconds(lambda: float(passes(tf.constant(1))), 1)
        calls = max(3, min(20, math.ceil(call_seconds / max(once, 1e-6))))
    steps = tf.constant(calls)
    return median_seconds(lambda: float(passes(steps)), repeats, min if fastest else statistics.median) / calls


def bandwidth_bytes_per_second(devices: list[str], megabytes: int = 64) -> float:
    """Memory bandwidth of the device set: bytes read plus written per second, every device copying a large tensor
    of its own at once (on simulated devices each has only its share of the cores' threads)."""
    import tensorflow as tf

    pairs = []
    for device in devices:
        with tf.device(device):
            pairs.append((tf.Variable(tf.zeros((megabytes << 18,))), tf.Variable(tf.zeros((megabytes << 18,)))))

    @tf.function
    def copy() -> None:
        for device, (source, target) in zip(devices, pairs):
            with tf.device(device):
                target.assign(source * 1.0001)

    return 2 * len(devices) * (megabytes << 20) / median_seconds(lambda: copy())


def first_layer_weights(model: Any, skip: set[int] = frozenset()) -> int:
    """Weights of the first layer that has trainable ones: the last gradient of the backward pass, the first weights
    of the next forward pass; layers whose weights' ids are in `skip` (embedding tables, counted apart) passed over."""
    from runner.measure.flops import leaf_layers

    first = next((layer for layer in leaf_layers(model)
                  if layer.trainable_variables and not any(id(v) in skip for v in layer.trainable_variables)), None)
    return sum(int(v.shape.num_elements()) for v in first.trainable_variables) if first else 0


def looked_up(tables: list[Any], model: Any, x: Any, distinct: bool = True) -> list[Any]:
    """The rows of each of `tables` (embedding tables of `model`, read by lookups only) that the inputs `x` look up,
    read off the tables' sparse gradients: [table] -> int64 (rows,), each once, or with `distinct` false a row per
    lookup, repeats included."""
    import tensorflow as tf

    with tf.GradientTape() as tape:  # any function of the outputs: its table gradients' indices are the lookups
        loss = tf.reduce_sum(tf.cast(model(x, training=True), tf.float32))
    ids = [tf.cast(g.indices, tf.int64) for g in tape.gradient(loss, tables)]
    return [tf.unique(i)[0] for i in ids] if distinct else ids


def rows_seconds(tables: list[list[Any]], rows: list[list[Any]], devices: list[str]) -> float:
    """Seconds to gather `rows[i][t]` of table `tables[i][t]` on `devices[i]`, every table of every device at once
    (the fastest repeat): what reading a step's looked-up rows costs at their own spread over the tables."""
    import tensorflow as tf

    @tf.function(autograph=False)
    def gather() -> tf.Tensor:
        sums = []
        for device, on, ids in zip(devices, tables, rows):
            with tf.device(device):
                sums += [tf.reduce_sum(table.value.sparse_read(i)[:, :1]) for table, i in zip(on, ids)]  # in place
        return tf.add_n(sums)

    return median_seconds(lambda: float(gather()), 7, min)


def floor_step_ms(models: list[Any], batch: int, optimizer: str, devices: list[str], xla: bool = False,
                  task: Task = CLASSES, batches: list[tuple[Any, Any]] | None = None,
                  tables: list[list[Any]] | None = None, table_optimizer: str | None = None) -> dict[str, float]:
    """The floor of one training step in ms and its parts: the towers `models[i]` on `devices[i]` at `batch`
    examples each, all at once, then the update of the first layer's weights and of every embedding table (see the
    module's docstring). `xla`: where the step may be XLA-compiled (train.jit_compile), the passes are timed compiled
    too and the faster counts: a floor no step can beat, whichever way it is compiled. `batches`: tower i's real
    examples (a model with tables: random ids would all look up two rows); `tables`: tower i's embedding tables read
    by lookups only, updated by `table_optimizer` (else `optimizer`)."""
    passes = functools.partial(towers_seconds, models, batch, devices, repeats=7, fastest=True, batches=batches,
                               task=task)
    compute = passes()
    if xla:
        import tensorflow as tf

        with contextlib.suppress(tf.errors.OpError):  # an op XLA cannot compile: the step cannot be compiled either
            compute = min(compute, passes(jit=True))
    bandwidth, on = bandwidth_bytes_per_second(devices), tables or [[] for _ in models]
    first = first_layer_weights(models[0], skip={id(t) for t in on[0]})
    traffic = TOUCHED[optimizer] * 4 * first / bandwidth + tables_update_seconds(
        models, on, batches, table_optimizer or optimizer, devices, bandwidth)
    return {"floor_step_ms": 1000 * (compute + traffic), "floor_compute_ms": 1000 * compute,
            "floor_update_ms": 1000 * traffic}


def tables_update_seconds(models: list[Any], tables: list[list[Any]], batches: list[tuple[Any, Any]] | None,
                          optimizer: str, devices: list[str], bandwidth: float) -> float:
    """The update of every embedding table, each the first layer of its own lookups: an optimizer that updates only
    the looked-up rows (ROWS_ONLY) reads and writes TOUCHED arrays' worth of those rows at random places, at least
    TOUCHED / 2 gathers of them (a gather reads each row at its place and writes it in order); any other rewrites
    every row of the table, TOUCHED arrays' worth at the device set's bandwidth."""
    if not tables[0]:
        return 0.0
    if optimizer not in ROWS_ONLY:
        return TOUCHED[optimizer] * 4 * sum(int(t.shape.num_elements()) for t in tables[0]) / bandwidth
    feeds = [x for x, _ in batches] if batches else [random_batch(m, 2)[0] for m in models]
    rows = [looked_up(on, model, x) for on, model, x in zip(tables, models, feeds)]
    return TOUCHED[optimizer] / 2 * rows_seconds(tables, rows, devices)
