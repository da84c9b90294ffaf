"""Models: one module each, holding a dataclass of the model's options whose `build(spec)` returns a Keras model.

The contract is `Model` below: a model is built for the data's example spec (input shape, classes), and refuses in
one line, before TensorFlow starts, a spec it cannot take. A module imports Keras inside `build`, never at top
level, so config validation reads the options without loading TensorFlow. Adding a model is one module here (a
dataclass registered with `@MODELS.register`, see `lenet.py`) plus one YAML in conf/model/. A user's own model
needs neither: a YAML in their config directory whose `_target_` names their dataclass, or any function returning a
Keras model, called with `input_shape` and `classes` as keras.applications' constructors are.
"""

from __future__ import annotations

import inspect
import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, ClassVar, Mapping, Protocol, runtime_checkable

from runner.data_pipelines import MNIST, Spec
from runner.errors import ConfigError
from runner.registry import Registry, Rule, check

if TYPE_CHECKING:
    import keras

log = logging.getLogger(__name__)
SPEC_ARGUMENTS = ("input_shape", "classes", "vocabulary_size", "sequence_length")  # given from the data's spec
# keras.applications' `weights`: every run starts from its seed's weights (the same in every strategy); pretrained ones
# would be downloaded as the model is built, after the run opened (and fail there on a machine without internet).
UNTRAINED: Rule = (lambda v: v is None, "null: models train from the seed's initial weights; pretrained weights "
                                        "(weights=imagenet) are never downloaded")


def check_untrained(key: str, options: Mapping[str, Any]) -> None:
    """Refuse, before TensorFlow starts, a `weights` option (`key`.weights) other than null (UNTRAINED)."""
    check(f"{key}.weights", options.get("weights"), UNTRAINED)


@runtime_checkable
class Model(Protocol):
    """What the runner needs of a model's options."""

    name: str
    target_accuracy: float | None  # the test accuracy a run of it is timed to by default (None: no default target)

    def build(self, spec: Spec = MNIST) -> keras.Model:
        """A fresh, uncompiled model mapping float32 (batch, *spec.shape) images in [0, 1] to (batch, spec.classes)
        logits (Keras' current seed)."""

    def check(self, spec: Spec) -> None:
        """Raise ConfigError (one line) if the model cannot take `spec`'s examples (no TensorFlow)."""

    def layers_with_weights(self) -> int | None:
        """How many layers have weights (the most stages `strategy.split=stages` can cut); None: known once built."""

    def activations_per_example(self, spec: Spec) -> int | None:
        """Floats the layers compute per example of `spec` (their outputs; reshapes and dropout not counted), for
        validation's memory estimate; None: unknown."""

    def table_bytes(self, spec: Spec) -> int | None:
        """Bytes of its embedding tables for `spec` (float32 rows), for validation's memory check; None: unknown
        or none."""

    @property
    def dense_only(self) -> bool:
        """Whether every layer with weights is Dense (`strategy.split=width` applies)."""


@dataclass
class ModelOptions:
    """Base of the built-in models: what a model does not know until built is None / False."""

    name: str = ""

    target_accuracy: ClassVar[float | None] = None

    def check(self, spec: Spec) -> None:
        """The built-in image models take images of any size (the convolutional ones: `too_small`)."""
        self.images_only(spec)

    def layers_with_weights(self) -> int | None:
        return None

    def activations_per_example(self, spec: Spec) -> int | None:
        return None

    def table_bytes(self, spec: Spec) -> int | None:
        return None

    def images_only(self, spec: Spec) -> None:
        """Refuse a task whose examples are not images (token ids)."""
        if spec.unit != "images":
            raise ConfigError(f"model={self.name} takes images, the data gives {spec}; for token ids use model=gpt "
                              "(a language model), for click logs model=dlrm, or your own model (model._target_)")

    def too_small(self, spec: Spec, smallest: int) -> None:
        """Refuse images whose height or width is below `smallest` (what the model's layers need)."""
        self.images_only(spec)
        if min(spec.shape[:2]) < smallest:
            raise ConfigError(
                f"model={self.name} takes images of at least {smallest}x{smallest}, the data gives {spec}; "
                "use larger images (data.shape) or model=mlp, which takes any size"
            )

    @property
    def dense_only(self) -> bool:
        return False


