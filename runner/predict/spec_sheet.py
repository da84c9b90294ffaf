"""A combination's step on a named hardware (`runner predict hardware=dgx1_p100`), priced from its spec sheet and
the model's own layers, without running anything there.

- `towers`: each layer's passes at the per-tower batch as a roofline of its op class (the slower of its FLOPs and
  its bytes at their efficiencies), plus a fixed cost per kernel;
- `update`: the optimizer's bytes (runner/config.py's TOUCHED) where the strategy applies it, plus the gradient
  copies summed there;
- `reduce`: the strategy's `Exchange` over the links, less what overlaps with the backward pass (Constants.overlap);
- `input`: the global batch copied from the host to the devices.

The efficiencies are the only constants not on a spec sheet (docs/cost-model.md). Nothing here reads a published
measurement: runner/bench/published.py compares with them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from runner.config import SLOTS, TOUCHED
from runner.errors import ConfigError, UserError
from runner.lazy import keras
from runner.measure.flops import _forward_flops, attention_positions, leaf_layers
from runner.strategies import on_spec_sheets, splitting


@dataclass(frozen=True)
class Constants:
    """The efficiencies not on a spec sheet, each a fraction of what a spec sheet gives: fitted together to the
    published tables by runner/bench/fit.py (docs/cost-model.md), which also fits them with cells left out."""

    # Convolution and matmul FLOP/s as a fraction of the float32 peak, by the algorithm cuDNN picks for the shape:
    # GEMM (1x1, Dense); fast (Winograd for 3x3 stride 1, FFT for 5x5 and more: fewer multiplications than counted,
    # so above 1; one class, as two fitted apart held out worse); implicit GEMM (strided 3x3, asymmetric, depthwise).
    algorithms: dict[str, float] = field(default_factory=lambda: {"gemm": 0.658, "fast": 2.11, "implicit": 0.335})
    # The architecture's scale on those fractions; one with no published table here takes `reference`'s (scale 1).
    architecture: dict[str, float] = field(default_factory=lambda: {"kepler": 0.445, "pascal": 1.0})
    reference: str = "pascal"
    memory: float = 0.512  # fraction of the memory bandwidth element-wise and normalisation kernels reach
    # Fixed cost per kernel (launch, ramp-up and tail) in the accelerator's cycles: not fitted (the tables' large
    # batches cannot tell it from 0), a kernel launch's order (6.8 us at P100's clock).
    kernel_cycles: float = 10_000
    link: float = 0.560  # fraction of a link's bandwidth transfers reach (protocol and packet overhead)
    overlap: float = 0.159  # fraction of the backward pass that communication of gradients can hide behind
    sync: float = 0.0412  # a synchronous step over several devices: the towers' passes wait for the slowest, this longer

    def scale(self, architecture: str | None) -> float:
        """The scale on `algorithms` of an accelerator of `architecture` (None, or one not fitted: `reference`'s; 1
        where none is)."""
        return self.architecture.get(architecture or self.reference, self.architecture.get(self.reference, 1.0))


FIT = Constants()  # fitted to the 2017 tables' 117 cells (`python -m runner.bench published --held-out`)
FIT_UNIT = "images"  # what those cells count: five image CNNs' images/s (a text or click model's is unchecked)
DEFAULT_CLOCK = 1.48e9  # an accelerator whose spec sheet gives no clock: P100's boost clock
# Bytes of a layer's backward pass per byte of its forward pass (a compute layer's count only when memory-bound).
BACKWARD_BYTES = {"norm": 5 / 3, "elementwise": 1.5, "compute": 2.0, "lookup": 1.0}
# NVIDIA's architectures with bfloat16 arithmetic (an accelerator of no named architecture is priced as the newest)
BFLOAT16 = ("ampere", "ada", "hopper")


@dataclass(frozen=True)
class Layer:
    """One layer's work per example, forward (runner.measure.flops' conventions: 2 FLOPs a multiply-accumulate)."""

    kind: str  # compute (a convolution or matmul), norm, elementwise or lookup
    flops: float  # forward FLOPs per example (compute layers)
    bytes: float  # forward bytes per example read and written (float32 activations)
    weight_bytes: float = 0.0  # its weights, read once per pass whatever the batch
    first: bool = False  # its input is the data: no input gradient
    kept: float = 0.0  # bytes per example of its output kept for the backward pass (float32)
    kernels: int = 1  # kernels its forward pass launches
    algorithm: str = ""  # a compute layer's, a key of Constants.algorithms


FREE = ("InputLayer", "Flatten", "Reshape", "Permute")  # views: no kernel, no traffic
UNKEPT = ("Add", "Concatenate")  # outputs their gradients do not read (a batch norm's neither: its input is kept)


def layers(model: Any) -> list[Layer]:
    """The layers of a built Keras model as `Layer`s, in order; a fused activation and bias add are their own
    element-wise layers, as TensorFlow runs them."""
    out, seen_weights = [], False
    for layer in leaf_layers(model):
        if type(layer).__name__ in FREE:
            continue
        main = _layer(layer, first=not seen_weights)
        seen_weights = seen_weights or bool(layer.trainable_weights)
        out.extend([main, *_tied_output(layer)])
        if main.kind == "compute":
            size = _elements(layer.output)
            bias = Layer("elementwise", 0.0, 8.0 * size)
            activation = Layer("elementwise", 0.0, 8.0 * size, kept=4.0 * size)
            out.extend([bias] * bool(getattr(layer, "use_bias", False)) + [activation] * _activated(layer))
    return out


def _layer(layer: Any, first: bool) -> Layer:
    """One Keras layer's own work."""
    kept = 4.0 * _elements(layer.output)
    moved = 4.0 * _elements(layer.input) + kept
    weights = 4.0 * sum(math.prod(w.shape) for w in layer.trainable_weights)
    if isinstance(layer, keras.layers.Embedding):
        return Layer("lookup", 0.0, 2 * kept, 0.0, first, kept)
    if isinstance(layer, (keras.layers.BatchNormalization, keras.layers.LayerNormalization,
                          keras.layers.GroupNormalization)):
        return Layer("norm", 0.0, 1.5 * moved, weights)  # statistics pass + normalising pass: 3 arrays
    if not layer.trainable_weights:  # a sum's or a concatenation's output is not needed by its gradient
        return Layer("elementwise", 0.0, moved, kept=0.0 if type(layer).__name__ in UNKEPT else kept)
    try:
        flops = _forward_flops(layer)
    except ValueError:  # priced by its weights alone, an LSTM's 64 steps made 124 TFLOP/s of a 15.7 TFLOP/s V100
        raise UserError(f"not priced on spec sheets: no FLOP formula for layer {layer.name} ({type(layer).__name__}; "
                        "runner/measure/flops.py has those it prices); runner predict without hardware= prices the "
                        "model on this machine, where its passes are measured") from None
    if isinstance(layer, keras.layers.MultiHeadAttention):  # the heads' (t_q, t_k) scores and weights, q, k and v
        (t_q, t_k), heads = attention_positions(layer), layer._num_heads
        scores = 4.0 * heads * t_q * t_k
        projected = 4.0 * heads * (t_q * layer._key_dim + t_k * (layer._key_dim + layer._value_dim))
        kept, moved = kept + 2 * scores + projected, moved + 4 * scores  # softmax: read, write; x V: read
    return Layer("compute", flops, moved, weights, first, kept, algorithm=_algorithm(layer))


