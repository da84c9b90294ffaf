"""Models: one module each, holding a dataclass of the model's options whose `build(spec)` returns a Keras model.

The contract is `Model`: a model is built for the data's spec and refuses in one line, before TensorFlow starts, a
spec it cannot take; modules reach Keras through `runner.lazy` (imported on first use), so validation never loads
TensorFlow. A user's own model is a dataclass named by `_target_`, or any function returning a Keras model, called
with what the data says (`spec_arguments`). `check_lookups` holds a built model's embeddings to the data's ids.
"""

from __future__ import annotations

import dataclasses
import inspect
import itertools
import logging
import math
import typing
from dataclasses import dataclass, field
from typing import Any, Callable, ClassVar, Mapping, Protocol, runtime_checkable

import numpy as np

from runner.data_pipelines import MNIST, Spec
from runner.errors import ConfigError
from runner.lazy import keras
from runner.registry import Registry, check, fields, locate

log = logging.getLogger(__name__)
# Given from the data's spec to a model function that takes them (`spec_arguments`).
SPEC_ARGUMENTS = ("input_shape", "classes", "vocabulary_size", "sequence_length", "vocabulary_sizes",
                  "num_dense_features")


def check_untrained(key: str, options: Mapping[str, Any]) -> None:
    """Refuse, before TensorFlow starts, a `weights` option (`key`.weights, keras.applications') other than null:
    every run starts from its seed's weights; pretrained ones would be downloaded after the run opened."""
    check(f"{key}.weights", options.get("weights"),
          (lambda v: v is None, "null: models train from the seed's initial weights; pretrained weights "
                                "(weights=imagenet) are never downloaded"))


@runtime_checkable
class Model(Protocol):
    """What the runner needs of a model's options."""

    name: str
    target_accuracy: float | None  # the test accuracy a run of it is timed to by default (None: no default target)

    def build(self, spec: Spec = MNIST) -> keras.Model:
        """A fresh, uncompiled model mapping `spec`'s inputs to its outputs (`Spec.outputs_shape`)."""

    def check(self, spec: Spec) -> None:
        """Raise ConfigError (one line) if the model cannot take `spec`'s examples (no TensorFlow)."""

    def layers_with_weights(self) -> int | None:
        """How many layers have weights (the most stages `strategy.split=stages` can cut); None: known once built."""

    def activations_per_example(self, spec: Spec) -> int | None:
        """Floats the layers output per example, for validation's memory estimate; None: unknown."""

    def table_bytes(self, spec: Spec) -> int | None:
        """Bytes of its embedding tables for `spec`, for validation's memory check; None: unknown or none."""

    @property
    def dense_only(self) -> bool:
        """Whether every layer with weights is Dense (`strategy.split=width` applies)."""


def label(model: Model) -> str:
    """How run lines, tables and verdicts name a model: its own `label()` where it has one (keras_app: the network
    it builds), else `mlp/tiny`, or `lenet` without variants."""
    if callable(own := getattr(model, "label", None)):
        return own()
    variant = getattr(model, "variant", None)
    return f"{model.name}/{variant}" if variant else model.name


@dataclass
class ModelOptions:
    """Base of the built-in models: what a model does not know until built is None / False."""

    name: str = ""

    target_accuracy: ClassVar[float | None] = None

    def check(self, spec: Spec) -> None:
        """The built-in image models take any array of values (the MLP flattens it); a convolutional one refuses what
        is not an image or too small (`too_small`)."""
        self.images_only(spec)

    def layers_with_weights(self) -> int | None:
        return None

    def activations_per_example(self, spec: Spec) -> int | None:
        return None

    def table_bytes(self, spec: Spec) -> int | None:
        return None

    def images_only(self, spec: Spec) -> None:
        """Refuse examples that are not arrays of values (token ids, named features)."""
        if spec.token_ids or spec.features:
            raise ConfigError(f"model={self.name} takes images, the data gives {spec}; for token ids use model=gpt "
                              "(a language model), for click logs model=dlrm, or your own model (model._target_)")

    def too_small(self, spec: Spec, smallest: int) -> None:
        """Refuse examples that are not images, and images whose height or width is below `smallest` (what the
        model's layers need)."""
        self.images_only(spec)
        if not spec.images:
            raise ConfigError(f"model={self.name} takes images (height, width, channels), the data gives {spec}; use "
                              "model=mlp, which takes any array of values, or your own model (model._target_)")
        if min(spec.shape[:2]) < smallest:
            raise ConfigError(
                f"model={self.name} takes images of at least {smallest}x{smallest}, the data gives {spec}; "
                "use larger images (data.shape) or model=mlp, which takes any size"
            )

    @property
    def dense_only(self) -> bool:
        return False


