"""Pieces every strategy uses: building the model and optimizer, the loss, evaluation, the compiled step loop."""

from __future__ import annotations

import reprlib
from typing import TYPE_CHECKING, Any, Callable, Iterator

import numpy as np

from runner.errors import ConfigError
from runner.lazy import keras, tf
from runner.models import check_lookups, spec_arguments
from runner.strategies import Strategy, loss_scale
from runner.tasks import AUC, auc

if TYPE_CHECKING:
    from runner.data_pipelines import Spec
    from runner.models import Model
    from runner.tasks import Task


def build_model(model: Model, spec: Spec, seed: int, fused_batch_norm: bool = True) -> keras.Model:
    """Build `model` for `spec` with seeded initial weights (the same for every strategy and copy), its batch
    normalization on the fused kernel unless `fused_batch_norm` is false (train.fused_batch_norm).

    Raises:
        ConfigError: the build gave no Keras model, or one without trainable weights, or one that does not map the
            data's inputs to its outputs, or one with an embedding smaller than the data's ids
            (`runner.models.check_lookups`).
    """
    keras.utils.set_random_seed(seed)
    try:
        built = model.build(spec)
    except (ValueError, TypeError) as e:  # keras.applications' refusals ("Input size must be at least 32x32; ...")
        raise ConfigError(f"model={model.name} cannot be built for {spec}: {str(e).splitlines()[0]}") from None
    except Exception as e:  # a bug in a user's function (a NameError): where, in one line (RUNNER_TRACEBACK=1: all)
        raise ConfigError(f"model={model.name}: {_builder(model)} raised {type(e).__name__}: "
                          f"{(str(e).splitlines() or [''])[0]}{_where(e)}") from None
    if not isinstance(built, keras.Model):
        raise ConfigError(f"model={model.name}: {_builder(model)} returned {reprlib.repr(built)} (a "
                          f"{type(built).__name__}), not a keras.Model; it must return one mapping "
                          "(batch, *input_shape) images to (batch, classes) logits")
    if not getattr(built, "inputs", None):  # subclassed, or a Sequential without one: nothing to check the data by
        raise ConfigError(f"model={model.name}: {_builder(model)} returned a {type(built).__name__} without a "
                          f"keras.Input; build it from keras.Input{'s named as the features' if spec.features else ''} "
                          f"of the data ({spec}), as a functional or Sequential model")
    if not built.trainable_weights:  # every strategy's update would fail on an empty list of gradients
        raise ConfigError(f"model={model.name}: {_builder(model)} returned a model without trainable weights "
                          f"({len(built.weights)} weights, none trainable): there is nothing to train")
    if spec.features:
        _check_features(model.name, built, spec)
    else:
        inputs, outputs = tuple(built.input_shape[1:]), tuple(built.output_shape[1:])
        if inputs != tuple(spec.shape) or outputs != spec.outputs_shape:
            raise ConfigError(
                f"model={model.name} maps {inputs} inputs to {outputs} outputs, the data gives {spec} (outputs "
                f"{spec.outputs_shape}); build it from the arguments the runner passes to a model function "
                f"({', '.join(spec_arguments(lambda **kw: None, spec))})"
            )
        dtype = str(getattr(built.inputs[0], "dtype", "float32"))
        if spec.token_ids != ("int" in dtype):
            raise ConfigError(f"model={model.name} takes {dtype} inputs, the data gives {spec}; "
                              f"{'an integer Input for token ids' if spec.token_ids else 'a float Input for images'}")
    check_lookups(model.name, built, spec)
    return _kernels(built, fused_batch_norm)


def _kernels(built: keras.Model, fused: bool) -> keras.Model:
    """The model's layers on the faster kernels that compute the same: row lookups, the fused batch norm."""
    read_rows_only(built)
    return fused_batch_norm(built) if fused else built


