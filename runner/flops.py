"""FLOPs per training example, the machine's measured matmul peak, and model FLOPs utilisation (MFU).

Conventions (shared by every function here):

- A FLOP is one floating-point add or multiply, so a multiply-accumulate counts 2.
- The analytic count (`training_flops_per_example`) counts only the multiply-accumulates of the layers with weights
  (Dense and Conv1D/2D/3D): forward `2 * kernel size * output positions` per layer (Dense: `2*in*out`; Conv2D:
  `2*kh*kw*cin*cout*out_h*out_w`). Bias adds, activations, pooling, dropout, the loss and the optimizer are left
  out: together they are under 2% of the total for every model of this project (see the profiler comparison).
- A training step is forward + backward, the backward being 2x forward for each weighted layer (gradient with
  respect to its input and with respect to its weights), except that the first weighted layer's input gradient is
  *subtracted*: its input is the data, TensorFlow never computes it (MatMul's gradient skips it; Conv2D's gradient
  op is built but pruned from the function before it runs). The MLP 784-512-512-10 costs 1.34 MFLOP forward and
  3 * 1.34 - 0.80 = 3.21 MFLOP per training example.
- The optimizer update is excluded: it is per step, not per example (Adam: ~10 FLOPs per parameter per step).
- `profiler_flops_per_example` counts what TensorFlow's profiler counts in the traced gradient step (no optimizer),
  pruned to the ops that run: its total includes bias adds, pooling, dropout and loss ops, but not ReLU (the
  profiler has no formula for it). It charges a convolution's backward ops on the conv's *input* area instead of
  its output area, so for VALID-padded convolutions (models/cnn.py) it exceeds the analytic count by up to
  `(in_area / out_area - 1)` of their backward FLOPs (cnn tiny: +10.3%, +11.7% with the extra ops); for SAME
  padding and stride 1 (MLP, NIN) the two agree to within the extra ops (0.06% MLP, 1.5% nin tiny).

The peak is a measured one (`probe_peak`): the best achieved GFLOP/s of a chain of dense matmuls, cached per
machine, so MFU = achieved / measured peak says how far a model is from the fastest matmul on the same device.
Probe on an idle machine (e.g. before training starts): other processes only lower the figure, and a low peak
inflates every MFU computed against it; the cache records how busy the CPUs were and a re-probe keeps the higher.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

from runner.paths import cache_dir as runner_cache_dir

log = logging.getLogger(__name__)

DTYPES = ("float32", "float16", "bfloat16")
CACHE_FILE = "peak.json"


# ------------------------------------------------------------------------------------------------ analytic count


def _leaf_layers(model: Any) -> Iterator[Any]:
    """Every non-container layer of `model`, in order (nested models are walked into)."""
    for layer in model.layers:
        if hasattr(layer, "layers"):  # a nested keras.Model
            yield from _leaf_layers(layer)
        else:
            yield layer


def _output_positions(layer: Any) -> int:
    """Positions per example at which the layer applies its whole kernel: Dense rows, or conv output pixels."""
    import keras

    try:
        shape = tuple(layer.output.shape)
    except (AttributeError, ValueError) as err:  # never called: no shapes to count with
        raise ValueError(f"layer {layer.name} has no output shape; build the model (give it an Input) first") from err
    if isinstance(layer, keras.layers.Dense):
        return math.prod(shape[1:-1])  # 1 for (b, units); rows for a Dense applied to (b, ..., in)
    spatial = shape[2:] if layer.data_format == "channels_first" else shape[1:-1]
    return math.prod(spatial)


def _forward_flops(layer: Any) -> float:
    """Forward multiply-accumulate FLOPs per example of one layer (0 if it has no trainable weights)."""
    import keras

    if not layer.trainable_weights:  # Flatten, pooling, Dropout (its seed state is not trainable), ...
        return 0.0
    if not isinstance(layer, (keras.layers.Dense, keras.layers.Conv1D, keras.layers.Conv2D, keras.layers.Conv3D)):
        # Refuse rather than count 0: a silently low count would inflate nobody's MFU but deflate it unnoticed.
        raise ValueError(f"no FLOP formula for layer {layer.name} ({type(layer).__name__}); add one to runner/flops.py")
    # The kernel is (in, out) for Dense and (k..., cin / groups, cout) for convolutions: every entry is one
    # multiply-accumulate per output position, whatever the padding, stride or groups.
    return 2.0 * math.prod(layer.kernel.shape) * _output_positions(layer)


def forward_flops_per_example(model: Any) -> float:
    """Forward-pass FLOPs per example of a built Keras model (weighted layers' multiply-accumulates only).

    Args:
        model: a built keras.Model (its layers have output shapes).

    Returns:
        FLOPs per example, 2 per multiply-accumulate.

    Raises:
        ValueError: a layer with trainable weights has no formula here, or the model is not built.
    """
    return sum(_forward_flops(layer) for layer in _leaf_layers(model))


def training_flops_per_example(model: Any) -> float:
    """FLOPs of one training step per example: forward + backward, without the optimizer (module docstring).

    Each weighted layer costs 3x its forward FLOPs (forward, input gradient, weight gradient), except the first
    weighted layer, whose input gradient is not computed (its input is the data): 2x. Exact for Sequential chains;
    in a graph with several layers reading the input directly only the first of them is discounted.

    Args:
        model: a built keras.Model.

    Returns:
        FLOPs per example.

    Raises:
        ValueError: a layer with trainable weights has no formula here, or the model is not built.
    """
    forwards = [f for f in (_forward_flops(layer) for layer in _leaf_layers(model)) if f]
    if not forwards:
        return 0.0
    return 3.0 * sum(forwards) - forwards[0]


# ------------------------------------------------------------------------------------------------ profiler count


def _gradient_graph(model: Any, batch: int, training: bool) -> Any:
    """The traced step (loss gradients, or logits if not `training`) as a pruned tf.Graph with static shapes.

    Weights enter as placeholders (`stateless_call`), so every shape is static and the model's variables, wherever
    a strategy put them, are only read for their shapes. The graph is pruned to what the outputs need, as TF
    prunes a function body before running it (that drops the first conv's unused input gradient).
    """
    import keras
    import tensorflow as tf

    def specs(variables: list) -> list:
        return [tf.TensorSpec(v.shape, v.dtype) for v in variables]

    def step(x, y, weights, states):
        with tf.GradientTape() as tape:
            tape.watch(weights)
            logits, _ = model.stateless_call(weights, states, x, training=training)
            loss = tf.reduce_mean(keras.losses.sparse_categorical_crossentropy(y, logits, from_logits=True))
        return [loss, *tape.gradient(loss, weights)] if training else [logits]

    x_spec = tf.TensorSpec((batch, *model.input_shape[1:]), tf.float32)
    y_spec = tf.TensorSpec((batch,), tf.int32)
    func = tf.function(step).get_concrete_function(
        x_spec, y_spec, specs(model.trainable_variables), specs(model.non_trainable_variables)
    )
    pruned = tf.compat.v1.graph_util.extract_sub_graph(
        func.graph.as_graph_def(), [t.op.name for t in func.graph.outputs]
    )
    graph = tf.Graph()
    with graph.as_default():
        tf.import_graph_def(pruned, name="")
    return graph


@contextlib.contextmanager
def _quiet_tf_logging() -> Iterator[None]:
    """Mute TF's Python logger: graph pruning and the profiler's formulas warn that they are TF1 APIs."""
    import tensorflow as tf

    logger = tf.get_logger()
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)


def _collect(node: Any, totals: dict[str, float]) -> None:
    """Sum the profiler's own (not cumulative) float_ops per op type over its tree."""
    if node.float_ops:
        totals[node.name] = totals.get(node.name, 0.0) + node.float_ops
    for child in node.children:
        _collect(child, totals)


def profiler_flops_by_op(model: Any, batch: int = 32, training: bool = True) -> dict[str, float]:
    """TensorFlow profiler FLOPs per example of the traced step, by op type (e.g. {"MatMul": 3.21e6, ...}).

    Args:
        model: a built keras.Model mapping images to logits (loss: sparse categorical cross-entropy).
        batch: batch size traced; the counts are divided by it.
        training: profile forward + loss + gradients (no optimizer); False profiles the forward pass alone.

    Returns:
        FLOPs per example for each op type the profiler has a formula for.

    Raises:
        ValueError: some tensor of the traced graph has no static shape (its FLOPs would be silently missed).
    """
    import tensorflow as tf

    with _quiet_tf_logging():
        graph = _gradient_graph(model, batch, training)
    partial = [op.name for op in graph.get_operations() for t in op.outputs if not t.shape.is_fully_defined()]
    if partial:
        raise ValueError(f"the traced step has tensors without static shapes, e.g. {partial[:3]}")
    options = dict(tf.compat.v1.profiler.ProfileOptionBuilder.float_operation(), output="none")
    with _quiet_tf_logging():
        root = tf.compat.v1.profiler.profile(graph, options=options, cmd="op")
    totals: dict[str, float] = {}
    _collect(root, totals)
    return {name: flops / batch for name, flops in totals.items()}


def profiler_flops_per_example(model: Any, batch: int = 32, training: bool = True) -> float:
    """An independent FLOP count: TensorFlow's profiler on the traced training step, per example.

    Forward + loss + gradients with respect to every trainable weight, no optimizer (as the analytic count); it
    also counts bias adds, pooling, dropout and loss ops, and charges VALID convolutions' backward ops on their
    input area (see the module docstring for how that differs from `training_flops_per_example`).

    Args:
        model: a built keras.Model mapping images to logits.
        batch: batch size traced (tracing only: nothing is run).
        training: False counts the forward pass alone.

    Returns:
        FLOPs per example.
    """
    return sum(profiler_flops_by_op(model, batch, training).values())


# ------------------------------------------------------------------------------------------------ peak probe


@dataclass(frozen=True)
class Peak:
    """A measured dense-matmul peak.

    Attributes:
        gflops: best achieved GFLOP/s of the matmul chain.
        dtype: "float32", "float16" or "bfloat16".
        device: what it was measured on, e.g. "AMD EPYC (2 cores)" or "NVIDIA A100-SXM4-40GB (cc 8.0)".
        key: the cache key (device, dtype, matrix size).
        cached: True if read from the cache rather than measured by this call.
    """

    gflops: float
    dtype: str
    device: str
    key: str
    cached: bool


def _cpuinfo(field: str) -> str:
    """The first processor's `field` in /proc/cpuinfo ('' where there is none, e.g. macOS)."""
    from runner.devices import cpuinfo

    return cpuinfo().get(field, "")


def _cpu_description() -> str:
    """CPU model and the cores this process may use (affinity: a container's share, which is what TF uses)."""
    import platform

    name = _cpuinfo("model name") or platform.processor() or platform.machine()
    return f"{name} ({len(_cpus())} cores)"


def _cpu_supports(dtype: str) -> bool:
    """fp32 always; bf16/fp16 only with native instructions, which oneDNN uses (else they are emulated, slower).

    With avx512_bf16 bf16 matmuls ran ~1.8x fp32; fp16 without avx512_fp16 ~0.5x.
    """
    flags = set(_cpuinfo("flags").split())
    native = {"bfloat16": {"avx512_bf16", "amx_bf16"}, "float16": {"avx512_fp16", "amx_fp16"}}
    return dtype == "float32" or bool(native[dtype] & flags)


def _gpu_description(device_name: str) -> tuple[str, tuple[int, int]]:
    """GPU name and compute capability of the physical GPU behind `device_name`.

    Logical GPUs past the physical count are simulated ones carved out of GPU 0 (runner/devices.py).
    """
    import tensorflow as tf

    gpus = tf.config.list_physical_devices("GPU")
    if not gpus:
        raise ValueError(f"{device_name} is a GPU but TensorFlow sees none")
    index = int(device_name.rsplit(":", 1)[-1])
    details = tf.config.experimental.get_device_details(gpus[index if index < len(gpus) else 0])
    cc = tuple(details.get("compute_capability") or (0, 0))
    return f"{details.get('device_name', 'GPU')} (cc {cc[0]}.{cc[1]})", cc


def _describe(device_name: str, dtype: str) -> tuple[str, bool]:
    """(device description for the cache key, whether `dtype` is worth probing on it)."""
    if "GPU" not in device_name.upper():
        return _cpu_description(), _cpu_supports(dtype)
    desc, cc = _gpu_description(device_name)
    # fp16 is fast from Volta (7.0) on, and on P100 (6.0); other Pascals run it at 1/64 rate. bf16 needs Ampere.
    fast = {"float32": True, "float16": cc >= (7, 0) or cc == (6, 0), "bfloat16": cc >= (8, 0)}
    return desc, fast[dtype]


def _matmul_chain() -> Any:
    """A tf.function running k dependent matmuls y <- y @ w; k is a tensor, so one trace serves every k."""
    import tensorflow as tf

    @tf.function
    def chain(x, w, k):
        y = x
        for _ in tf.range(k):  # each matmul needs the previous one: no overlap, each uses every core
            y = tf.matmul(y, w)
        return tf.cast(y[0, 0], tf.float32)  # fetching a scalar waits for the chain without copying y back

    return chain


def _benchmark(device_name: str, dtype: str, size: int, seconds: float) -> float:
    """Best GFLOP/s of a matmul chain on `device_name`: warm-up excluded, about `seconds` of timed repeats."""
    import tensorflow as tf

    chain = _matmul_chain()
    with tf.device(device_name):
        x = tf.cast(tf.random.normal((size, size), seed=1), dtype)
        # N(0, 1/n) entries keep |y| about constant along the chain: no overflow in fp16, no denormals.
        w = tf.cast(tf.random.normal((size, size), seed=2) / math.sqrt(size), dtype)

        def timed(k: int) -> float:
            start = time.perf_counter()
            float(chain(x, w, tf.constant(k)))
            return time.perf_counter() - start

        timed(1)  # warm-up: tracing, kernel selection, first allocations
        # Calls of ~1/5 of the budget: long enough that dispatch (~0.1 ms) is noise, short enough for 5 repeats.
        k = max(1, min(10_000, round(seconds / 5 / max(timed(1), 1e-6))))
        best, spent = math.inf, 0.0
        while spent < seconds or math.isinf(best):
            dt = timed(k)
            best, spent = min(best, dt), spent + dt
    return k * 2.0 * size**3 / best / 1e9


def _cpus() -> set[int]:
    """The CPUs this process may run on (a container's share)."""
    return os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else set(range(os.cpu_count() or 1))


def _busy_seconds(cpus: set[int]) -> float:
    """CPU-seconds the CPUs `cpus` have spent busy since boot, all processes together (0 without /proc/stat)."""
    ticks = 0
    try:
        for line in Path("/proc/stat").read_text().splitlines():
            name, *fields = line.split()
            if name[:3] == "cpu" and name[3:].isdigit() and int(name[3:]) in cpus:
                values = [int(f) for f in fields[:8]]  # user nice system idle iowait irq softirq steal
                ticks += sum(values) - values[3] - values[4]  # steal counts: a VM neighbour took the core
    except (OSError, ValueError):
        return 0.0
    return ticks / os.sysconf("SC_CLK_TCK")


def _timed_with_others_share(run: Callable[[], float]) -> tuple[float, float]:
    """(run(), share of the CPUs' time other processes used meanwhile): above ~0.25 the probe was disturbed."""
    cpus = _cpus()
    busy, own, wall = _busy_seconds(cpus), time.process_time(), time.perf_counter()
    result = run()
    busy, own, wall = _busy_seconds(cpus) - busy, time.process_time() - own, time.perf_counter() - wall
    if not busy:  # no /proc/stat: unknown, reported as undisturbed
        return result, 0.0
    return result, min(1.0, max(0.0, (busy - own) / (wall * len(cpus))))


def _measure(device_name: str, dtype: str, size: int, seconds: float) -> tuple[float, float]:
    """(GFLOP/s, share of the CPUs other processes used meanwhile; 0 for GPUs, which they do not slow)."""
    if "GPU" in device_name.upper():
        return _benchmark(device_name, dtype, size, seconds), 0.0
    gflops, others = _timed_with_others_share(lambda: _benchmark(device_name, dtype, size, seconds))
    if others > 0.25:  # the figure is low, so MFU against it is too high
        log.warning("other processes used %.0f%% of the CPUs during the peak probe: %.0f GFLOP/s may be low; "
                    "re-probe with refresh=True on an idle machine", 100 * others, gflops)
    return gflops, others


def _read_cache(path: Path) -> dict:
    """The cache's entries; a missing or unreadable file is an empty cache (the peak is simply probed again)."""
    try:
        data = json.loads(path.read_text())
        return data if isinstance(data, dict) else {}
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as err:
        log.warning("ignoring unreadable peak cache %s: %s", path, err)
        return {}


def _write_cache(path: Path, key: str, entry: dict) -> None:
    """Add `entry` under `key`, atomically (parallel sweep jobs never see a half-written file)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    data = {**_read_cache(path), key: entry}
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data, indent=2, sort_keys=True))
    os.replace(tmp, path)


def probe_peak(
    device_name: str = "/device:CPU:0", dtype: str = "float32", size: int = 2048, seconds: float = 1.0,
    cache_dir: Path | None = None, refresh: bool = False,
) -> Peak | None:
    """The device's achieved dense-matmul GFLOP/s, measured once per machine and then read from a JSON cache.

    Args:
        device_name: TensorFlow device to measure; logical devices of one physical device share its entry.
        dtype: "float32", "float16" or "bfloat16".
        size: side of the square matrices (2048 reaches the peak on CPUs; the key includes it).
        seconds: timed budget of the measurement (the best call wins); about 1.5x that in all.
        cache_dir: folder of `peak.json`; default `runner.paths.cache_dir()`.
        refresh: measure even if cached; the cache keeps the higher of the old and new figures, since other
            processes can only slow a measurement down (probe on an idle machine: the entry records
            how much of the CPUs other processes used meanwhile).

    Returns:
        The Peak, or None if `dtype` has no native support on the device (CPU: bf16 needs avx512_bf16 or AMX, fp16
        avx512_fp16 or AMX-FP16; GPU: fp16 needs compute capability 7.0+ or 6.0, bf16 8.0+).

    Raises:
        ValueError: unknown dtype, or a GPU device on a machine without one.
    """
    if dtype not in DTYPES:
        raise ValueError(f"dtype={dtype!r}; use one of {DTYPES}")
    device, supported = _describe(device_name, dtype)
    if not supported:
        log.info("no native %s on %s: peak not probed", dtype, device)
        return None
    key = f"{device}|{dtype}|{size}"
    path = (cache_dir or runner_cache_dir()) / CACHE_FILE
    entry = _read_cache(path).get(key)
    old = float(entry.get("gflops", 0)) if isinstance(entry, dict) else 0.0
    if old > 0 and not refresh:
        return Peak(old, dtype, device, key, cached=True)
    gflops, others = _measure(device_name, dtype, size, seconds)
    if gflops > old:
        entry = {"gflops": gflops, "measured": time.strftime("%Y-%m-%dT%H:%M:%S"), "seconds": seconds,
                 "others_cpu_share": round(others, 2)}
        _write_cache(path, key, entry)
    log.info("peak %s on %s: %.0f GFLOP/s (cached in %s)", dtype, device, max(gflops, old), path)
    return Peak(max(gflops, old), dtype, device, key, cached=False)


# ------------------------------------------------------------------------------------------------ MFU


def mfu(images_per_sec: float, flops_per_example: float, peak_gflops: float, physical_processors: int = 1) -> float:
    """Model FLOPs utilisation: achieved FLOP/s over the peak of the physical processors actually computing.

    Simulated devices (logical CPUs or GPUs carved out of one physical processor, `devices.simulated`) share that
    one processor: pass 1 for them, whatever their count. N real GPUs pass N (with one GPU's peak).

    Args:
        images_per_sec: training throughput (examples per second, all devices together).
        flops_per_example: e.g. `training_flops_per_example(model)`.
        peak_gflops: one processor's peak, e.g. `probe_peak().gflops`.
        physical_processors: physical processors computing.

    Returns:
        A fraction; above 1 only if the inputs are inconsistent (a peak probed under load or in another dtype,
        a throughput counted over the wrong number of examples, a FLOP count for another model).

    Raises:
        ValueError: non-positive peak or processors, or negative throughput or FLOPs.
    """
    if peak_gflops <= 0 or physical_processors < 1:
        raise ValueError(f"need peak_gflops > 0 and physical_processors >= 1, got {peak_gflops}, {physical_processors}")
    if images_per_sec < 0 or flops_per_example < 0:
        raise ValueError(f"need non-negative rates, got {images_per_sec} images/s, {flops_per_example} FLOPs")
    return images_per_sec * flops_per_example / (peak_gflops * 1e9 * physical_processors)
