"""Models: one module each, holding a dataclass of the model's options whose `build()` returns a Keras model.

The contract is `Model` below. A module imports Keras inside `build`, never at top level, so config validation
reads the options without loading TensorFlow. Adding a model is one module here (a dataclass registered with
`@MODELS.register`, see `lenet.py`) plus one YAML in conf/model/. A user's own model needs neither: a YAML in
their config directory whose `_target_` names their dataclass, or any function returning a Keras model.
"""

from __future__ import annotations

import inspect
import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, ClassVar, Protocol, runtime_checkable

from runner.errors import ConfigError
from runner.registry import Registry

if TYPE_CHECKING:
    import keras

log = logging.getLogger(__name__)
INPUT_SHAPE = (28, 28, 1)  # every model takes MNIST-shaped images, float32 in [0, 1]
NUM_CLASSES = 10


@runtime_checkable
class Model(Protocol):
    """What the runner needs of a model's options."""

    name: str
    target_accuracy: float | None  # the test accuracy a run of it is timed to by default (None: no default target)

    def build(self) -> keras.Model:
        """A fresh, uncompiled model mapping (batch, 28, 28, 1) images to (batch, 10) logits (Keras' current seed)."""

    def layers_with_weights(self) -> int | None:
        """How many layers have weights (the most stages `strategy.split=stages` can cut); None: known once built."""

    def activations_per_example(self) -> int | None:
        """Floats the layers compute per example (their outputs; reshapes and dropout not counted), for validation's
        memory estimate; None: unknown."""

    @property
    def dense_only(self) -> bool:
        """Whether every layer with weights is Dense (`strategy.split=width` applies)."""


@dataclass
class ModelOptions:
    """Base of the built-in models: what a model does not know until built is None / False."""

    name: str = ""

    target_accuracy: ClassVar[float | None] = None

    def layers_with_weights(self) -> int | None:
        return None

    def activations_per_example(self) -> int | None:
        return None

    @property
    def dense_only(self) -> bool:
        return False


@dataclass
class FunctionModel(ModelOptions):
    """A user's function that returns a Keras model, called with the other keys of its YAML as keyword arguments."""

    target: str = ""
    kwargs: dict[str, Any] = field(default_factory=dict)

    def build(self) -> keras.Model:
        from runner.registry import locate

        return locate(self.target, "model")(**self.kwargs)


def from_function(target: str, fn: Callable[..., Any], rest: dict[str, Any]) -> FunctionModel:
    """A FunctionModel for `fn`, its keyword arguments checked against its signature now (before TensorFlow).

    `variant` is the runner's size selector (the smoke preset asks for `tiny`): passed on when the function takes
    it, else left out with a warning, since a function without it has one size.
    """
    kwargs = {k: v for k, v in rest.items() if k != "name"}
    parameters = inspect.signature(fn).parameters
    if "variant" in kwargs and "variant" not in parameters:
        log.warning("model %s takes no variant: model.variant=%s ignored", target, kwargs.pop("variant"))
    try:
        inspect.signature(fn).bind(**kwargs)
    except TypeError as e:
        raise ConfigError(f"model._target_={target!r} does not take these options: {e}") from None
    return FunctionModel(name=str(rest.get("name") or fn.__name__), target=target, kwargs=kwargs)


MODELS = Registry("model", __name__, from_function=from_function)


def variants(name: str) -> tuple[str | None, ...]:
    """A registered model's variants (the choices of its `variant` option), or (None,) when it has none."""
    import typing

    from runner.registry import fields

    return typing.get_args(fields(MODELS.get(name)).get("variant", typing.Literal[None]))
