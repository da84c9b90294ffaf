"""Any `keras.applications` constructor, untrained, built for the data's spec: `model=keras_app model.app=ResNet50`.

The runner passes what the data says (`spec_arguments`) and `weights=None` (no download: the weights are initialised
from the seed); `model.options` are the constructor's other keyword arguments, e.g. `+model.options.alpha=0.35`.
"""

from __future__ import annotations

import importlib.util
import logging
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Literal

from runner.data_pipelines import MNIST, Spec
from runner.errors import ConfigError
from runner.lazy import keras
from runner.models import MODELS, ModelOptions, check_untrained, spec_arguments
from runner.registry import Rule

log = logging.getLogger(__name__)
TINY_ALPHA = 0.35  # variant=tiny: the narrowest width multiplier MobileNetV2 has pretrained weights for
SMALLEST = 32  # the least height and width keras.applications' constructors take (a few need more: they say so)


def applications() -> tuple[str, ...]:
    """The model constructors keras.applications exports, read from its export list without importing Keras (so
    validation stays free of TensorFlow)."""
    spec = importlib.util.find_spec("keras")
    if spec is None or not spec.submodule_search_locations:
        return ()
    exports = Path(list(spec.submodule_search_locations)[0]) / "applications" / "__init__.py"
    text = exports.read_text() if exports.is_file() else ""
    return tuple(sorted(set(re.findall(r"\b([A-Z]\w*) as \1\b", text))))  # "ResNet50 as ResNet50", ...


APPLICATIONS = applications()
RESERVED = ("input_shape", "classes", "classifier_activation", "include_top", "input_tensor")  # and weights (null)


@MODELS.register
@dataclass
class KerasApp(ModelOptions):
    """A keras.applications network, untrained, with the data's input shape and classes."""

    name: str = "keras_app"
    # the constructor's name in keras.applications: ResNet50, EfficientNetB0, ConvNeXtTiny, ...
    app: str = "MobileNetV2"
    options: dict[str, Any] = field(default_factory=dict)  # the constructor's other keyword arguments
    variant: Literal["default", "tiny"] = "default"  # tiny: alpha=0.35 where the constructor has a width (MobileNets)

    RULES: ClassVar[dict[str, Rule]] = {
        "app": (lambda v: v in APPLICATIONS, f"a keras.applications constructor: {', '.join(APPLICATIONS)}"),
        "options": (lambda v: not set(v) & set(RESERVED),
                    f"keyword arguments other than {', '.join(RESERVED)} (the runner sets those); weights: null"),
    }

    def check(self, spec: Spec) -> None:
        check_untrained("model.options", self.options)
        self.too_small(spec, SMALLEST)

    def label(self) -> str:
        """The network it builds, `ResNet50/default`: every keras.applications model was `keras_app/default`."""
        return f"{self.app}/{self.variant}"

    def build(self, spec: Spec = MNIST):
        """The untrained network mapping (batch, *spec.shape) images to (batch, spec.classes) logits."""
        fn = getattr(keras.applications, self.app)
        return fn(**{"weights": None, **spec_arguments(fn, spec), **self._options(fn)})

    def _options(self, fn: Any) -> dict[str, Any]:
        """`options`, with variant=tiny's width where the constructor takes one."""
        import inspect

        options, parameters = dict(self.options), inspect.signature(fn).parameters
        if self.variant == "tiny":
            if "alpha" in parameters:
                options.setdefault("alpha", TINY_ALPHA)
            else:
                log.warning("model.variant=tiny: keras.applications.%s has no width to narrow; built full size",
                            self.app)
        unknown = [k for k in options if k not in parameters]
        if unknown:
            raise ConfigError(f"model.options.{unknown[0]}: keras.applications.{self.app} takes no such argument")
        return options