def _tied_output(layer: Any) -> list[Layer]:
    """A token embedding also called on float states as the output layer (the GPT's tied table: an Embedding that
    counts its own FLOPs, its output matmul): each such call as a compute layer of the table's weights (their
    gradient dense); its calls on integer ids are the lookup."""
    if not (isinstance(layer, keras.layers.Embedding) and hasattr(layer, "forward_flops_per_example")):
        return []
    weights = 4.0 * sum(math.prod(w.shape) for w in layer.trainable_weights)
    out = []
    for call in layer._inbound_nodes[1:]:  # the first builds the layer: a lookup (`_layer`)
        if "float" in str(call.input_tensors[0].dtype):  # (b, t, channels) states -> (b, t, vocabulary) logits
            states, logits = (4.0 * _elements(tensors) for tensors in (call.input_tensors, call.output_tensors))
            out.append(Layer("compute", float(layer.forward_flops_per_example()), states + logits,
                             0.0 if out else weights, kept=logits, algorithm="gemm"))  # its weights once
    return out


def _algorithm(layer: Any) -> str:
    """The convolution algorithm cuDNN picks for the layer's shape (a Dense, or any layer not a convolution: gemm)."""
    kernel, strides = tuple(getattr(layer, "kernel_size", ())), tuple(getattr(layer, "strides", ()))
    if not kernel or all(k == 1 for k in kernel):
        return "gemm"
    if hasattr(layer, "depthwise_kernel") or hasattr(layer, "depth_multiplier"):  # per channel: no Winograd, no FFT
        return "implicit"
    if kernel == (3, 3) and strides == (1, 1) and getattr(layer, "groups", 1) == 1:
        return "fast"  # Winograd
    return "fast" if min(kernel) >= 5 else "implicit"  # FFT


