"""Datasets (what examples a run trains on) and pipelines (how each step's batches reach the towers).

Each is a dataclass of its options registered with its kind's registry: a dataset (contract `Dataset`) loads the
examples without TensorFlow, so a bad data path fails before TensorFlow starts; a pipeline (contract `Pipeline`)
turns them into per-tower batches inside the compiled loop (`towers`), or feeds tf.distribute's input API
(`distribute`). Modules import TensorFlow inside their functions; `common.py` holds the tf.data stages they share.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Protocol, runtime_checkable

from runner.errors import UserError
from runner.registry import Registry, Rule, non_negative, positive
from runner.tasks import TASKS, Task

if TYPE_CHECKING:
    from runner.data_pipelines.common import Data, Examples


class DataError(UserError):
    """A dataset's data is missing or invalid; the message is one line saying what and how to fix it."""


# What a run's throughput counts (`<unit>_per_sec`): Spec.unit is one of them.
UNITS = ("images", "tokens", "examples")


def rate_unit(names: Any) -> str | None:
    """Which unit a run's figures count, from their names (`<unit>_per_sec`, or `<unit>_per_sec.missing` where it
    timed nothing); None if none says."""
    return next((u for u in UNITS if f"{u}_per_sec" in names or f"{u}_per_sec.missing" in names), None)


@dataclass(frozen=True)
class Feature:
    """One named input of an example made of several (`Spec.features`): `shape` stored as `dtype`; where it holds
    categorical ids ("int32"), column k's ids are below `vocabularies[k]` (one embedding table per column)."""

    name: str
    shape: tuple[int, ...]
    dtype: str  # "float32" values or "int32" ids
    vocabularies: tuple[int, ...] = ()  # int32 ids: one vocabulary per column of the last axis

    def __str__(self) -> str:
        if not self.vocabularies:
            return f"{self.name} {'x'.join(map(str, self.shape))} {self.dtype}"
        return f"{self.name} {'x'.join(map(str, self.shape))} ids (vocabularies {min(self.vocabularies):,} to " \
               f"{max(self.vocabularies):,})"


@dataclass(frozen=True)
class Spec:
    """The task contract: what one example is, what is learned from it, and how a run counts its throughput.

    The input is `shape` stored as `dtype`: an image (height, width, channels), a sequence (length,) of token ids
    below `vocabulary`, or named `features` given to the model as a dict (then `shape` is () and `dtype`
    "features"). `target` names the task (`runner.tasks.TASKS`: the loss, the metrics, the labels). Datasets declare
    it without TensorFlow; models are built for it and every later stage reads shapes and units from it.
    """

    shape: tuple[int, ...]
    classes: int
    dtype: str = "uint8"  # "uint8" images (scaled by 1/255), "float32" images (as is), "int32" token ids, "features"
    target: str = "class"  # the task's name in runner.tasks.TASKS: "class", "next_token", "binary"
    vocabulary: int = 0  # token ids are below it (0: the input is not token ids)
    features: tuple[Feature, ...] = ()  # named inputs (dtype "features")

    def __str__(self) -> str:
        what = self.task.said.format(classes=self.classes)
        if self.features:
            return f"examples of {', '.join(map(str, self.features))}, {what}"
        if self.images:
            return f"{'x'.join(map(str, self.shape))} {self.dtype} images, {what}"
        if not self.token_ids:  # a user's array of values that is not an image: (n,) features, (t, c) series
            return f"{'x'.join(map(str, self.shape))} {self.dtype} values an example, {what}"
        return f"sequences of {self.shape[0]} token ids below {self.vocabulary}, {what}"

    @property
    def task(self) -> Task:
        return TASKS[self.target]

    @property
    def token_ids(self) -> bool:
        """Whether an example is a sequence of token ids (else an image or named features)."""
        return self.dtype == "int32"

    @property
    def images(self) -> bool:
        """Whether an example is an image: (height, width, channels) values (not token ids, named features, or a
        user's array of another rank)."""
        return not self.token_ids and not self.features and len(self.shape) == 3

    @property
    def unit(self) -> str:
        """What a run's throughput counts (one of UNITS): tokens where every position is labelled, images, else
        examples."""
        if self.task.per_position:
            return "tokens"
        return "images" if self.images else "examples"

    @property
    def rate_key(self) -> str:
        return f"{self.unit}_per_sec"

    @property
    def units_per_example(self) -> int:
        """Units in one example: its tokens for a language model, else 1."""
        return self.shape[0] if self.unit == "tokens" else 1

    @property
    def labels_shape(self) -> tuple[int, ...]:
        """One example's labels: () for one per example, (length,) for one at every position (the task's)."""
        return self.shape[:1] if self.task.per_position else ()

    @property
    def outputs_shape(self) -> tuple[int, ...]:
        """One example's outputs: one where the task has one output, else a logit per class (per position)."""
        return (1,) if self.task.one_output else (*self.labels_shape, self.classes)

    @property
    def input_bytes(self) -> int:
        """Bytes of one example's input as a model takes it (float32 values, int32 ids: 4 bytes each)."""
        if self.features:
            return sum(4 * math.prod(f.shape) for f in self.features)
        return 4 * math.prod(self.shape)