@dataclass(frozen=True)
class Layer:
    """A Keras layer as the arguments it was asked for (`RECORDER`): what validation walks without TensorFlow."""

    kind: str  # the keras.layers class name
    args: tuple
    kwargs: dict


class _Recorder:
    """Stands in for the `keras` module while validation walks a model's layers: `keras.layers.X(*args, **kwargs)`
    (any attribute path: `keras.regularizers.l2(...)` too) is `Layer("X", args, kwargs)`."""

    def __init__(self, name: str = ""):
        self._name = name

    def __getattr__(self, name: str) -> _Recorder:
        return _Recorder(name)

    def __call__(self, *args: Any, **kwargs: Any) -> Layer:
        return Layer(self._name, args, kwargs)


RECORDER = _Recorder()  # given to `SequentialModel.layers` in place of keras
# Positional arguments of the layers the walk follows, in Keras' order; any other layer leaves the facts to the built
# model (None). Of these, a Flatten's and a Dropout's outputs are views of their inputs, not counted as activations.
_ARGUMENTS = {"Conv2D": ("filters", "kernel_size", "strides", "padding"), "MaxPooling2D": ("pool_size", "strides",
              "padding"), "Dense": ("units",), "ZeroPadding2D": ("padding",), "GlobalAveragePooling2D": (),
              "Flatten": (), "Dropout": ("rate",), "BatchNormalization": (), "Activation": ("activation",), "ReLU": ()}
_VIEWS = ("Flatten", "Dropout")
_WEIGHTED = ("Conv2D", "Dense", "BatchNormalization")


def _pair(value: Any) -> tuple[int, int]:
    """A Keras size or stride given as one int or a (height, width) pair, as the pair."""
    return (value, value) if isinstance(value, int) else tuple(value)


