"""Calibrations of this machine for the cost model: microbenchmarks of seconds (`machine`, any model's; `towers`, per
model and per-tower batch; `input_seconds`, per pipeline, data and global batch), each in a process whose devices are
set up exactly as a run's would be, because that is what they measure.

Entries are cached in `<cache dir>/calibration.json` under a key naming the host CPU, the device set and threads,
and what was measured; `runner predict --recalibrate` measures again.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any, Callable

from runner.config import ROWS_ONLY, compose, table_optimizer, validate
from runner.lazy import keras, tf
from runner.measure import floor, peak, xla
from runner.measure.floor import median_seconds, towers_seconds
from runner.paths import cache_dir as runner_cache_dir
from runner.runtime.devices import host_cpu, nvidia_gpu_count, setup
from runner.strategies.common import build_optimizer, drain_loop, tables, tower_models

CACHE_FILE = "calibration.json"
FORMAT = 7  # in every key: entries of an older calibration (other figures) are measured again, not misread
RESULT = "calibration-result: "  # the child's stdout line the parent reads
CALL_SECONDS = 0.03  # a timed call of the towers lasts about this long
REPEATS = 9  # timed calls of a throughput microbenchmark (their median): 3 moved by 2-3x between runs
COLD_BYTES = 256 << 20  # a cold update cycles through this many bytes of arrays, more than any CPU's caches


def _digest(value: Any) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True, default=str).encode()).hexdigest()[:12]


def device_set_key(plan: Any) -> str:
    """The host CPU, the device count and the thread settings: what every calibration of a group shares."""
    t = plan.train
    return f"v{FORMAT}|{host_cpu()}|gpus={plan.gpus}|threads={t.intra_op_threads},{t.inter_op_threads}"


def towers_key(plan: Any) -> str:
    """What the towers' time depends on: the towers, the model, the example spec, the per-tower batch, precision."""
    spec = (plan.spec.shape, plan.spec.dtype, plan.spec.classes)
    what = [asdict(plan.model), spec, plan.train.per_device_batch_size, plan.train.precision, plan.train.seed]
    what += ["xla"] if compiled(plan) else []  # the passes timed as the run compiles them
    return f"{device_set_key(plan)}|towers={plan.local_towers}|{plan.model.name}|{_digest(what)}"


def compiled(plan: Any) -> bool:
    """Whether the plan's runs XLA-compile their towers (`xla.setting`; not yet measured: off), as they are priced."""
    decision = xla.setting(plan, "/device:GPU:0" if plan.gpus and nvidia_gpu_count() else "/device:CPU:0")
    return bool(decision and decision.on)


def input_key(plan: Any) -> str:
    """What the input's time depends on: how many towers it feeds, the pipeline, the data, the global batch."""
    what = [asdict(plan.pipeline), dict(plan.cfg.data), plan.train.global_batch_size]
    return f"{device_set_key(plan)}|input={plan.local_towers}|{plan.pipeline.name}|{_digest(what)}"


def machine_key(plan: Any) -> str:
    return f"{device_set_key(plan)}|machine"


def cache_path(cache_dir: Path | None = None) -> Path:
    return (cache_dir or runner_cache_dir()) / CACHE_FILE


def _chain_seconds(devices: list[str], size: int, ops: int) -> float:
    """Seconds of one call of a chain of `ops` element-wise sines over `size` floats, op i on devices[i % len] (sines:
    the graph optimizer folds chains of additions or multiplications by constants into one op)."""
    with tf.device(devices[0]):
        x = tf.Variable(tf.ones((size,)))

    @tf.function(autograph=False)
    def chain() -> tf.Tensor:
        y = x.read_value()
        for i in range(ops):
            with tf.device(devices[i % len(devices)]):
                y = tf.math.sin(y)  # a real op on each side, so the tensor must be there
        return tf.reduce_sum(y[:1])

    return median_seconds(lambda: float(chain()))


def op_seconds(device: str, ops: int = 200) -> float:
    """The executor's fixed cost of one small op: chains of scalar ops of two lengths, the call's own cost cancelled."""
    return max(_chain_seconds([device], 1, 2 * ops) - _chain_seconds([device], 1, ops), 0.0) / ops