@dataclass
class FunctionModel(ModelOptions):
    """A user's function that returns a Keras model, called with the other keys of its YAML as keyword arguments,
    plus `input_shape` and `classes` from the data's spec where it takes them (keras.applications' convention)."""

    target: str = ""
    kwargs: dict[str, Any] = field(default_factory=dict)

    def check(self, spec: Spec) -> None:
        """Any task: a function's model is checked against the data once built (strategies.common.build_model)."""

    def build(self, spec: Spec = MNIST) -> keras.Model:
        from runner.registry import locate

        fn = locate(self.target, "model")
        return fn(**{**spec_arguments(fn, spec), **self.kwargs})


def spec_arguments(fn: Callable[..., Any], spec: Spec) -> dict[str, Any]:
    """The spec's `input_shape` and `classes` (token ids: also `vocabulary_size` and `sequence_length`) for those
    `fn` takes; `classifier_activation=None` where it takes
    that (a keras.applications constructor ends in softmax by default; the runner trains on logits); and
    `include_preprocessing=False` where it takes that (EfficientNetV2, ConvNeXt and MobileNetV3 rescale 0-255 pixels
    by default; the runner's images are in [0, 1]); the model's own keyword arguments may set it again."""
    parameters = inspect.signature(fn).parameters
    takes_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values())
    given = {"input_shape": tuple(spec.shape), "classes": spec.classes}
    if spec.token_ids:  # token ids: keras_hub's names for what the data says
        given.update(vocabulary_size=spec.vocabulary, sequence_length=spec.shape[0])
    out = {k: v for k, v in given.items() if k in parameters or takes_any}
    if "classifier_activation" in parameters:
        out["classifier_activation"] = None
    if "include_preprocessing" in parameters:
        out["include_preprocessing"] = False
    return out


def from_function(target: str, fn: Callable[..., Any], rest: dict[str, Any]) -> FunctionModel:
    """A FunctionModel for `fn`, its keyword arguments checked against its signature now (before TensorFlow).

    `variant` is the runner's size selector (the smoke preset asks for `tiny`): passed on when the function takes
    it, else left out with a warning, since a function without it has one size.
    """
    kwargs = {k: v for k, v in rest.items() if k != "name"}
    given = [k for k in (*SPEC_ARGUMENTS, "classifier_activation") if k in kwargs]
    if given:
        raise ConfigError(
            f"model.{given[0]}={kwargs[given[0]]!r}: the runner passes input_shape and classes from the data's spec "
            "and trains on logits (classifier_activation=None); remove the key, or set the data's shape and classes"
        )
    check_untrained("model", kwargs)
    parameters = inspect.signature(fn).parameters
    if "weights" in parameters and "weights" not in kwargs:
        kwargs["weights"] = None  # keras.applications' own default is "imagenet": a download (UNTRAINED)
    if "variant" in kwargs and "variant" not in parameters:
        log.warning("model %s takes no variant: model.variant=%s ignored", target, kwargs.pop("variant"))
    try:
        supplied = {**spec_arguments(fn, MNIST), **{k: None for k in SPEC_ARGUMENTS[2:] if k in parameters}}
        inspect.signature(fn).bind(**supplied, **kwargs)  # whatever the data, its arguments are supplied
    except TypeError as e:
        raise ConfigError(f"model._target_={target!r} does not take these options: {e}") from None
    return FunctionModel(name=str(rest.get("name") or fn.__name__), target=target, kwargs=kwargs)


MODELS = Registry("model", __name__, from_function=from_function)


def variants(name: str) -> tuple[str | None, ...]:
    """A registered model's variants (the choices of its `variant` option), or (None,) when it has none."""
    import typing

    from runner.registry import fields

    return typing.get_args(fields(MODELS.get(name)).get("variant", typing.Literal[None]))