def output_shapes(layers: list[Layer], shape: tuple[int, ...]) -> list[tuple[int, ...]] | None:
    """Each layer's output shape per example for channels-last inputs of `shape`, as Keras computes it (a side of 0
    or less: the layers do not fit); None where a layer is not one the walk follows (`_ARGUMENTS`)."""
    out = []
    for layer in layers:
        a = {**dict(zip(_ARGUMENTS.get(layer.kind, ()), layer.args)), **layer.kwargs}
        if (layer.kind not in _ARGUMENTS or a.get("data_format", "channels_last") != "channels_last"
                or _pair(a.get("dilation_rate", 1)) != (1, 1)):
            return None
        if layer.kind in ("Conv2D", "MaxPooling2D"):
            sizes = _pair(a.get("kernel_size", a.get("pool_size", 2)))
            strides = _pair(a.get("strides") or (1 if layer.kind == "Conv2D" else sizes))
            same = a.get("padding") == "same"
            sides = [-(-x // s) if same else (x - k) // s + 1 for x, k, s in zip(shape[:2], sizes, strides)]
            shape = (*sides, a["filters"] if layer.kind == "Conv2D" else shape[2])
        elif layer.kind == "ZeroPadding2D":
            (top, bottom), (left, right) = [_pair(p) for p in _pair(a.get("padding", 1))]
            shape = (shape[0] + top + bottom, shape[1] + left + right, shape[2])
        elif layer.kind == "Dense":
            shape = (*shape[:-1], a["units"])  # on the last axis
        elif layer.kind == "Flatten":
            shape = (math.prod(shape),)
        elif layer.kind == "GlobalAveragePooling2D":
            shape = (1, 1, shape[-1]) if a.get("keepdims") else (shape[-1],)
        out.append(shape)  # the rest keep their input's shape
    return out


@dataclass
class SequentialModel(ModelOptions):
    """A model that is a stack of Keras layers (`layers`): `build` puts the data's Input before them, and the facts
    validation needs before TensorFlow starts (the least image size, the activations, the layers with weights) come
    from walking the same layers' shapes (`output_shapes`), so the architecture is written once."""

    def build(self, spec: Spec = MNIST) -> keras.Model:
        """An uncompiled keras.Model mapping (batch, H, W, C) images to (batch, classes) logits."""
        return keras.Sequential([keras.Input(spec.shape), *self.layers(keras, spec)], name=self.keras_name())

    def keras_name(self) -> str:
        """The Keras model's name: `<name>_<variant>`, or `<name>` for a model without variants."""
        variant = getattr(self, "variant", None)
        return f"{self.name}_{variant}" if variant else self.name

    def layers(self, keras: Any, spec: Spec) -> list[Any]:
        """The layers after the Input, ending in the (batch, spec.classes) logits (shapes in comments: MNIST's);
        `keras` is the module, or `RECORDER`."""
        raise NotImplementedError

    def check(self, spec: Spec) -> None:
        """Refuse images too small for the layers: the least square side whose every output keeps a side of 1 (a
        model of layers the walk does not follow: any size; Keras says what it cannot build); examples that are not
        images where a layer has a spatial extent (an MLP takes any array of values)."""
        self.images_only(spec)
        walked = self._walk(spec, () if spec.images else (1, 1))  # not images: walked as 1x1 ones
        if walked is None or not (spec.images or any(len(s) == 3 for s in walked[1])):
            return

        def fits(side: int) -> bool:
            _, shapes = self._walk(spec, (side, side)) or ((), [])
            return all(min(s[:2]) >= 1 for s in shapes if len(s) == 3)

        self.too_small(spec, next(side for side in itertools.count(1) if fits(side)))

    def activations_per_example(self, spec: Spec = MNIST) -> int | None:
        walked = self._walk(spec)
        return None if walked is None else sum(math.prod(s) for layer, s in zip(*walked) if layer.kind not in _VIEWS)

    def layers_with_weights(self) -> int | None:
        weighted = self._weighted()
        return None if weighted is None else len(weighted)

    @property
    def dense_only(self) -> bool:
        weighted = self._weighted()
        return weighted is not None and all(layer.kind == "Dense" for layer in weighted)

    def _weighted(self) -> list[Layer] | None:
        """The layers with weights (a batch normalization with a scale or an offset), or None: not walked."""
        walked = self._walk(MNIST)
        return None if walked is None else [x for x in walked[0] if x.kind in _WEIGHTED and (
            x.kind != "BatchNormalization" or x.kwargs.get("center", True) or x.kwargs.get("scale", True))]

    def _walk(self, spec: Spec, sides: tuple[int, ...] = ()) -> tuple[list[Layer], list[tuple[int, ...]]] | None:
        """`layers` for `spec`'s images (of `sides` instead of its own, if given) as recorded (`RECORDER`) and their
        output shapes; None where they cannot be recorded without Keras or the walk does not follow them."""
        shape = (*sides, spec.shape[-1]) if sides else tuple(spec.shape)
        try:
            layers = self.layers(RECORDER, dataclasses.replace(spec, shape=shape))
        except Exception:  # noqa: BLE001 - a layer list that needs the real Keras: the built model says the rest
            return None
        if not all(isinstance(layer, Layer) for layer in layers):  # e.g. a layer object made before
            return None
        shapes = output_shapes(layers, shape)
        return None if shapes is None else (layers, shapes)


@dataclass
class FunctionModel(ModelOptions):
    """A user's function that returns a Keras model, called with the other keys of its YAML as keyword arguments and
    what the data says where it takes it (`spec_arguments`)."""

    target: str = ""
    kwargs: dict[str, Any] = field(default_factory=dict)

    def check(self, spec: Spec) -> None:
        """Any task: a function's model is checked against the data once built (strategies.common.build_model)."""

    def as_config(self) -> dict[str, Any]:
        """Its options as the user's YAML spells them, `model.hidden` (the run's params and the runs view's columns
        of a sweep over it), not as its fields, `model.kwargs.hidden`; its `_target_` says the function."""
        return {"name": self.name, **self.kwargs}

    def build(self, spec: Spec = MNIST) -> keras.Model:
        fn = locate(self.target, "model")
        return fn(**{**spec_arguments(fn, spec), **self.kwargs})


def spec_arguments(fn: Callable[..., Any], spec: Spec) -> dict[str, Any]:
    """Those of SPEC_ARGUMENTS the spec gives and `fn` takes (keras.applications' and keras_hub's names);
    `classifier_activation=None` where it takes that (the runner trains on logits) and `include_preprocessing=False`
    (the runner's images are in [0, 1], not 0-255)."""
    parameters = inspect.signature(fn).parameters
    takes_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values())
    # Named features have no one input shape (an image model given input_shape=() fails inside Keras: IndexError).
    given = {**({} if spec.features else {"input_shape": tuple(spec.shape)}), "classes": spec.classes}
    if spec.features:  # the tables the runner knows (data.tables' too): TF Model Garden's ranking config's names
        given.update(vocabulary_sizes=[v for f in spec.features for v in f.vocabularies],
                     num_dense_features=sum(math.prod(f.shape) for f in spec.features if f.dtype == "float32"))
    if spec.token_ids:  # token ids: keras_hub's names for what the data says
        given.update(vocabulary_size=spec.vocabulary, sequence_length=spec.shape[0])
    fixed = {"classifier_activation": None, "include_preprocessing": False}
    return {**{k: v for k, v in given.items() if k in parameters or takes_any},
            **{k: v for k, v in fixed.items() if k in parameters}}


IGNORED_VARIANT: set[str] = set()  # model functions whose ignored model.variant was said


def from_function(target: str, fn: Callable[..., Any], rest: dict[str, Any]) -> FunctionModel:
    """A FunctionModel for `fn`, its keyword arguments checked against its signature now (before TensorFlow);
    `variant` (the smoke preset asks for `tiny`) is left out, with a warning, where the function does not take it."""
    kwargs = {k: v for k, v in rest.items() if k != "name"}
    given = [k for k in (*SPEC_ARGUMENTS, "classifier_activation") if k in kwargs]
    if given:
        raise ConfigError(
            f"model.{given[0]}={kwargs[given[0]]!r}: the runner passes the data's {', '.join(SPEC_ARGUMENTS)} to a "
            "model function that takes them and trains on logits (classifier_activation=None); remove the key, or "
            "set it on the data (data.*)"
        )
    check_untrained("model", kwargs)
    signature = inspect.signature(fn)
    parameters = signature.parameters
    if "weights" in parameters and "weights" not in kwargs:
        kwargs["weights"] = None  # keras.applications' own default is "imagenet": a download (check_untrained)
    if "variant" in kwargs and "variant" not in parameters:
        variant = kwargs.pop("variant")
        if target not in IGNORED_VARIANT:  # said once per process (a sweep's predictions validate it per combination)
            IGNORED_VARIANT.add(target)
            log.warning("model %s takes no variant: model.variant=%s ignored", target, variant)
    try:
        supplied = {**spec_arguments(fn, MNIST), **{k: None for k in SPEC_ARGUMENTS[2:] if k in parameters}}
        signature.bind(**supplied, **kwargs)  # whatever the data, its arguments are supplied
    except TypeError as e:  # a parameter the runner does not fill: say what it passes
        raise ConfigError(f"model._target_={target!r} does not take these options: {e} (a model function gets the "
                          "data's input_shape and classes by name, for token ids vocabulary_size and sequence_length, "
                          "and the model.* keys: docs/your-model-your-data.md)") from None
    return FunctionModel(name=str(rest.get("name") or fn.__name__), target=target, kwargs=kwargs)


MODELS = Registry("model", __name__, from_function=from_function)


def variants(name: str) -> tuple[str | None, ...]:
    """A registered model's variants (the choices of its `variant` option), or (None,) when it has none."""
    return typing.get_args(fields(MODELS.get(name)).get("variant", typing.Literal[None]))


def check_lookups(name: str, built: keras.Model, spec: Spec) -> None:
    """Refuse (ConfigError, one line) a built model whose embedding has fewer rows than the ids the data gives it
    (an id past its rows reads zeros on a GPU and fails mid-run on a CPU). Each embedding's ids are found by running
    the model up to it on the data's largest ids; an embedding in a nested model, or not fed by the inputs, is not
    seen."""
    lookups = [(layer, node.input_tensors[0]) for layer in built.layers if isinstance(layer, keras.layers.Embedding)
               for node in layer._inbound_nodes if node.input_tensors and "int" in str(node.input_tensors[0].dtype)]
    if not lookups or not (spec.token_ids or spec.features):
        return
    x, sources = _largest_ids(spec)
    for (layer, _), ids in zip(lookups, _ids_given(built, [t for _, t in lookups], x)):
        if ids is None:
            continue
        largest = ids.reshape(len(sources), -1).max(axis=1)  # per example: one source each
        row = int(np.argmax(largest))
        if largest[row] >= layer.input_dim:
            raise ConfigError(_too_few_rows(name, layer, int(largest[row]), *sources[row]))


def _largest_ids(spec: Spec) -> tuple[Any, list[tuple[str, int]]]:
    """Examples of the data's largest ids and, for each, where its ids come from and their vocabulary: token ids, one
    example of vocabulary - 1 everywhere; named features, one example per categorical column (every other input 0)."""
    if spec.token_ids:
        return np.full((1, *spec.shape), spec.vocabulary - 1, np.int32), [("token ids", spec.vocabulary)]
    columns = [(f, k, v) for f in spec.features for k, v in enumerate(f.vocabularies)]
    x = {f.name: np.zeros((len(columns), *f.shape), f.dtype) for f in spec.features}
    for row, (f, k, v) in enumerate(columns):
        x[f.name][row, ..., k] = v - 1
    return x, [(f"{f.name} column {k}", v) for f, k, v in columns]


def _ids_given(built: keras.Model, tensors: list, x: Any) -> list[Any]:
    """What each of `tensors` (lookups' ids) holds when `built` is given `x`; None for one not computed from the
    inputs alone, which is not checked. (`inputs`: a Sequential model has no `input` until called.)"""
    feed = [x[t.name] for t in built.inputs] if isinstance(x, dict) else [x]

    def run(outputs: list) -> list:
        return [np.asarray(t) for t in keras.tree.flatten(keras.Model(built.inputs, outputs)(feed))]

    try:
        return run(tensors)
    except Exception:  # noqa: BLE001 - one of them cannot be computed from the inputs: each on its own
        pass
    given = []
    for tensor in tensors:
        try:
            given.extend(run([tensor]))
        except Exception:  # noqa: BLE001 - a lookup the inputs do not reach is not the data's to check
            given.append(None)
    return given


def _too_few_rows(name: str, layer: Any, largest: int, source: str, vocabulary: int) -> str:
    """The refusal of an embedding given ids up to `largest` from `source` (of `vocabulary` ids)."""
    if source == "token ids":
        return (f"model={name}'s embedding {layer.name} has {layer.input_dim} rows and the data's token ids go up to "
                f"{vocabulary - 1} (vocabulary {vocabulary}); build it with vocabulary_size rows, which the runner "
                "passes to a model function")
    return (f"model={name}'s embedding {layer.name} has input_dim {layer.input_dim:,} and is given ids up to "
            f"{largest:,} from the data's {source} (vocabulary size {vocabulary:,}); give it at least {largest + 1:,} "
            "rows: the runner passes vocabulary_sizes (one table size per categorical column) to a model function "
            "that takes it")