def send_seconds(devices: list[str], size: int, hops: int = 20) -> float:
    """Seconds that crossing from devices[0] to devices[1] adds to an op on `size` floats (one device: 0)."""
    if len(devices) < 2:
        return 0.0
    crossing, staying = _chain_seconds(devices[:2], size, hops), _chain_seconds(devices[:1], size, hops)
    return max(crossing - staying, 0.0) / hops


def machine(devices: list[str]) -> dict[str, Any]:
    """The model-independent figures of this device set: the executor's fixed cost of one small op, and a
    cross-device send's latency and bandwidth."""
    small, large = 16, 1 << 20  # floats: latency, then 4 MB for the bandwidth
    latency = send_seconds(devices, small)
    extra = max(send_seconds(devices, large) - latency, 0.0)
    return {"op_seconds": op_seconds(devices[0]), "send_latency_s": latency,
            "send_bytes_per_s": (4 * large / extra) if extra > 0 else float("inf")}


def _cold_sets(set_bytes: int, steps: int) -> int:
    """Sets of arrays of `set_bytes` a cold microbenchmark of `steps` cycles through: past COLD_BYTES, 2 to `steps`."""
    return max(2, min(steps, math.ceil(COLD_BYTES / set_bytes)))


def _on_each(devices: list[str], sets: int, make: Any) -> list[list[Any]]:
    """[set][device] -> make(set), created on that device."""
    def made(device: str, s: int) -> Any:
        with tf.device(device):
            return make(s)

    return [[made(device, s) for device in devices] for s in range(sets)]


def update_bytes_per_second(devices: list[str], floats: int, cold: bool, steps: int = 10) -> float:
    """Bytes per second that Adam's fused update (7 arrays of `floats` read or written) moves on every device of
    `devices` at once; `cold`: other arrays each step (a step's weights and slots, out of the caches after the
    towers' passes), else the same ones (gradients summed right after the towers wrote them)."""
    sets = _cold_sets(4 * 4 * floats * len(devices), steps) if cold else 1  # a set: weights, 2 slots, a gradient
    arrays = _on_each(devices, sets, lambda s: [tf.Variable(tf.zeros((floats,))) for _ in range(3)]
                      + [tf.fill((floats,), 1.0 + s)])

    @tf.function(autograph=False)
    def updates() -> None:
        for step in range(steps):
            for device, (var, m, v, grad) in zip(devices, arrays[step % sets]):
                with tf.device(device):
                    tf.raw_ops.ResourceApplyAdam(var=var.handle, m=m.handle, v=v.handle, beta1_power=0.9,
                                                 beta2_power=0.999, lr=1e-3, beta1=0.9, beta2=0.999, epsilon=1e-7,
                                                 grad=grad)

    return 7 * 4 * floats * len(devices) * steps / median_seconds(updates, REPEATS)


