"""`from runner.lazy import keras, tf`: TensorFlow and Keras imported on their first attribute use.

Component modules define their options beside their TensorFlow code, and config validation reads those options
before TensorFlow may be imported (the devices must be configured first, and a bad config should fail fast), so they
refer to TensorFlow and Keras through these proxies; type checkers see the real modules.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any


class lazy:  # lower case: called like a function, `tf = lazy("tensorflow")`
    """A proxy for module `name`, imported when an attribute is first read (not at this call)."""

    def __init__(self, name: str):
        self._name = name

    def __getattr__(self, attr: str) -> Any:
        return getattr(importlib.import_module(self._name), attr)

    def __repr__(self) -> str:
        return f"<lazy module {self._name!r}>"


if TYPE_CHECKING:
    import keras
    import tensorflow as tf
else:
    keras, tf = lazy("keras"), lazy("tensorflow")