def _check_features(name: str, built: keras.Model, spec: Spec) -> None:
    """A model of named features (`Spec.features`) has one Input per feature, named as it, of its shape and dtype,
    and one logit per example (a binary label) or one per class."""
    inputs = {t.name: t for t in built.inputs}
    want = {f.name: f for f in spec.features}
    if set(inputs) != set(want):
        raise ConfigError(f"model={name} takes inputs named {sorted(inputs)}, the data gives {spec} (inputs "
                          f"{sorted(want)}); name each keras.Input as the feature it takes")
    for feature in spec.features:
        got = inputs[feature.name]
        if tuple(got.shape[1:]) != feature.shape or ("int" in str(got.dtype)) != (feature.dtype == "int32"):
            raise ConfigError(f"model={name}'s input {feature.name} is {tuple(got.shape[1:])} {got.dtype}, the data "
                              f"gives {feature}")
    if tuple(built.output_shape[1:]) != spec.outputs_shape:
        raise ConfigError(f"model={name} gives {tuple(built.output_shape[1:])} outputs per example, the data needs "
                          f"{spec.outputs_shape} ({spec})")


def _where(e: BaseException) -> str:
    """` at file:line` of the innermost frame of `e`'s traceback outside the runner and installed packages (a user's
    code), or ''."""
    import traceback
    from pathlib import Path

    ours = str(Path(__file__).parents[1])  # the runner's package
    theirs = [f for f in traceback.extract_tb(e.__traceback__)
              if not f.filename.startswith(ours) and "-packages" not in f.filename and not f.filename.startswith("<")]
    return f" at {theirs[-1].filename}:{theirs[-1].lineno}" if theirs else ""


def _builder(model: Model) -> str:
    """What builds `model`, as its config names it: a user's function (`_target_`), else its class's `build`."""
    target = getattr(model, "target", None)
    return f"_target_ {target}" if target else f"{type(model).__module__}.{type(model).__qualname__}.build"


def tower_models(model: Model, spec: Spec, seed: int, devices: list[str],
                 fused_batch_norm: bool = True) -> list[keras.Model]:
    """One copy of `model` per device (`placed_copies` of `build_model`)."""
    return placed_copies(lambda s: build_model(model, spec, s, fused_batch_norm), seed, devices)


def placed_copies(model_fn: Callable[[int], keras.Model], seed: int, devices: list[str]) -> list[keras.Model]:
    """`model_fn(seed)` once per device, each built (its variables placed) on that device: the same initial weights
    on every device. The later copies' variables start from the first's values, copied rather than drawn again
    (tf.variable_creator_scope, as tf.distribute's mirrored variables): a 2 M-row embedding table's initializer takes
    a second on a CPU, its copy a tenth of that."""
    copies: list[keras.Model] = []
    first: list[tf.Variable] = []
    for device in devices:
        creator = _copying(iter(first)) if copies else _recording(first)
        with tf.device(device), tf.variable_creator_scope(creator):
            copies.append(model_fn(seed))
    return copies


def _recording(created: list) -> Callable:
    """A variable creator that appends each variable it creates to `created`, in creation order."""
    def creator(next_creator: Callable, **kwargs: Any) -> Any:
        created.append(next_creator(**kwargs))
        return created[-1]
    return creator


def _copying(sources: Iterator) -> Callable:
    """A variable creator whose n-th variable starts from the n-th of `sources` when both have the same name and
    dtype (the same builder and seed create them in the same order); any other starts from its own initializer."""
    def creator(next_creator: Callable, **kwargs: Any) -> Any:
        source = next(sources, None)
        if (source is not None and source.name.rsplit("/", 1)[-1].split(":")[0] == kwargs.get("name")
                and tf.as_dtype(kwargs.get("dtype") or source.dtype) == source.dtype):
            kwargs["initial_value"] = source.read_value  # called by tf.Variable, placed on this copy's device
        return next_creator(**kwargs)
    return creator


def effective_learning_rate(train_cfg: Any, rate: float | None = None) -> float:
    """The learning rate (`rate`, else train.learning_rate) after the batch rule: none, linear (x global/reference)
    or sqrt (x its square root)."""
    ratio = train_cfg.global_batch_size / train_cfg.lr_reference_batch
    factor = {"none": 1.0, "linear": ratio, "sqrt": ratio**0.5}[train_cfg.lr_scaling]
    return (train_cfg.learning_rate if rate is None else rate) * factor