def _activated(layer: Any) -> bool:
    activation = getattr(layer, "activation", None)
    return activation is not None and getattr(activation, "__name__", "") != "linear"


def _elements(tensors: Any) -> int:
    """Values per example in a layer's input or output (a list or dict of tensors: all of them)."""
    return sum(math.prod(d or 1 for d in tuple(t.shape)[1:]) for t in keras.tree.flatten(tensors))


@dataclass(frozen=True)
class Passes:
    """One tower's forward and backward pass on one device, in seconds."""

    forward: float
    backward: float


def sixteen_bits(accelerator: Any, precision: str) -> bool:
    """Whether mixed precision is faster than float32 on `accelerator`: only with tensor cores (Keras warns that a
    GPU below compute capability 7.0 may run it slower; a P100's 2x float16 is not counted)."""
    return precision != "float32" and bool(accelerator.tensor_flops)


def check_precision(hardware: Any, precision: str) -> None:
    """ConfigError for bfloat16 on an accelerator without bfloat16 arithmetic (before Ampere: V100, 2080 Ti, P100,
    K80), which a prediction would otherwise price at its float16 tensor cores' rate."""
    accelerator = hardware.accelerator
    if precision == "mixed_bfloat16" and accelerator.architecture not in (None, *BFLOAT16):
        instead = "mixed_float16 (its tensor cores)" if accelerator.tensor_flops else "float32"
        raise ConfigError(f"train.precision=mixed_bfloat16: hardware={hardware.name}'s {accelerator.name} "
                          f"({accelerator.architecture}) has no bfloat16 arithmetic ({', '.join(BFLOAT16)} have); "
                          f"use train.precision={instead}")


def flop_rates(accelerator: Any, precision: str, constants: Constants = FIT) -> dict[str, float]:
    """FLOP/s of each algorithm on `accelerator`; mixed precision runs every convolution and matmul on the tensor
    cores where there are any (cuDNN's implicit GEMM there: no Winograd or FFT saving), at the GEMM fraction;
    without tensor cores it is priced as float32 (`sixteen_bits`)."""
    fractions, scale = constants.algorithms, constants.scale(accelerator.architecture)
    if sixteen_bits(accelerator, precision):
        return dict.fromkeys(fractions, accelerator.tensor_flops * fractions["gemm"] * scale)
    return {name: accelerator.peak_flops * fraction * scale for name, fraction in fractions.items()}


def passes(model_layers: list[Layer], batch: int, accelerator: Any, precision: str,
           constants: Constants = FIT) -> Passes:
    """The per-tower forward and backward pass of `batch` examples on `accelerator` (a spec sheet's)."""
    rates = flop_rates(accelerator, precision, constants)
    byte_rate = accelerator.memory_bandwidth * constants.memory
    scale = 0.5 if sixteen_bits(accelerator, precision) else 1.0  # activations in 16 bits
    kernel = constants.kernel_cycles / (accelerator.clock_hz or DEFAULT_CLOCK)
    forward = backward = 0.0
    for layer in model_layers:
        rate = rates.get(layer.algorithm, 0.0)
        compute = batch * layer.flops / rate if rate else 0.0
        moved = (scale * layer.bytes * batch + layer.weight_bytes) / byte_rate
        forward += max(compute, moved) + layer.kernels * kernel
        backward += (max((1.0 if layer.first else 2.0) * compute, BACKWARD_BYTES[layer.kind] * moved)
                     + 2 * layer.kernels * kernel)
    return Passes(forward, backward)


