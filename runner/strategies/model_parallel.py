"""Strategy `model_parallel`: one model split across the devices, fed one global batch per step (no data parallelism).

`strategy.split` chooses how the model is cut (`auto`: `width` for the MLP, `stages` for the others):

- `width` (MLP only; Chainer's model-parallel MNIST example): every hidden Dense layer's units are split across
  the N devices (device i holds the kernel columns and bias entries of its units). Each device gathers (concats)
  the previous layer's partial activations, so every device sees the full layer output: one sync point per layer.
- `stages`: the model is cut into N consecutive stages, stage i on device i, where one tensor carries everything
  onward (between a Sequential's layers, between a residual network's or a Transformer's blocks: `segments`);
  activations move from device to device. The cuts balance the stages' multiply-adds (see `_stage_cuts`).
- `two_tower` (Chainer's NIN example): N full copies of the model, copy i on device i with seed `train.seed + i`,
  their logits summed. This is a *different model* from `single` (an ensemble trained jointly), so its losses are
  not comparable with the other strategies'.

`width` and `stages` start from the weights of the run's model built with the run's seed, so with the same seed and
data they compute the same losses as `strategy=single` (up to float summation order).

Placement. `keras.distribution` does nothing on the TensorFlow backend, so the network is rebuilt as a list of
*cells*: pieces of the model on one device each, their variables created under that device. The forward pass runs
each cell under `tf.device(cell.device)` inside its own GradientTape; the backward pass walks the cells in reverse
and calls each tape under the same device with the upstream gradient (`output_gradients`). That keeps every
gradient op beside its forward op: one tape over the whole model would put the whole backward pass on the device
where `tape.gradient` is called. Where several cells consume one cell's output (`width`'s gathers), their gradient
contributions are summed on the producing cell's device. Each cell has its own optimizer, built under its device,
so the optimizer's slots and step counter live beside the variables they update.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, ClassVar, Literal

import numpy as np

from runner.errors import ConfigError
from runner.lazy import lazy
from runner.strategies import STRATEGIES, Strategy, StrategyBase, Training, loss_scale
from runner.strategies.common import Built, copies_of_moving_state, tables, update

if TYPE_CHECKING:
    import keras
    import tensorflow as tf

    from runner.data_pipelines import Spec
    from runner.models import Model
    from runner.runtime.devices import Devices
    from runner.strategies.loss_scale import LossScale, NoLossScale
else:
    keras, tf = lazy("keras"), lazy("tensorflow")

INPUT = -1  # Cell.inputs index meaning "the image batch"
Split = Literal["auto", "width", "stages", "two_tower"]


@STRATEGIES.register
@dataclass
class ModelParallel(StrategyBase):
    """One model split across the devices, fed the whole global batch each step (model, not data, parallelism).

    split: auto (width for a model whose weighted layers are all Dense, stages otherwise) | width | stages |
    two_tower (see the module docstring).
    """

    name: str = "model_parallel"
    split: Split = "auto"

    min_gpus: ClassVar[int] = 2
    data_parallel: ClassVar[bool] = False
    loss_scaling: ClassVar[bool] = True
    no_jit: ClassVar[str] = ("its step runs each part of the model on its own device, and an XLA cluster runs on one "
                             "device")

    def describe_batch_norm(self) -> str:
        if self.split == "two_tower":
            return "each tower is its own model: batch statistics of the global batch, its own moving statistics"
        return self.batch_norm  # one copy of each layer sees the whole global batch, as on one device

    def resolved_split(self, model: Model) -> str:
        """`auto` -> `width` for an all-Dense model (the MLP), `stages` for the others."""
        if self.split == "auto":
            return "width" if model.dense_only else "stages"
        return self.split

    def check_task(self, spec: Spec) -> None:
        """Every split cuts (or copies) a model of one input tensor; named features (a recommender's) are not."""
        if spec.features:
            raise ConfigError(
                f"strategy=model_parallel splits a model of one input (images or token ids: Dense layers by width, a "
                f"chain of layers into stages, or two towers); the data gives {spec}: named features, whose "
                "embedding tables the data-parallel strategies keep sparse (single, mirrored, replicated, "
                "parameter_server, sharded_update, multi_worker)"
            )

    def check(self, gpus: int, model: Model, jit_compile: bool) -> None:
        """The split must suit the model and the number of devices."""
        super().check(gpus, model, jit_compile)
        split = self.resolved_split(model)
        named = split if split == self.split else f"auto (= {split} for model={model.name})"
        if split == "width" and not model.dense_only:
            raise ConfigError(
                f"strategy.split=width is not allowed with model={model.name}: width splits Dense layers and "
                f"model={model.name} has other layers with weights; choose one of: auto, stages, two_tower"
            )
        layers = model.layers_with_weights()
        if split == "stages" and layers is not None and gpus > layers:
            others = "width, two_tower" if model.dense_only else "two_tower"
            raise ConfigError(
                f"strategy.split={named} with gpus={gpus} needs at least {gpus} layers with weights, "
                f"model={model.name} has {layers}; use gpus from 2 to {layers}, or strategy.split: {others}"
            )

    def build(self, devices: Devices, training: Training) -> SplitModel:
        return SplitModel(self.resolved_split(training.model), devices, training)


def _concat(tensors: list[tf.Tensor]) -> tf.Tensor:
    """Gather partial activations (b, u_0), ..., (b, u_N-1) -> (b, sum u); a single input passes through."""
    return tensors[0] if len(tensors) == 1 else tf.concat(tensors, axis=-1)


@dataclass
class Cell:
    """One piece of the network on one device: merge its inputs, then run its layers in order.

    Attributes:
        name: name scope of its variables and ops (`stage1`, `part0`, `tower1`, ...).
        device: where its variables, forward ops and gradient ops live.
        layers: Keras layers (or whole models) owned by this cell, built under `device`.
        inputs: indices of the earlier cells whose outputs it reads; INPUT is the image batch.
        merge: how several inputs become one tensor (concat for width's gathers, sum for two_tower's logits).
        owned: the trainable variables it updates (`owned_variables`), with `optimizer`.
        label: what `describe` lists for it (default: its layers' names).
    """

    name: str
    device: str
    layers: list
    inputs: tuple[int, ...]
    merge: Callable[[list[tf.Tensor]], tf.Tensor] = _concat
    optimizer: Any = field(default=None, repr=False)
    owned: list = field(default_factory=list, repr=False)
    label: str = ""

    def __call__(self, ins: list[tf.Tensor], training: bool) -> tf.Tensor:
        h = self.merge(ins)  # copies from the other devices land here, under the caller's tf.device(self.device)
        for layer in self.layers:
            h = layer(h, training=training)
        return h

    @property
    def trainable_variables(self) -> list:
        return [v for layer in self.layers for v in layer.trainable_variables]

    @property
    def variables(self) -> list:
        return [v for layer in self.layers for v in layer.variables]


def _clone(layer: keras.layers.Layer, input_shape: tuple, weights: list[np.ndarray] | None = None, **overrides):
    """A fresh copy of `layer` (config updated by `overrides`), built for `input_shape` under the caller's device.

    The copy keeps the layer's name, so its variables are `<cell>/<layer>/kernel` under the caller's name scope.

    `weights` (default: all of the layer's variables, including a Dropout's seed-generator state, so the clone
    draws the same dropout masks as the original would) are copied in.
    """
    clone = layer.__class__.from_config({**layer.get_config(), **overrides})
    clone.build(input_shape)
    values = [v.numpy() for v in layer.variables] if weights is None else weights
    for var, value in zip(clone.variables, values, strict=True):
        var.assign(value)
    return clone


def _shapes(model: keras.Model) -> list[tuple]:
    """Input shape of every layer of a Sequential model, then the output shape: len(model.layers) + 1 entries."""
    shapes = [(None, *model.input_shape[1:])]
    for layer in model.layers:
        shapes.append(tuple(layer.compute_output_shape(shapes[-1])))
    return shapes


def _has_weights(layer: keras.layers.Layer | keras.Operation) -> bool:
    return bool(getattr(layer, "trainable_weights", None))  # an op of a functional graph (`x + h`) has none


def _groups(model: keras.Model) -> list[list[int]]:
    """Layer indices grouped around the weighted layers: a group starts at each weighted layer; unweighted layers
    (pool, dropout, flatten) join the group before them, or the first group if they lead."""
    groups: list[list[int]] = [[]]
    for i, layer in enumerate(model.layers):
        if _has_weights(layer) and any(_has_weights(model.layers[j]) for j in groups[-1]):
            groups.append([])
        groups[-1].append(i)
    return groups


@dataclass
class Segment:
    """The graph's nodes between two cut tensors (`begin` in, `end` out), in order, and their multiply-adds."""

    begin: Any
    end: Any
    nodes: list
    cost: float

    @property
    def weighted(self) -> bool:
        return any(_has_weights(n.operation) for n in self.nodes)


def segments(model: keras.Model) -> list[Segment]:
    """A one-input, one-output model (Sequential or functional) as a chain of segments cut where a single tensor
    carries everything onward: between a Sequential's layers, and on a residual network's stream between its
    blocks (a block's skip connection keeps two tensors alive inside it, so no cut falls there).

    A segment's cost is its weighted layers' parameters x output positions (a conv's kernel times its output
    pixels, a Dense's kernel per row): compute, not parameter count, sets how long a stage takes.
    """
    graph = keras.Model(model.inputs, model.outputs)  # a functional view (a Sequential's graph too)
    if len(graph.inputs) != 1 or len(graph.outputs) != 1:
        raise ConfigError(f"strategy.split=stages cuts a model with one input and one output; {model.name} has "
                          f"{len(graph.inputs)} and {len(graph.outputs)}; use strategy.split=two_tower")
    # Keras keeps a functional graph's nodes by depth from the outputs (its one record of their order)
    nodes = [n for depth in sorted(graph._nodes_by_depth, reverse=True) for n in graph._nodes_by_depth[depth]]
    last_use = {id(t): i for i, n in enumerate(nodes) for t in n.input_tensors}
    out, begin, live, chain = graph.outputs[0], graph.inputs[0], {}, []
    pending: list = []
    for i, node in enumerate(nodes[1:], start=1):  # nodes[0]: the input
        pending.append(node)
        live.update({id(t): t for t in node.outputs})
        live = {k: t for k, t in live.items() if last_use.get(k, -1) > i or t is out}
        if len(live) == 1:  # everything onward reads this one tensor: a cut
            (end,) = live.values()
            chain.append(Segment(begin, end, pending, sum(_cost(n) for n in pending)))
            begin, pending = end, []
    return chain


def _cost(node: Any) -> float:
    """Multiply-adds per example of one node: its layer's parameters x its output positions (0 without weights)."""
    layer = node.operation
    if isinstance(layer, keras.layers.Embedding) and "int" in node.input_tensors[0].dtype:
        return 0.0  # a lookup of rows (a tied embedding's second use, as the output layer, is a matmul)
    return layer.count_params() * float(np.prod(node.outputs[0].shape[1:-1])) if _has_weights(layer) else 0.0


def _stage_cuts(costs: list[float], n: int) -> tuple[int, ...]:
    """First index of each of stages 1..n-1: n contiguous non-empty runs of `costs` minimising the largest run sum.

    A small dynamic programme over (start, stages left): O(len(costs)^2 * n), exact.
    """
    @functools.cache
    def best(start: int, k: int) -> tuple[float, tuple[int, ...]]:
        if k == 1:
            return sum(costs[start:]), ()
        options = []
        for cut in range(start + 1, len(costs) - k + 2):  # leave at least one entry for each later stage
            rest, cuts = best(cut, k - 1)
            options.append((max(sum(costs[start:cut]), rest), (cut, *cuts)))
        return min(options)

    return best(0, n)[1]


def stage_cells(model: keras.Model, devices: tuple[str, ...]) -> list[Cell]:
    """`stages`: consecutive segments of the model (see `segments`), stage i on devices[i], weights copied.

    Balanced by multiply-adds per example; cuts fall only before a segment with weights, so every stage has
    weights to train. A layer used in two stages (a language model's token embedding, tied to its output layer) is
    one copy, on the device of the first stage that uses it; the later stage reads it from there, and its gradient
    goes back there to be summed with the first stage's (see `owned_variables`).
    """
    chain = segments(model)
    groups: list[list[Segment]] = [[]]
    for seg in chain:  # a group starts at each weighted segment; unweighted ones join the group before them
        if seg.weighted and any(g.weighted for g in groups[-1]):
            groups.append([])
        groups[-1].append(seg)
    if len(groups) < len(devices):
        raise ConfigError(
            f"split=stages needs at least {len(devices)} layers with weights, {model.name} has {len(groups)} "
            "where a cut can fall (between blocks, not inside a skip connection)"
        )
    bounds = (0, *_stage_cuts([sum(seg.cost for seg in g) for g in groups], len(devices)), len(groups))
    clones: dict[int, keras.layers.Layer] = {}  # original layer id -> its one copy
    cells = []
    for s, (a, b) in enumerate(zip(bounds, bounds[1:])):
        stage = keras.Model(groups[a][0].begin, groups[b - 1][-1].end, name=f"stage{s}")
        with tf.device(devices[s]), keras.name_scope(f"stage{s}"):
            copy = keras.models.clone_model(stage, clone_function=functools.partial(_copy_once, clones))
        for original, clone in zip(stage.variables, copy.variables, strict=True):
            clone.assign(original)  # the reference weights (a Dropout's seed state too: the same masks)
        cells.append(Cell(f"stage{s}", devices[s], [copy], (INPUT if s == 0 else s - 1,), label=_names(copy, cells)))
    return cells


def _names(stage: keras.Model, earlier: list[Cell]) -> str:
    """A stage's layers by name; one an earlier stage holds (a tied embedding) says so."""
    held = {id(layer) for cell in earlier for model in cell.layers for layer in model.layers}
    return ", ".join(f"{layer.name} (tied: {earlier[0].name}'s copy)" if id(layer) in held else layer.name
                     for layer in stage.layers if not isinstance(layer, keras.layers.InputLayer))


def _copy_once(clones: dict[int, Any], layer: keras.layers.Layer) -> keras.layers.Layer:
    """A fresh copy of `layer` (same config and name), made once: a layer used in two stages is one copy."""
    if id(layer) not in clones:
        clones[id(layer)] = layer.__class__.from_config(layer.get_config())
    return clones[id(layer)]


def width_cells(model: keras.Model, devices: tuple[str, ...]) -> list[Cell]:
    """`width`: each hidden Dense layer's units split over the devices, weights sliced from `model`.

    The output layer stays whole on devices[0]: its 10 units would split unevenly over 4 devices, its cost
    (hidden x 10) is tiny next to a hidden layer's (hidden x hidden), and keeping it whole saves a sync point: the
    last hidden layer is gathered only onto devices[0] and the logits are born where the loss is computed.
    """
    groups, shapes = _groups(model), _shapes(model)
    kinds_ok = all(isinstance(layer, (keras.layers.Dense, keras.layers.Flatten)) for layer in model.layers)
    if not kinds_ok or not all(isinstance(model.layers[g[-1]], keras.layers.Dense) for g in groups):
        raise ConfigError(
            f"split=width needs Flatten and Dense layers only, each Flatten before a Dense; {model.name} has others"
        )
    cells: list[Cell] = []
    prev: tuple[int, ...] = (INPUT,)
    for g, idx in enumerate(groups):
        dense = model.layers[idx[-1]]  # each group: optional Flatten, then its Dense
        last = g == len(groups) - 1
        parts = [np.arange(dense.units)] if last else np.array_split(np.arange(dense.units), len(devices))
        layer_cells = []
        for p, cols in enumerate(parts):
            with tf.device(devices[p]), keras.name_scope(f"part{p}"):
                layers = [_clone(model.layers[i], shapes[i]) for i in idx[:-1]]  # Flatten: stateless
                weights = [v.numpy()[..., cols] for v in dense.variables]  # kernel (in, u), bias (u,): units last
                layers.append(_clone(dense, shapes[idx[-1]], weights, units=len(cols)))
            layer_cells.append(Cell(f"part{p}", devices[p], layers, prev))
        prev = tuple(range(len(cells), len(cells) + len(layer_cells)))
        cells += layer_cells
    return cells


def tower_cells(model_fn: Callable[[int], Any], seed: int, devices: tuple[str, ...]) -> list[Cell]:
    """`two_tower`: a full model per device (copy i seeded with seed + i), logits summed on devices[0]."""
    cells = []
    for i, device in enumerate(devices):
        with tf.device(device), keras.name_scope(f"tower{i}"):
            cells.append(Cell(f"tower{i}", device, [model_fn(seed + i)], (INPUT,)))
    return cells + [Cell("sum", devices[0], [], tuple(range(len(devices))), merge=tf.add_n)]


def forward(cells: list[Cell], x: tf.Tensor, training: bool, tapes: list | None = None) -> list[tf.Tensor]:
    """Every cell's output, each computed under its device; with `tapes`, each cell's tape is recorded.

    Args:
        cells: the network in topological order; the last cell's output is the logits (b, 10).
        x: images (b, H, W, C).
        training: passed to the layers (Dropout).
        tapes: a list to append each cell's (GradientTape, watched inputs) to, for `backward_and_apply`. Only
            inputs made by other cells are watched: no gradient is computed for the images.
    """
    outs: list[tf.Tensor] = []
    for cell in cells:
        ins = [x if i == INPUT else outs[i] for i in cell.inputs]
        with tf.device(cell.device), tf.name_scope(cell.name):
            if tapes is None:
                outs.append(cell(ins, training))
                continue
            watched = [outs[i] for i in cell.inputs if i != INPUT]
            with tf.GradientTape() as tape:
                tape.watch(watched)
                outs.append(cell(ins, training))
            tapes.append((tape, watched))
    return outs


def owned_variables(cells: list[Cell]) -> list[list]:
    """Each cell's trainable variables that no earlier cell holds: a variable read by several cells (a tied
    embedding) is updated once, by the first, where it lives."""
    seen: set[int] = set()
    owned = []
    for cell in cells:
        owned.append([v for v in cell.trainable_variables if id(v) not in seen])
        seen.update(id(v) for v in owned[-1])
    return owned


def _total(gradients: list) -> Any:
    """One variable's gradient from the cells that read it: a tied embedding's sparse rows from the lookup plus
    the output layer's dense (vocabulary, channels) matrix, added into that dense matrix (it is one either way)."""
    gradients = [g for g in gradients if g is not None]
    if len(gradients) == 1:
        return gradients[0]
    return tf.add_n([tf.convert_to_tensor(g) for g in gradients])


def backward_and_apply(cells: list[Cell], tapes: list, outs: list[tf.Tensor], d_logits: tf.Tensor,
                       scale: LossScale | NoLossScale, clip_norm: float | None = None) -> None:
    """Backpropagate `d_logits` (b, ..., classes) through the cells in reverse, each on its own device, and update
    them.

    A cell's gradients are final once the last cell reading its variables has run its tape, so without loss scaling
    the graph runs its update as soon as they exist. Under mixed_float16 every update waits for one decision on all
    the cells' gradients, so no cell applies a step another skips.
    """
    upstream: list[list[tf.Tensor]] = [[] for _ in cells]
    upstream[-1].append(d_logits)
    gradients: dict[int, list] = {}  # variable id -> its gradients from every cell that reads it
    for k in reversed(range(len(cells))):
        cell, (tape, watched) = cells[k], tapes[k]
        variables = cell.trainable_variables
        with tf.device(cell.device), tf.name_scope(f"{cell.name}_backward"):
            d_out = tf.add_n(upstream[k])  # consumers' contributions, reduced here: width's reduce-scatter
            d_vars, d_ins = tape.gradient(outs[k], [variables, watched], output_gradients=d_out)
        for v, g in zip(variables, d_vars, strict=True):
            gradients.setdefault(id(v), []).append(g)
        for i, d_in in zip([i for i in cell.inputs if i != INPUT], d_ins, strict=True):
            upstream[i].append(d_in)
    updates: list[tuple[Cell, list[tf.Tensor]]] = []
    for cell in reversed(cells):
        if cell.owned:
            with tf.device(cell.device), tf.name_scope(f"{cell.name}_backward"):
                updates.append((cell, [_total(gradients[id(v)]) for v in cell.owned]))

    def apply(grads: list[list[tf.Tensor]]) -> None:
        # clipping needs every cell's gradients (their global norm): with it, no update starts before the last one
        for (cell, _), mine in zip(updates, grads):
            with tf.device(cell.device), tf.name_scope(f"{cell.name}_backward"):
                cell.optimizer.apply_gradients(zip(mine, cell.owned))

    update(scale, [d_vars for _, d_vars in updates], clip_norm, apply)


class SplitModel(Built, Strategy):
    """The model cut into cells placed on the devices (see the module docstring); one batch per step."""

    def __init__(self, split: str, devices: Devices, training: Training):
        self.split, self.devices, self.training = split, devices, training
        self.cells = self._build_cells(devices.names)
        found = [t for cell in self.cells for layer in cell.layers for t in tables(layer)]  # embedding tables
        for cell, owned in zip(self.cells, owned_variables(self.cells), strict=True):
            cell.owned = owned
            if owned:
                with tf.device(cell.device), keras.name_scope(cell.name):
                    cell.optimizer = training.optimizer_fn(owned, found)
        # Evaluation runs through the same placed cells; only its loss and accuracy sums are on device 0.
        self._share(self, devices.names[0])

    def _build_cells(self, names: tuple[str, ...]) -> list[Cell]:
        if self.split == "two_tower":
            return tower_cells(self.training.model_fn, self.training.seed, names)
        # The single strategy's model and initial weights, built once and cut up; only the copies are kept.
        with tf.device(names[0]):
            reference = self.training.model_fn(self.training.seed)
        return (width_cells if self.split == "width" else stage_cells)(reference, names)

    def __call__(self, x: tf.Tensor, training: bool = False) -> tf.Tensor:
        """Logits (b, classes) for images (b, H, W, C) through the placed cells (what `evaluate` calls)."""
        return forward(self.cells, x, training)[-1]

    def batches(self, pipeline: Any, examples: Any, seed: int) -> Any:
        """One tower: the whole global batch, fed on the first device (the model, not the batch, is split)."""
        return pipeline.towers(examples, self.training.global_batch, [self.devices.names[0]], seed)

    def step(self, batches: Any):
        """fn() -> the loss of one optimizer step through the placed cells.

        No XLA (config validation refuses train.jit_compile here): an XLA cluster runs on one device.
        """
        cells = self.cells

        def step() -> tf.Tensor:
            ((x, y),) = batches.next()  # (G, H, W, C), (G,)
            tapes: list = []
            outs = forward(cells, x, training=True, tapes=tapes)
            with tf.device(cells[-1].device), tf.name_scope("loss"):  # where the logits (G, 10) already are
                with tf.GradientTape() as tape:
                    tape.watch(outs[-1])
                    logits = tf.cast(outs[-1], tf.float32)  # the loss in float32 under train.precision=mixed_bfloat16
                    loss = tf.reduce_mean(self.training.spec.task.loss(y, logits))
                    scaled = self.loss_scale.scaled(loss)  # recorded on the tape
                d_logits = tape.gradient(scaled, outs[-1])  # (G, 10)
            backward_and_apply(cells, tapes, outs, d_logits, self.loss_scale, self.training.clip_norm)
            return loss

        return step

    def describe(self) -> dict[str, str]:
        """The split and which layers each device holds (for tags)."""
        where = "; ".join(
            f"{c.name}@{c.device}: {c.label or ', '.join(layer.name for layer in c.layers) or 'sum of logits'}"
            for c in self.cells
        )
        return {"placement": f"model_parallel split={self.split}: {where}", "strategy.split": self.split}

    def checkpoint_objects(self) -> dict[str, Any]:
        """What a checkpoint saves: every cell's variables (dropout seed states included) and optimizer."""
        objects = {c.name: c.variables for c in self.cells}
        objects.update(loss_scale.checkpointed(self.loss_scale))
        return {**objects, **{f"{c.name}_optimizer": c.optimizer for c in self.cells if c.optimizer is not None}}

    def moving_statistics(self) -> list[list[Any]]:
        """Each layer's moving-state variables: one copy each (two_tower's towers are different models)."""
        return [copies for c in self.cells for layer in c.layers for copies in copies_of_moving_state([layer])]

    def weights(self) -> list:
        """The trained weights of every cell, in cell order (a tied one once)."""
        return [v for c in self.cells for v in c.owned]

    def variable_devices(self) -> dict[str, str]:
        """Variable path -> the device it lives on, for every variable of every cell (trainable or not)."""
        return {v.path: v.value.device for c in self.cells for v in c.variables}