def build_optimizer(train_cfg: Any, variables: list, tables: list = ()) -> Any:
    """The configured optimizer for `variables`, its slots built now (a compiled loop must not create variables).
    `tables`: the model's embedding tables (or the parts a strategy made variables); those among `variables` get
    train.table_optimizer when it is set (an `optimizers.PerPart`), else every variable train.optimizer.

    Raises:
        ConfigError: train.table_optimizer is set and the model has no embedding table.
    """
    from runner import optimizers

    if not train_cfg.table_optimizer:
        return _optimizer(train_cfg, train_cfg.optimizer, train_cfg.learning_rate, variables)
    if not tables:
        raise ConfigError(f"train.table_optimizer={train_cfg.table_optimizer} updates a model's embedding tables "
                          "(plain keras.layers.Embedding layers) and this model has none; set "
                          "train.table_optimizer=null")
    ids = {id(t) for t in tables}
    rest, mine = [v for v in variables if id(v) not in ids], [v for v in variables if id(v) in ids]
    rate = train_cfg.table_learning_rate or train_cfg.learning_rate
    parts = [(_optimizer(train_cfg, name, r, part), part) for name, r, part in (
        (train_cfg.optimizer, train_cfg.learning_rate, rest), (train_cfg.table_optimizer, rate, mine)) if part]
    return parts[0][0] if len(parts) == 1 else optimizers.PerPart(parts)


def _optimizer(train_cfg: Any, name: str, rate: float, variables: list) -> keras.optimizers.Optimizer:
    """Optimizer `name` at `rate` (after the batch rule, warm-up and schedule), built for `variables`. AdamW decays
    only weights of two or more dimensions (matmuls, convolutions, embeddings), as nanoGPT does: not norms' scales,
    not biases."""
    from runner import optimizers

    # a table rate's cosine ends at train.min_learning_rate in the proportion of the two rates
    least = train_cfg.min_learning_rate * (1.0 if rate == train_cfg.learning_rate else rate / train_cfg.learning_rate)
    rate = effective_learning_rate(train_cfg, rate)
    if train_cfg.lr_schedule == "cosine":  # validation guarantees train.steps
        lr = optimizers.cosine(rate, train_cfg.lr_warmup_steps, train_cfg.steps, least)
    else:
        lr = optimizers.WarmUp(rate, train_cfg.lr_warmup_steps) if train_cfg.lr_warmup_steps else rate
    optimizer = optimizers.make(name, lr, train_cfg.fused_optimizer, train_cfg.beta2, train_cfg.weight_decay)
    if name == "adamw":
        optimizer.exclude_from_weight_decay(var_list=[v for v in variables if len(v.shape) < 2])
    optimizer.build(variables)
    return optimizer


def clip(grads: list[tf.Tensor], clip_norm: float | None) -> list[tf.Tensor]:
    """The step's averaged gradients scaled down to `clip_norm` when their global norm is above it (nanoGPT's
    `clip_grad_norm_`); as they are when `clip_norm` is None."""
    if not clip_norm:
        return grads
    # A sparse gradient's repeated rows summed first: its norm is the dense gradient's (optimizers sum them too).
    from runner.optimizers import deduplicated

    grads = [deduplicated(g) if isinstance(g, tf.IndexedSlices) else g for g in grads]
    return tf.clip_by_global_norm(grads, clip_norm)[0]


def update(scale: Any, grads: Any, clip_norm: float | None, apply: Any) -> None:
    """The end of a step, written once: one decision on the whole step's gradients (`grads`, any nest; under
    mixed_float16 a non-finite one skips every update), then the gradients unscaled, clipped and given to
    `apply(grads)` in the same nest: the strategy's own part, which optimizer updates what where."""
    flat = tf.nest.flatten(grads)

    def applied() -> None:
        apply(tf.nest.pack_sequence_as(grads, clip(scale.unscale(flat), clip_norm)))

    scale.apply_if_finite(lambda: loss_scale.all_finite(flat), applied)


def per_example_loss(model: keras.Model, x: tf.Tensor, y: tf.Tensor, training: bool,
                     task: Task) -> tuple[tf.Tensor, tf.Tensor]:
    """The task's loss per example (b,) and the model's outputs, both float32 whatever the compute precision."""
    outputs = tf.cast(model(x, training=training), tf.float32)  # a no-op in float32; keeps the loss out of bfloat16
    return task.loss(y, outputs), outputs


