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

`width` and `stages` start from the run's model's weights, so they train `single`'s losses (up to summation order).

Placement: the network is rebuilt as *cells*, pieces of the model each with its variables on one device
(`keras.distribution` does nothing on the TensorFlow backend). Each cell runs forward under its device in its own
GradientTape, and backward under the same device with the upstream gradient, so every gradient op sits beside its
forward op (one tape would put the whole backward pass on one device). Each cell has its own optimizer, built under
its device, so its slots live beside the variables they update.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, ClassVar, Literal

import numpy as np

from runner.errors import ConfigError
from runner.lazy import keras, tf
from runner.strategies import STRATEGIES, StrategyBase, Training
from runner.strategies.common import Built, copies_of_moving_state, tables, update

if TYPE_CHECKING:
    from runner.data_pipelines import Spec
    from runner.models import Model
    from runner.runtime.devices import Devices
    from runner.strategies.loss_scale import LossScale, NoLossScale

INPUT = -1  # Cell.inputs index meaning "the image batch"
Split = Literal["auto", "width", "stages", "two_tower"]


@STRATEGIES.register
@dataclass
class ModelParallel(StrategyBase):
    """One model split across the devices, fed the whole global batch each step (model, not data, parallelism)."""

    name: str = "model_parallel"
    split: Split = "auto"  # width: each Dense across devices; stages: consecutive blocks; two_tower: N copies

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
        return ("width" if model.dense_only else "stages") if self.split == "auto" else self.split

    def check_task(self, spec: Spec) -> None:
        if spec.features:
            raise ConfigError(
                f"strategy=model_parallel splits a model of one input (images or token ids: Dense layers by width, a "
                f"chain of layers into stages, or two towers); the data gives {spec}: named features, whose "
                "embedding tables the data-parallel strategies keep sparse (single, mirrored, replicated, "
                "parameter_server, sharded_update, multi_worker)"
            )

    def check(self, gpus: int, model: Model, jit_compile: bool) -> None:
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
    """One piece of the network on one device (`name`: its name scope): merge its inputs (`inputs`: earlier cells'
    indices, INPUT the batch; `merge`: concat for width's gathers, sum for two_tower's logits), then run its layers
    (Keras layers or whole models, built under `device`). `owned`: the trainable variables its `optimizer` updates
    (`owned_variables`); `label`: what `describe` lists (default: its layers' names)."""

    name: str
    device: str
    layers: list
    inputs: tuple[int, ...]
    merge: Callable[[list[tf.Tensor]], tf.Tensor] = _concat
    optimizer: Any = field(default=None, repr=False)
    owned: list = field(default_factory=list, repr=False)
    label: str = ""

    def __call__(self, ins: list[tf.Tensor], training: bool) -> tf.Tensor:
        h = self.merge(ins)  # under the caller's tf.device(self.device): the other devices' outputs copied here
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
    """A fresh copy of `layer` (same name, config updated by `overrides`) built for `input_shape` under the caller's
    device, given `weights` (default: all the layer's variables, a Dropout's seed state too: the same masks)."""
    clone = layer.__class__.from_config({**layer.get_config(), **overrides})
    clone.build(input_shape)
    values = [v.numpy() for v in layer.variables] if weights is None else weights
    for var, value in zip(clone.variables, values, strict=True):
        var.assign(value)
    return clone


def _has_weights(layer: keras.layers.Layer | keras.Operation) -> bool:
    return bool(getattr(layer, "trainable_weights", None))  # an op of a functional graph (`x + h`) has none


def _grouped(items: Any, weighted: Callable[[Any], bool]) -> list[list[Any]]:
    """`items` grouped around the weighted ones: a group starts at each weighted item; unweighted ones (pool,
    dropout, flatten) join the group before them, or the first group if they lead."""
    groups: list[list[Any]] = [[]]
    for item in items:
        if weighted(item) and any(weighted(i) for i in groups[-1]):
            groups.append([])
        groups[-1].append(item)
    return groups


@dataclass
class Segment:
    """The graph's nodes between two cut tensors (`begin` in, `end` out), in order, and their multiply-adds."""

    begin: Any
    end: Any
    nodes: list
    cost: float


def segments(model: keras.Model) -> list[Segment]:
    """A one-input, one-output model as a chain of segments cut where a single tensor carries everything onward
    (between a Sequential's layers, between a residual network's blocks, never inside a skip connection). A
    segment's cost is its multiply-adds (`_cost`): compute, not parameter count, sets how long a stage takes."""
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
    """First index of each of stages 1..n-1: n contiguous non-empty runs of `costs` minimising the largest run sum
    (an exact dynamic programme over (start, stages left))."""
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
    """`stages`: consecutive segments of the model (`segments`), stage i on devices[i], weights copied, balanced by
    multiply-adds; cuts fall only before a segment with weights, so every stage trains some. A layer used in two
    stages (a tied token embedding) is one copy, on the first stage's device (`owned_variables`)."""
    groups = _grouped(segments(model), lambda seg: any(_has_weights(n.operation) for n in seg.nodes))
    if len(groups) < len(devices):
        raise ConfigError(
            f"split=stages needs at least {len(devices)} layers with weights, {model.name} has {len(groups)} "
            "where a cut can fall (between blocks, not inside a skip connection)"
        )
    bounds = (0, *_stage_cuts([sum(seg.cost for seg in g) for g in groups], len(devices)), len(groups))
    clones: dict[int, keras.layers.Layer] = {}  # original layer id -> its one copy

    def copy_once(layer: keras.layers.Layer) -> keras.layers.Layer:  # a layer used in two stages is one copy
        if id(layer) not in clones:
            clones[id(layer)] = layer.__class__.from_config(layer.get_config())  # same config and name
        return clones[id(layer)]

    cells = []
    for s, (a, b) in enumerate(zip(bounds, bounds[1:])):
        stage = keras.Model(groups[a][0].begin, groups[b - 1][-1].end, name=f"stage{s}")
        with tf.device(devices[s]), keras.name_scope(f"stage{s}"):
            copy = keras.models.clone_model(stage, clone_function=copy_once)
        for original, clone in zip(stage.variables, copy.variables, strict=True):
            clone.assign(original)  # the reference weights (a Dropout's seed state too: the same masks)
        cells.append(Cell(f"stage{s}", devices[s], [copy], (INPUT if s == 0 else s - 1,), label=_names(copy, cells)))
    return cells