def memory_per_device(model_layers: list[Layer], optimizer: str, precision: str) -> tuple[float, float]:
    """Bytes one device holds, fixed and per example: its weights, their gradients and optimizer slots (all of them:
    a sharded update's 1 / N of the slots is not modelled); every layer's output kept for the backward pass."""
    weights = sum(layer.weight_bytes for layer in model_layers)
    per_example = sum(layer.kept for layer in model_layers) * (0.5 if precision != "float32" else 1.0)
    return weights * (2 + SLOTS[optimizer]), per_example


def price(plan: Any, model_layers: list[Layer], constants: Constants = FIT) -> tuple[dict[str, float], float]:
    """The terms (seconds per step) of `plan`'s step on its spec sheet, and the step of one device alone at the same
    per-device batch (efficiency's base), with `constants`' efficiencies; ConfigError when the model does not fit."""
    c = constants
    hw, train = plan.hardware, plan.train
    nodes = hw.nodes_for(plan.gpus)  # as few as hold them, the same count on each (SpecSheet.check_devices)
    local = plan.strategy.towers(plan.gpus) // nodes if plan.strategy.data_parallel else 1  # one node's devices
    batch = int(train.per_device_batch_size)
    check_precision(hw, str(train.precision))
    _check_fits(plan, model_layers, batch)
    weight_bytes = sum(layer.weight_bytes for layer in model_layers)
    exchange = plan.strategy.exchange(max(local, 1), nodes, weight_bytes)
    tower = passes(model_layers, batch, hw.accelerator, str(train.precision), c)
    touched = TOUCHED[str(train.optimizer)] * weight_bytes
    alone = tower.forward + tower.backward + touched / (hw.accelerator.memory_bandwidth * c.memory)
    update = ((exchange.device_update * touched + exchange.device_sums * weight_bytes)
              / (hw.accelerator.memory_bandwidth * c.memory)
              + (exchange.host_update * touched + exchange.host_sums * weight_bytes) / hw.host.memory_bandwidth)
    sharing = min(max(local, 1), hw.host.shared_by)  # devices pushing through one host link at once
    moved = (exchange.link_bytes / (hw.link.bandwidth * c.link)
             + exchange.host_bytes * sharing / (hw.host.bandwidth * c.link)
             + exchange.network_bytes / (hw.network.bandwidth * c.link) + exchange.messages * hw.network.latency)
    terms = {
        "towers": tower.forward + tower.backward,
        "update": update,
        "reduce": max(0.0, moved - c.overlap * tower.backward) + (c.sync * (tower.forward + tower.backward)
                                                                if plan.gpus > 1 else 0.0),
        "ops": 0.0,  # kernel launches are in the towers' passes
    }
    # The next batch is copied to the devices while this step runs (prefetched): only what outlasts the step counts
    copy = batch * plan.spec.input_bytes * sharing / (hw.host.bandwidth * c.link)
    return {**terms, "input": max(0.0, copy - sum(terms.values()))}, alone


def _check_fits(plan: Any, model_layers: list[Layer], batch: int) -> None:
    """Refuse a per-device batch whose weights, optimizer state and activations exceed a device's memory."""
    hw, train = plan.hardware, plan.train
    fixed, per_example = memory_per_device(model_layers, str(train.optimizer), str(train.precision))
    need, have = fixed + batch * per_example, hw.accelerator.memory_bytes
    if need <= have:
        return
    most = max(0, int((have - fixed) // per_example)) if per_example > 0 else 0
    digits = next(d for d in range(1, 10) if round(need / 1e9, d) != round(have / 1e9, d))  # 11.84 vs 11.81, not 11.8
    split = "".join(f" or strategy={n}" for n in splitting() if n in on_spec_sheets())  # one it could then price
    towers = plan.strategy.towers(plan.gpus)
    # the key the user sets: the per-device batch under weak scaling, else the global one (the per-device is derived)
    key, size, scale = (("per_device_batch_size", batch, 1) if train.batch_scaling == "weak" else
                        ("global_batch_size", train.global_batch_size, towers))
    per_device = "" if scale == 1 else " ({} per device)"
    fix = (f"use train.{key}={most * scale} or less{per_device.format(most)}" if most else
           f"its weights and optimizer state alone do not fit: use a device with more memory{split}")
    raise ConfigError(f"train.{key}={size}{per_device.format(batch)} needs {need / 1e9:,.{digits}f} GB per device on "
                      f"hardware={hw.name} ({hw.accelerator.name}: {have / 1e9:,.{digits}f} GB); {fix}")