def make_evaluate(model: keras.Model, device: str, spec: Spec):
    """A function dataset -> {"loss", *the task's metrics} over every example, computed on `device`: the means of
    the loss and of what the task sums per batch (`Task.sums`); an AUC exact over the whole set (`tasks.auc`)."""
    task = spec.task
    ranked = AUC in task.metrics  # an AUC needs every example's output, not a sum

    # One trace for every batch size (the last test batch is usually smaller): float32 images, int32 token ids, or a
    # dict of named features, each in its dtype.
    if spec.features:
        inputs = {f.name: tf.TensorSpec((None, *f.shape), f.dtype) for f in spec.features}
    else:
        inputs = tf.TensorSpec((None, *spec.shape), tf.int32 if spec.token_ids else tf.float32)
    labels_spec = tf.TensorSpec((None, *spec.labels_shape), task.labels_dtype)

    @tf.function(input_signature=[inputs, labels_spec])
    def batch_sums(x, y):
        with tf.device(device):
            loss, outputs = per_example_loss(model, x, y, training=False, task=task)
            sums = {"loss": tf.reduce_sum(loss), **task.sums(y, outputs)}
            return sums, tf.cast(tf.shape(y)[0], tf.float32), outputs[:, 0] if ranked else loss

    def evaluate(dataset) -> dict[str, float]:
        totals: dict[str, float] = {}
        count = 0.0
        labels, scores = [], []
        for x, y in dataset:
            sums, n, first = batch_sums(x, y)
            totals = {k: totals.get(k, 0.0) + float(v) for k, v in sums.items()}
            count += float(n)
            if ranked:
                labels.append(y.numpy())
                scores.append(first.numpy())
        out = {k: v / count for k, v in totals.items()}
        return {**out, "auc": auc(np.concatenate(labels), np.concatenate(scores))} if ranked else out

    return evaluate


class Built(Strategy):
    """What every built strategy shares: its `Training`, the step's loss scale and evaluation (`_share`), its towers'
    feed and the compiled loops around its `step`, and the `Strategy` contract's defaults (`check_same_start`): a
    strategy writes how one step runs on its devices, nothing else."""

    training: Any  # runner.strategies.Training
    tower_devices: list[str]  # a batch a step for each, tower i's on tower_devices[i]

    def _share(self, model: Any, device: str, scale_device: str | None = None) -> None:
        """The step's loss scale on `scale_device` (default: `device`; the no-op unless mixed_float16 scales) and
        `evaluate` of `model` on `device`."""
        scaling = self.training.loss_scaling
        self.loss_scale = loss_scale.LossScale(scaling, scale_device or device) if scaling else loss_scale.NoLossScale()
        self.evaluate = make_evaluate(model, device, self.training.spec)

    def step(self, batches: Any) -> Any:
        """fn() -> the mean loss of one synchronous optimizer step over all towers, its batches from `batches`."""
        raise NotImplementedError

    def batches(self, pipeline: Any, examples: Any, seed: int) -> Any:
        return pipeline.towers(examples, self.training.global_batch, self.tower_devices, seed)

    def train_loop(self, batches: Any) -> Any:
        return steps_loop(self.step(batches), self.loss_scale.patience)

    def input_loop(self, batches: Any) -> Any:
        return drain_loop(batches.next)

    def checkpoint_objects(self) -> dict[str, Any]:
        """The strategy's models and optimizers (`_kept`), and the loss scale's variables when it scales (none
        without: older checkpoints still load)."""
        scale = self.loss_scale.variables
        return {**self._kept(), **({"loss_scale": scale} if scale else {})}

    def _kept(self) -> dict[str, Any]:
        """Name -> trackable: a strategy keeping one model (`self.model`), its variables and its optimizer."""
        return {"model": self.model.variables, "optimizer": self.optimizer}

    def weights(self) -> list:
        return self.model.trainable_variables