MNIST = Spec((28, 28, 1), 10)  # the default data's examples


def language_model(length: int, vocabulary: int) -> Spec:
    """A language model's examples: `length` token ids below `vocabulary`, each labelled with the next id."""
    return Spec((length,), vocabulary, "int32", "next_token", vocabulary)


# `data.shape` where a dataset takes one: what the images are (synthetic) or are resized to (files, tfds)
IMAGE_SHAPE: Rule = (lambda v: v is not None and len(v) == 3 and all(d > 0 for d in v),
                     "[height, width, channels] of positive integers")
IMAGE_SHAPE_OR_NULL: Rule = (lambda v: v is None or IMAGE_SHAPE[0](v), f"{IMAGE_SHAPE[1]}, or null")


ID_LIMIT = 2**31  # token ids are int32 once batched (`to_float`) and index an embedding: each below this


# `data.vocabulary_sizes` where click logs take one (clicks, files): one table size per categorical column.
TABLE_SIZES: Rule = (lambda v: v is None or (isinstance(v, (list, tuple)) and len(v) > 0
                                             and all(type(x) is int and 1 <= x <= ID_LIMIT for x in v)),
                     "null or a list of table sizes, one per categorical column, each an integer from 1 to 2**31 (ids "
                     "are int32)")


@runtime_checkable
class Dataset(Protocol):
    """What the runner needs of a dataset's options."""

    name: str

    def spec(self) -> Spec:
        """What its examples are, known without loading them and without TensorFlow."""

    def load(self, seed: int) -> Data:
        """The train and test examples (in-memory data read now: a bad path fails before TensorFlow)."""

    def train_examples(self) -> int | None:
        """How many training examples `load` will give, if known without loading them (None: not known)."""

    def describe(self) -> str:
        """Where the examples come from, in a few words (the run's dataset source)."""

    def in_memory_bytes(self) -> int:
        """Bytes `load` holds in memory where that can be large; validation checks they fit (0: small or streamed)."""


class Batches(Protocol):
    """A feed made by a pipeline: `next()` is called inside the compiled loop, once per step."""

    def next(self) -> list[tuple[Any, Any]]:
        """One (inputs (b, *spec.shape), labels (b, *spec.labels_shape)) pair per tower, b = global batch / towers."""


@runtime_checkable
class Pipeline(Protocol):
    """What the runner needs of a pipeline's options (`PipelineOptions` gives the host-side ones defaults)."""

    name: str
    # host-side tf.data options, read by every feed of examples (`Examples.batched`): -1 is tf.data.AUTOTUNE
    prefetch: int
    map_parallelism: int
    private_threads: int  # 0: TensorFlow's shared thread pool

    def towers(self, examples: Examples, global_batch: int, devices: list[str], seed: int) -> Batches:
        """A feed of one batch per device per step."""

    def distribute(self, strategy: Any, examples: Examples, global_batch: int, seed: int) -> Any:
        """The same feed through tf.distribute's input API: an iterator of per-replica batches."""

    def check(self, towers: int, train_examples: int | None) -> None:
        """Raise ConfigError (one line) when this pipeline cannot feed `towers` from that many examples."""


@dataclass
class PipelineOptions:
    """The host-side tf.data options every pipeline shares."""

    name: str = ""
    shuffle_buffer: int = 10000  # examples shuffled together (a window; files: a buffer); 0 disables shuffling
    prefetch: int = -1  # batches prefetched on the host; -1 = tf.data.AUTOTUNE
    map_parallelism: int = -1  # parallel uint8->float conversions; -1 = AUTOTUNE
    private_threads: int = 0  # >0: a private tf.data thread pool of this size; 0: TensorFlow's shared pool

    RULES: ClassVar[dict[str, Rule]] = {
        "shuffle_buffer": (non_negative, "0 (no shuffle) or a positive integer"),
        "prefetch": (lambda v: v >= -1, "-1 (AUTOTUNE), 0 or a positive integer"),
        "map_parallelism": (lambda v: v == -1 or v > 0, "-1 (AUTOTUNE) or a positive integer"),
        "private_threads": (non_negative, "0 (shared pool) or a positive integer"),
    }

    def check(self, towers: int, train_examples: int | None) -> None:
        """One iterator feeds every tower: any number of examples will do (they repeat)."""


@dataclass
class DatasetOptions:
    """Limits every dataset takes: use only the first N examples of each split (None: all of them); and the `Dataset`
    contract's defaults: train_limit training examples, `data=<name>` as the source, nothing large in memory."""

    name: str = ""
    train_limit: int | None = None
    test_limit: int | None = None

    RULES: ClassVar[dict[str, Rule]] = {
        "train_limit": (positive, "a positive integer or null"),
        "test_limit": (positive, "a positive integer or null"),
    }

    def train_examples(self) -> int | None:
        return self.train_limit

    def describe(self) -> str:
        return f"data={self.name}"

    def in_memory_bytes(self) -> int:
        return 0


DATASETS = Registry("data", __name__)
PIPELINES = Registry("pipeline", __name__)