def _names(stage: keras.Model, earlier: list[Cell]) -> str:
    """A stage's layers by name; one an earlier stage holds (a tied embedding) says so."""
    held = {id(layer) for cell in earlier for model in cell.layers for layer in model.layers}
    return ", ".join(f"{layer.name} (tied: {earlier[0].name}'s copy)" if id(layer) in held else layer.name
                     for layer in stage.layers if not isinstance(layer, keras.layers.InputLayer))


def width_cells(model: keras.Model, devices: tuple[str, ...]) -> list[Cell]:
    """`width`: each hidden Dense layer's units split over the devices, weights sliced from `model`. The output layer
    stays whole on devices[0], where the loss is computed: it costs little, and a split would add a sync point."""
    groups = _grouped(range(len(model.layers)), lambda i: _has_weights(model.layers[i]))
    shapes = [(None, *model.input_shape[1:])]  # every layer's input shape (a Sequential's), then the output's
    for layer in model.layers:
        shapes.append(tuple(layer.compute_output_shape(shapes[-1])))
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
    """Every cell's output (`cells` in topological order: the last one's is the logits), each computed under its
    device; with `tapes`, each cell's (GradientTape, watched inputs from other cells) appended to it."""
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


def backward_and_apply(cells: list[Cell], tapes: list, outs: list[tf.Tensor], d_logits: tf.Tensor,
                       scale: LossScale | NoLossScale, clip_norm: float | None = None) -> None:
    """Backpropagate `d_logits` (b, ..., classes) through the cells in reverse, each on its own device, and update
    them (`common.update`: one decision on every cell's gradients)."""
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
    owners = [cell for cell in reversed(cells) if cell.owned]
    totals = []
    for cell in owners:
        with tf.device(cell.device), tf.name_scope(f"{cell.name}_backward"):
            # a variable read by several cells (a tied embedding: sparse rows from the lookup, the output layer's
            # dense matrix) gets their gradients added into one dense matrix
            found = [[g for g in gradients[id(v)] if g is not None] for v in cell.owned]
            totals.append([g[0] if len(g) == 1 else tf.add_n([tf.convert_to_tensor(t) for t in g]) for g in found])

    def apply(grads: list[list[tf.Tensor]]) -> None:
        for cell, mine in zip(owners, grads):
            with tf.device(cell.device), tf.name_scope(f"{cell.name}_backward"):
                cell.optimizer.apply_gradients(zip(mine, cell.owned))

    update(scale, totals, clip_norm, apply)


class SplitModel(Built):
    """The model cut into cells placed on the devices (see the module docstring); one batch per step."""

    def __init__(self, split: str, devices: Devices, training: Training):
        self.split, self.devices, self.training, self.tower_devices = split, devices, training, [devices.names[0]]
        if split == "two_tower":
            self.cells = tower_cells(training.model_fn, training.seed, devices.names)
        else:
            with tf.device(devices.names[0]):
                reference = training.model_fn(training.seed)
            self.cells = (width_cells if split == "width" else stage_cells)(reference, devices.names)
        found = [t for cell in self.cells for layer in cell.layers for t in tables(layer)]  # embedding tables
        for cell, owned in zip(self.cells, owned_variables(self.cells), strict=True):
            cell.owned = owned
            if owned:
                with tf.device(cell.device), keras.name_scope(cell.name):
                    cell.optimizer = training.optimizer_fn(owned, found)
        self._share(self, devices.names[0])

    def __call__(self, x: tf.Tensor, training: bool = False) -> tf.Tensor:
        """Logits through the placed cells (what `evaluate` calls)."""
        return forward(self.cells, x, training)[-1]

    def step(self, batches: Any):
        """fn() -> the loss of one optimizer step through the placed cells (no XLA: a cluster runs on one device)."""
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
        where = "; ".join(
            f"{c.name}@{c.device}: {c.label or ', '.join(layer.name for layer in c.layers) or 'sum of logits'}"
            for c in self.cells
        )
        return {"placement": f"model_parallel split={self.split}: {where}", "strategy.split": self.split}

    def _kept(self) -> dict[str, Any]:
        return {**{c.name: c.variables for c in self.cells},
                **{f"{c.name}_optimizer": c.optimizer for c in self.cells if c.optimizer is not None}}

    def moving_statistics(self) -> list[list[Any]]:  # one copy each (two_tower's towers are different models)
        return [copies for c in self.cells for layer in c.layers for copies in copies_of_moving_state([layer])]

    def weights(self) -> list:
        """The trained weights of every cell, in cell order (a tied one once)."""
        return [v for c in self.cells for v in c.owned]

    def variable_devices(self) -> dict[str, str]:
        return {v.path: v.value.device for c in self.cells for v in c.variables}