def steps_loop(step_fn, patience: int = 1):
    """Compile `step_fn() -> loss` into fn(n) -> (mean loss of the finite steps, steps run): up to n steps in one
    tf.while_loop, so Python and dispatch are paid once a call. It stops once `patience` steps in a row had a
    non-finite loss (more than 1 under loss scaling, which skips such steps): then `steps run` < n."""

    # No autograph: converting every function the step calls costs tracing time that grows with the towers.
    @tf.function(autograph=False)
    def loop(n: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
        def more(i, total, finite_steps, streak):
            return tf.logical_and(i < n, streak < patience)

        def one_step(i, total, finite_steps, streak):
            loss = step_fn()
            finite = tf.math.is_finite(loss)
            streak = tf.where(finite, 0, streak + 1)
            return i + 1, total + tf.where(finite, loss, 0.0), finite_steps + tf.cast(finite, tf.int32), streak

        start = (tf.constant(0), tf.constant(0.0), tf.constant(0), tf.constant(0))
        i, total, finite_steps, streak = tf.while_loop(more, one_step, start)
        run = tf.where(streak < patience, i, i - streak)  # stopped: the steps before the non-finite streak
        return total / tf.cast(tf.maximum(finite_steps, 1), tf.float32), run

    return loop


def tower_step(model: keras.Model, task: Task, loss_of: Any, scale: Any, jit_compile: bool,
               passes: Any = None) -> Any:
    """One tower's forward and backward: fn(x, y) -> (loss, gradients of the trainable variables for the loss times
    `scale`'s factor), where loss = loss_of(the task's per-example losses (b,)).

    Stateless (Keras' `stateless_call` on the variables' values read outside it, the moving statistics it computes
    assigned after it) under `jit_compile`, where an XLA cluster cannot read a variable held on another device
    (parameter_server's weights, the loss scale), and where `passes` (`stateless_passes` of any copy of the model) is
    given: one trace for every tower instead of one each.
    """
    trainable, state = model.trainable_variables, model.non_trainable_variables

    def stateful(x: tf.Tensor, y: tf.Tensor) -> tuple[tf.Tensor, list[tf.Tensor]]:
        with tf.GradientTape() as tape:
            loss = loss_of(per_example_loss(model, x, y, training=True, task=task)[0])
            scaled = scale.scaled(loss)  # recorded on the tape
        return loss, tape.gradient(scaled, trainable)

    if passes is None and not jit_compile:
        return stateful
    passes = passes or stateless_passes(model, task, loss_of, jit_compile)

    def stateless(x: tf.Tensor, y: tf.Tensor) -> tuple[tf.Tensor, list[tf.Tensor]]:
        read = [tf.convert_to_tensor(v) for v in trainable], [tf.convert_to_tensor(v) for v in state]
        loss, grads, values = passes(x, y, *read, scale.factor())
        for variable, value in zip(state, values):
            variable.assign(value)
        return loss, grads

    return stateless


def stateless_passes(model: keras.Model, task: Task, loss_of: Any, jit_compile: bool) -> Any:
    """fn(x, y, weights, values, factor) -> (loss, gradients of `weights` for loss x factor, the new `values`): the
    forward and backward of `model` on the given values of its trainable and non-trainable variables, one
    tf.function run on the device it is called under (under `jit_compile` one XLA cluster there). Any copy of the
    model can be given in (the same shapes), so N towers trace the model once: tracing a model's call and gradient is
    most of a multi-device job's first call."""

    @tf.function(jit_compile=jit_compile, autograph=False)
    def passes(x: tf.Tensor, y: tf.Tensor, weights: list[tf.Tensor], values: list[tf.Tensor],
               factor: tf.Tensor) -> tuple[tf.Tensor, list[tf.Tensor], list[tf.Tensor]]:
        with tf.GradientTape() as tape:
            tape.watch(weights)
            logits, values = model.stateless_call(weights, values, x, training=True)
            loss = loss_of(task.loss(y, tf.cast(logits, tf.float32)))  # as per_example_loss
            scaled = loss * factor
        return loss, tape.gradient(scaled, weights), values

    return passes


def touch(x: tf.Tensor, y: tf.Tensor) -> tf.Tensor:
    """A near-free use of a batch that still forces it to be produced (for timing the input pipeline alone)."""
    return tf.add_n([tf.cast(tf.reshape(t, [-1])[0], tf.float32) for t in tf.nest.flatten((x, y))])


def drain_loop(next_batches):
    """fn(n) pulling n steps of tower batches through `next_batches()` and touching each on its own device."""

    def step() -> tf.Tensor:
        return tf.add_n([touch(x, y) for x, y in next_batches()])

    return steps_loop(step)


def tables(model: Any) -> list:
    """The model's embedding tables read by lookups only (plain keras.layers.Embedding, nested models too): their
    gradients are the rows a batch looked up (tf.IndexedSlices), which strategies keep sparse. A subclass (the GPT's
    tied table, also an output layer) has a dense gradient and is left out."""
    return [layer.embeddings for layer in _table_layers(model)]


def read_rows_only(model: keras.Model) -> keras.Model:
    """Make every plain Embedding layer (`tables`) read the rows it looks up in place (ResourceGather), not its
    whole table: once a sparse update has touched a table, TensorFlow copies all of it on every such read (a
    resource variable in copy-on-read mode). What the layer computes is unchanged."""
    for layer in _table_layers(model):
        if not layer.lora_enabled and not layer.quantization_mode:
            object.__setattr__(layer, "call", _row_lookup(layer))
    return model


def _row_lookup(layer: Any) -> Any:
    """The layer's lookup as a ResourceGather of its rows, cast to its compute dtype as Keras' own call does."""

    def call(inputs: Any) -> Any:
        ids = inputs if inputs.dtype in (tf.int32, tf.int64) else tf.cast(inputs, tf.int32)
        table = layer.embeddings.value
        if isinstance(table, tf.Tensor):  # its value given to a stateless call (common.tower_step under XLA)
            return tf.cast(tf.gather(table, ids), layer.compute_dtype)  # (..., d)
        if isinstance(table, tf.distribute.DistributedValues):  # a MirroredVariable: this replica's own copy
            table = table._get_on_device_or_primary()
        return tf.cast(table.sparse_read(ids), layer.compute_dtype)  # (..., d)

    return call


def fused_batch_norm(model: keras.Model) -> keras.Model:
    """Make every plain BatchNormalization layer run FusedBatchNormV3 on 4-D channels-last inputs (the layer's own
    call on anything else): one op each way where Keras 3 runs a dozen; the same outputs and moving statistics."""
    for layer in _layers(model):
        if type(layer) is keras.layers.BatchNormalization:
            object.__setattr__(layer, "call", _fused_call(layer, layer.call))
    return model


def _fused_call(layer: Any, keras_call: Any) -> Any:
    """The layer's call through FusedBatchNormV3 where it computes what Keras' does: no mask, no renorm, not
    `synchronized`, channels last of a 4-D input, an epsilon of 1e-5 and up (cuDNN's least; smaller ones would be
    raised, changing the outputs)."""

    def call(inputs: Any, training: Any = None, mask: Any = None) -> Any:
        fusable = (mask is None and not layer.renorm and not layer.synchronized and len(inputs.shape) == 4
                   and layer.axis in (3, -1) and layer.epsilon >= 1e-5)
        if not fusable:
            return keras_call(inputs, training=training, mask=mask)
        x = tf.cast(inputs, tf.float32)  # (b, h, w, c): float32 throughout, as Keras computes it
        channels = x.shape[-1]
        gamma = tf.cast(layer.gamma, tf.float32) if layer.scale else tf.ones([channels])
        beta = tf.cast(layer.beta, tf.float32) if layer.center else tf.zeros([channels])
        train = bool(training) and layer.trainable
        mean, variance = (tf.constant([]), tf.constant([])) if train else (layer.moving_mean, layer.moving_variance)
        y, batch_mean, batch_variance, *_ = tf.raw_ops.FusedBatchNormV3(
            x=x, scale=gamma, offset=beta, mean=tf.cast(mean, tf.float32), variance=tf.cast(variance, tf.float32),
            epsilon=layer.epsilon, exponential_avg_factor=1.0, data_format="NHWC", is_training=train)
        if train:  # the kernel's variance has Bessel's correction (n / (n - 1)); Keras' moments do not
            n = tf.cast(tf.reduce_prod(tf.shape(x)[:3]), tf.float32)
            biased = batch_variance * (n - 1) / tf.maximum(n, 1.0)
            m = layer.momentum
            layer.moving_mean.assign(tf.cast(layer.moving_mean, tf.float32) * m + batch_mean * (1.0 - m))
            layer.moving_variance.assign(tf.cast(layer.moving_variance, tf.float32) * m + biased * (1.0 - m))
        return tf.cast(y, layer.compute_dtype)

    return call


def deal(sizes: list[int], devices: int) -> list[int]:
    """Each table's device (by index): the largest table first, each to the device holding the fewest bytes so far."""
    held, owners = [0] * devices, [0] * len(sizes)
    for t in sorted(range(len(sizes)), key=lambda t: -sizes[t]):
        owners[t] = min(range(devices), key=lambda j: held[j])
        held[owners[t]] += sizes[t]
    return owners


def share(models: list[Any], owners: list[int], devices: list[str]) -> list[Any]:
    """One variable per table on its owner's device (the first copy's values), put in the place of every copy's own
    table, whose lookups then run on that device. Returns the shared tables."""
    layers = [_table_layers(m) for m in models]
    shared = []
    for t, owner in enumerate(owners):
        device = devices[owner]
        with tf.device(device):
            table = keras.Variable(tf.identity(layers[0][t].embeddings.value), name=f"table{t}_on_{owner}")
        for copy in layers:
            _swap(copy[t], table, device)
        shared.append(table)
    return shared


def _table_layers(model: Any) -> list[Any]:
    """The plain keras.layers.Embedding layers of `model`, nested models too (`tables`)."""
    return [layer for layer in _layers(model) if type(layer) is keras.layers.Embedding]


def _swap(layer: Any, table: Any, device: str) -> None:
    """Make an Embedding layer look its ids up in `table`, on `device`."""
    own = layer._trainable_variables
    own[own.index(layer._embeddings)] = table
    object.__setattr__(layer, "_embeddings", table)  # past Keras' tracker: the layer is built and locked
    lookup = layer.call

    def call(inputs: Any, *args: Any, **kwargs: Any) -> Any:
        with tf.device(device):  # the gather next to its table: ids in, rows out, never the table
            return lookup(inputs, *args, **kwargs)

    object.__setattr__(layer, "call", call)


def moving_state(model: Any) -> list:
    """What training changes in a model besides its weights, which every copy must agree on: its non-trainable
    float variables (batch normalization's moving statistics; not a Dropout's integer seed state)."""
    return [v for v in model.non_trainable_variables if "float" in str(v.dtype)]


def average_moving_state(models: list, devices: list[str]) -> None:
    """Set every copy's moving state to its mean over the copies (variable j averaged on device j mod N): each tower
    updated its own copy from its own batch."""
    for j, copies in enumerate(zip(*(moving_state(m) for m in models))):
        with tf.device(devices[j % len(devices)]):
            mean = tf.add_n([c.value for c in copies]) / len(copies)
        for copy, device in zip(copies, devices):
            with tf.device(device):
                copy.assign(mean)


def copies_of_moving_state(models: list) -> list[list[Any]]:
    """Each moving-state variable as one numpy array per model copy (what a run checks is equal on every copy)."""
    return [[v.numpy() for v in copies] for copies in zip(*(moving_state(m) for m in models))]


def synchronize_batch_norm(model: Any) -> None:
    """Make every BatchNormalization layer of `model` compute its batch statistics over all replicas (Keras'
    `synchronized=True`)."""
    for layer in _layers(model):
        if isinstance(layer, keras.layers.BatchNormalization):
            layer.synchronized = True


def _layers(layer: Any):
    """`layer` and every layer nested in it, depth first."""
    yield layer
    for inner in getattr(layer, "layers", []):
        yield from _layers(inner)


def optimizer_state_bytes(strategy: Any) -> dict[str, int]:
    """Bytes of optimizer state (slots, step counters) per device, from the optimizers among the strategy's
    checkpoint objects; a mirrored variable counts on each device it is copied to."""
    from runner import optimizers

    out: dict[str, int] = {}
    parts = [part for kept in strategy.checkpoint_objects().values() for part in optimizers.each(kept)]
    for variable in (v for o in parts if isinstance(o, keras.optimizers.Optimizer) for v in o.variables):
        value = variable.value if isinstance(variable, keras.Variable) else variable
        for copy in getattr(value, "values", None) or [value]:  # a MirroredVariable: one per device
            out[copy.device] = out.get(copy.device, 0) + int(copy.shape.num_elements()) * copy.dtype.size
    return out