def copy_bytes_per_second(devices: list[str], floats: int, pieces: int = 8, steps: int = 10) -> float:
    """Bytes per second of slicing a vector of `floats` into `pieces` and concatenating them in another order, on
    every device of `devices` at once, cold: what cutting gradients into slices and assembling weights moves."""
    sets = _cold_sets(4 * floats * len(devices), steps)
    vectors = _on_each(devices, sets, lambda s: tf.Variable(tf.fill((floats,), 1.0 + s)))
    bounds = [floats * i // pieces for i in range(pieces + 1)]

    @tf.function(autograph=False)
    def copies() -> list[tf.Tensor]:
        out = []
        for step in range(steps):
            for device, x in zip(devices, vectors[step % sets]):
                with tf.device(device):
                    y = x.read_value()
                    out.append(tf.concat([y[a:b] for a, b in zip(bounds, bounds[1:])][::-1], 0))  # not foldable
        return out

    return 4 * 4 * floats * len(devices) * steps / median_seconds(copies, REPEATS)  # each byte read, written twice


def looked_up(model: Any, batches: list[tuple[Any, Any]]) -> list[list[Any]]:
    """The ids each batch of `batches` looks up in each of `model`'s embedding tables (`common.tables`), a row per
    lookup, repeats included (`floor.looked_up`): [table][batch] -> int64 (lookups,)."""
    found = tables(model)
    per_batch = [floor.looked_up(found, model, x, distinct=False) for x, _ in batches]
    return [list(per_table) for per_table in zip(*per_batch)]


def sparse_update_bytes_per_second(plan: Any, devices: list[str], shapes: list[tuple[int, int]],
                                   ids: list[list[Any]], steps: int = 10) -> float:
    """Gradient-row bytes per second that the plan's tables' optimizer applies to embedding tables of `shapes` (a
    copy on every device of `devices`, updated at once), table t's rows at `ids[t][s]` in step s, every table in one
    `apply_gradients` as a step applies them: the sparse update a model's looked-up rows pay."""
    copies = []
    for device in devices:
        with tf.device(device):
            variables = [tf.Variable(tf.zeros(shape)) for shape in shapes]
            values = [[tf.fill((int(i.shape[0]), shape[1]), 1e-3) for i in table] for shape, table in zip(shapes, ids)]
            copies.append((variables, build_optimizer(plan.train, variables, variables), values))  # all tables

    @tf.function(autograph=False)
    def updates() -> None:
        for step in range(steps):
            for device, (variables, optimizer, values) in zip(devices, copies):
                with tf.device(device):
                    s = step % len(ids[0])
                    grads = [tf.IndexedSlices(v[s], i[s], tf.constant(shape, tf.int64))
                             for shape, i, v in zip(shapes, ids, values)]
                    optimizer.apply_gradients(zip(grads, variables))

    row_bytes = sum(4 * int(i[s % len(i)].shape[0]) * shape[1] for shape, i in zip(shapes, ids) for s in range(steps))
    return row_bytes * len(devices) / median_seconds(updates, REPEATS)


def real_batches(plan: Any, examples: Any, size: int, count: int) -> list[tuple[Any, Any]]:
    """`count` shuffled batches of `size` of the plan's training `examples`, as (x, y)."""
    return list(examples.shuffled(size * 8, plan.train.seed).batched(size, plan.pipeline).take(count))


def table_figures(plan: Any, model: Any, devices: list[str], examples: Any) -> dict[str, float]:
    """`model`'s embedding tables (`common.tables`): their bytes and count, the rows one tower looks up per step, and
    the bytes per second a sparse update of them moves on one device and on all at once (optimizers that update
    only the looked-up rows), at the ids of ten real global batches (reused rows would be in the caches)."""
    shapes = [(int(t.shape[0]), int(t.shape[1])) for t in tables(model)]  # (rows, d) each
    n = len(devices)
    ids = looked_up(model, real_batches(plan, examples, plan.train.per_device_batch_size * n, 10))  # [table][batch]
    out = {"table_bytes": 4 * sum(r * d for r, d in shapes), "tables": len(shapes),
           "row_bytes": sum(4 * int(i[0].shape[0]) * d for i, (_, d) in zip(ids, shapes)) // n}
    if table_optimizer(plan.train) in ROWS_ONLY:  # a copy applies every tower's rows (replicated; an owner its tables')
        out.update(_one_and_all("rows", devices, lambda on: sparse_update_bytes_per_second(plan, on, shapes, ids)))
    return out


def _one_and_all(term: str, devices: list[str], rate: Callable[[list[str]], float]) -> dict[str, float]:
    """`term`'s bytes per second, `rate(devices)`, on one device and on all at once (on one, the same measurement)."""
    one = rate(devices[:1])
    return {f"{term}_bytes_per_s_one": one, f"{term}_bytes_per_s_all": one if len(devices) == 1 else rate(devices)}


def towers(plan: Any, devices: list[str], examples: Any) -> dict[str, float]:
    """Seconds per step of the towers' passes, all at once, at the per-tower batch (a model with embedding tables on
    real batches of `examples`: random ids would all hit two rows); the model's dense trainable weights (float32
    bytes) and variables; the update, reduce and copy throughputs; its tables' `table_figures`."""
    models = tower_models(plan.model, plan.spec, plan.train.seed, devices)
    batch = plan.train.per_device_batch_size
    found = {id(t) for t in tables(models[0])}
    real = real_batches(plan, examples, batch, len(devices)) if found else None
    seconds = towers_seconds(models, batch, devices, repeats=5, call_seconds=CALL_SECONDS, batches=real,
                             jit=compiled(plan), task=plan.spec.task)
    variables = [v for v in models[0].trainable_variables if id(v) not in found]
    floats = sum(int(v.shape.num_elements()) for v in variables)
    out = {"seconds": seconds, "weight_bytes": 4 * floats, "variables": len(variables),
           "copy_bytes_per_s_all": copy_bytes_per_second(devices, floats),
           **(table_figures(plan, models[0], devices, examples) if found else {})}
    for term in ("update", "reduce"):  # the update cold (a step's weights and slots), the reduce's sums warm
        out.update(_one_and_all(term, devices, lambda on: update_bytes_per_second(on, floats, cold=term == "update")))
    return out


def input_seconds(plan: Any, towers: list[str], examples: Any, steps: int = 100) -> float:
    """Seconds per step of the pipeline alone feeding a tower on each of `towers` (each batch touched there)."""
    batches = plan.pipeline.towers(examples, plan.train.global_batch_size, list(towers), plan.train.seed)
    loop = drain_loop(batches.next)
    loop(tf.constant(steps))  # tracing, first fills of the buffers
    t0 = time.perf_counter()
    loop(tf.constant(steps))
    return (time.perf_counter() - t0) / steps


def measure(overrides: list[list[str]], wanted: set[str]) -> dict[str, dict]:
    """In this process, on devices set up as the runs' would be: every calibration in `wanted` (keys) for the
    combinations given as overrides, which share one device set; each entry with the figures, what it ran on and
    the share of the CPUs other processes used meanwhile (above peak.BUSY the parent does not cache them)."""
    loaded: dict[str, Any] = {}

    def examples(plan: Any) -> Any:
        name = json.dumps(dict(plan.cfg.data), sort_keys=True, default=str)
        if name not in loaded:
            loaded[name] = plan.data.load(plan.train.seed).train()
        return loaded[name]

    def measure_all() -> dict[str, dict]:
        plans = [validate(compose(o)) for o in overrides]
        train = plans[0].train
        devs = setup(plans[0].gpus, train.intra_op_threads, train.inter_op_threads)
        return measure_here(plans, wanted, devs, examples)

    out, others = peak.timed_with_others_share(measure_all)
    return {key: {**entry, "others_cpu_share": round(others, 2)} for key, entry in out.items()}


def measure_here(plans: list[Any], wanted: set[str], devs: Any, examples: Any) -> dict[str, dict]:
    """The calibrations `wanted` for `plans`, on this process's devices `devs` (a run's, after its training, or the
    calibration child's); `examples(plan)` gives a plan's training examples for its pipeline."""
    conditions = {"measured": time.strftime("%Y-%m-%dT%H:%M:%S"), "host": host_cpu(),
                  "devices": f"{devs.count} {'simulated ' if devs.simulated else ''}{devs.kind}",
                  "physical": devs.physical}
    names, out = list(devs.names), {}
    if machine_key(plans[0]) in wanted:
        out[machine_key(plans[0])] = {**machine(names), **conditions}
    for plan in plans:
        keras.mixed_precision.set_dtype_policy(plan.train.precision)
        towered = names[:plan.local_towers]
        if towers_key(plan) in wanted and towers_key(plan) not in out:
            out[towers_key(plan)] = {**towers(plan, towered, examples(plan)), **conditions}
        if input_key(plan) in wanted and input_key(plan) not in out:
            out[input_key(plan)] = {"seconds": input_seconds(plan, towered, examples(plan)), **conditions}
    return out


def child(spec_json: str) -> int:
    """`python -m runner.predict.calibrate '{"overrides": [...], "wanted": [...]}'`: measure, print one result line,
    exit without teardown."""
    spec = json.loads(spec_json)
    try:
        result = measure(spec["overrides"], set(spec["wanted"]))
    except Exception as e:  # noqa: BLE001 - reported by the parent as this group's error
        result = {"error": f"{type(e).__name__}: {e}".splitlines()[0][:300]}
    sys.stdout.write(RESULT + json.dumps(result) + "\n")
    sys.stdout.flush()
    os._exit(0)  # TensorFlow's teardown does nothing needed here (runner.cli.main._exit_now says why)


if __name__ == "__main__":
    sys.exit(child(sys.argv[1]))
