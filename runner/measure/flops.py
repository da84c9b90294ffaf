"""FLOPs per training example, counted from the model's layers, and model FLOPs utilisation (MFU).

Conventions (shared by every function here):

- A FLOP is one floating-point add or multiply, so a multiply-accumulate counts 2.
- Only the multiply-accumulates of the layers with weights count (Dense, Conv1D/2D/3D: `2 * kernel size * output
  positions`; self-attention: its four projections and its two (t, t) products), and of a layer that counts itself
  (`forward_flops_per_example`: the GPT's tied output layer, DLRM's interaction). Embedding lookups, normalisation,
  bias adds, activations, pooling, dropout and the loss are left out: a small share of every model here.
- A training step is forward + backward, the backward being 2x forward for each weighted layer, less the first
  weighted layer's input gradient: its input is the data, which TensorFlow never differentiates.
- The optimizer update is excluded: it is per step, not per example.

`runner.measure.graph_flops` counts the same step from TensorFlow's own graph statistics: the cross-check, and the
count of a model with a layer no formula here covers (`count_training_flops` picks). `runner.measure.peak` measures
the peak that MFU divides by.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from typing import Any, Iterator

from runner.errors import one_line
from runner.tasks import CLASSES, Task

log = logging.getLogger(__name__)


def leaf_layers(model: Any) -> Iterator[Any]:
    """Every non-container layer of `model`, in order (nested models are walked into)."""
    for layer in model.layers:
        if hasattr(layer, "layers"):  # a nested keras.Model
            yield from leaf_layers(layer)
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
    """Forward FLOPs per example of one layer (0 without trainable weights, unless it counts itself)."""
    import keras

    if _counts_itself(layer):  # models/gpt.py's tied embedding, models/dlrm.py's interaction (no weights)
        return float(layer.forward_flops_per_example())
    if not layer.trainable_weights:  # Flatten, pooling, Dropout (its seed state is not trainable), ...
        return 0.0
    if isinstance(layer, (keras.layers.Embedding, keras.layers.LayerNormalization)):
        return 0.0  # a lookup; an element-wise scale and shift (left out, as bias adds are)
    if isinstance(layer, keras.layers.MultiHeadAttention):
        return _attention_flops(layer)
    if isinstance(layer, (keras.layers.SeparableConv1D, keras.layers.SeparableConv2D)):  # depthwise, then 1x1
        return 2.0 * (math.prod(layer.depthwise_kernel.shape) + math.prod(layer.pointwise_kernel.shape)) * \
            _output_positions(layer)
    if isinstance(layer, keras.layers.RNN) and hasattr(layer.cell, "recurrent_kernel"):  # LSTM, GRU, SimpleRNN
        steps = tuple(layer.input.shape)[1]  # the input's and the state's kernels at every time step
        return 2.0 * (math.prod(layer.cell.kernel.shape) + math.prod(layer.cell.recurrent_kernel.shape)) * steps
    if not isinstance(layer, (keras.layers.Dense, keras.layers.Conv1D, keras.layers.Conv2D, keras.layers.Conv3D,
                              keras.layers.DepthwiseConv1D, keras.layers.DepthwiseConv2D)):
        # Refuse rather than count 0: a silently low count would inflate nobody's MFU but deflate it unnoticed.
        raise ValueError(f"no FLOP formula for layer {layer.name} ({type(layer).__name__}); "
                         "add one to runner/measure/flops.py")
    # The kernel is (in, out) for Dense, (k..., cin / groups, cout) for convolutions and (k..., cin, multiplier) for
    # depthwise ones: every entry is one multiply-accumulate per output position, whatever the padding, stride or
    # groups.
    return 2.0 * math.prod(layer.kernel.shape) * _output_positions(layer)


def _counts_itself(layer: Any) -> bool:
    """Whether the layer gives its own forward FLOPs per example (`forward_flops_per_example`)."""
    return hasattr(layer, "forward_flops_per_example")


def _attention_flops(layer: Any) -> float:
    """Attention of t_q query positions over t_k key positions (`attention_positions`; self-attention: t and t): the
    query and output projections at each query position and the key and value ones at each key position (2 x kernel
    size each), and the two products, scores Q K^T (2 t_q t_k x heads x key_dim) and weights x V (2 t_q t_k x heads
    x value_dim; a causal mask does not skip them). Keras' MultiHeadAttention keeps its projections as EinsumDense
    sublayers."""
    t_q, t_k = attention_positions(layer)
    size = [math.prod(d.kernel.shape) for d in (layer._query_dense, layer._key_dense, layer._value_dense,
                                                layer._output_dense)]
    products = 2.0 * t_q * t_k * layer._num_heads * (layer._key_dim + layer._value_dim)
    return 2.0 * ((size[0] + size[3]) * t_q + (size[1] + size[2]) * t_k) + products


def attention_positions(layer: Any) -> tuple[int, int]:
    """(query, key) positions of a MultiHeadAttention layer's call: the query's and the value's (Keras' key defaults
    to the value), the same t in self-attention."""
    inputs = layer._inbound_nodes[0].input_tensors  # query, value[, key]
    return tuple(math.prod(tuple(x.shape)[1:-1]) for x in (inputs[0], inputs[min(1, len(inputs) - 1)]))


def forward_flops_per_example(model: Any) -> float:
    """Forward-pass FLOPs per example of a built Keras model. ValueError: a layer with trainable weights has no
    formula here, or the model is not built."""
    return sum(_forward_flops(layer) for layer in leaf_layers(model))


def training_flops_per_example(model: Any) -> float:
    """FLOPs of one training step per example (module docstring): 3x each weighted layer's forward FLOPs (forward,
    input gradient, weight gradient), 2x the first's. Exact for Sequential chains; in a graph with several layers
    reading the input directly only the first of them is discounted. ValueError as `forward_flops_per_example`."""
    import keras

    weighted = [layer for layer in leaf_layers(model) if layer.trainable_weights or _counts_itself(layer)]
    if not weighted:
        return 0.0
    forwards = [_forward_flops(layer) for layer in weighted]
    # An embedding first: its lookup has no input gradient to skip (and a tied output layer's matmul does need its)
    first = 0.0 if isinstance(weighted[0], keras.layers.Embedding) else forwards[0]
    return 3.0 * sum(forwards) - first


@dataclass(frozen=True)
class Count:
    """FLOPs of one training step per example, and what counted them."""

    flops_per_example: float
    source: str  # "layer formulas" or "TensorFlow's graph statistics"


def count_training_flops(model: Any, task: Task = CLASSES) -> Count | None:
    """The training step's FLOPs per example: the layer formulas where they cover every weighted layer, else
    TensorFlow's own count of the traced step; None (after a warning saying why) when neither can count it."""
    try:
        return Count(training_flops_per_example(model), "layer formulas")
    except ValueError as gap:
        from runner.measure.graph_flops import profiler_flops_per_example

        # seconds for a large model, after the run's last step: said before it starts
        log.info("counting the training step's FLOPs from TensorFlow's graph statistics (%s)", str(gap).split(";")[0])
        try:
            return Count(profiler_flops_per_example(model, task=task), "TensorFlow's graph statistics")
        except Exception as e:  # noqa: BLE001 - a count is a figure of the run, not a condition of it
            log.warning("FLOPs not counted (%s; TensorFlow's graph statistics failed too: %s): achieved GFLOP/s and "
                        "MFU are left out", gap, one_line(e))
            return None


def mfu(images_per_sec: float, flops_per_example: float, peak_gflops: float, physical_processors: int = 1) -> float:
    """Model FLOPs utilisation: achieved FLOP/s (examples per second, all devices together) over one processor's
    peak times the physical processors computing (simulated devices share one: 1 whatever their count). ValueError:
    non-positive peak or processors, or negative throughput or FLOPs."""
    if peak_gflops <= 0 or physical_processors < 1:
        raise ValueError(f"need peak_gflops > 0 and physical_processors >= 1, got {peak_gflops}, {physical_processors}")
    if images_per_sec < 0 or flops_per_example < 0:
        raise ValueError(f"need non-negative rates, got {images_per_sec} images/s, {flops_per_example} FLOPs")
    return images_per_sec * flops_per_example / (peak_gflops * 1e9 * physical_processors)
