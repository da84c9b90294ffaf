"""What every pipeline shares: the examples a dataset gives, and the host-side tf.data stages.

A dataset's `load` returns `Data`; its training `Examples` are what the pipelines consume (shard, shuffle and
repeat, batch): `Indexed` examples (arrays in memory or memory-mapped), or `Records` streamed from files
(runner.data_pipelines.records). Examples stay in their stored dtype until batched: one vectorised conversion a
batch is far cheaper than one a example, and keeps in-memory data small.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Protocol

import numpy as np

from runner.data_pipelines import MNIST, DataError, PipelineOptions, Spec

EVAL_BATCH = 1000  # evaluation batch; the last partial batch is kept, so every test example counts
# An in-memory test set's float batches are kept after the first evaluation up to this size; larger ones (which the
# memory check does not count) are converted every time.
EVAL_CACHE_BYTES = 256 << 20
CHUNK = 1 << 16  # indices a block when unshuffled (`Indexed.blocks`)


class Examples(Protocol):
    """Training examples as the pipelines consume them."""

    spec: Spec

    def shard(self, shards: int, index: int) -> Examples:
        """Shard `index` of `shards`: disjoint, together every example once."""

    def shuffled(self, buffer: int, seed: int) -> Examples:
        """Shuffled with a `buffer`-example buffer (0: stored order), reshuffled every epoch, repeated forever."""

    def batched(self, batch: int, opts: Any, drop_remainder: bool = True) -> Any:
        """A tf.data.Dataset of (inputs, labels) batches as `to_float` gives them, prefetched on the host; `opts`:
        PipelineOptions."""


class Data(Protocol):
    """What a dataset's `load` returns."""

    spec: Spec
    synthetic: bool  # random content: accuracy means nothing

    @property
    def train_size(self) -> int: ...

    @property
    def test_size(self) -> int: ...

    def train(self) -> Examples:
        """The training examples in their stored order."""

    def test(self, limit: int | None = None) -> Any:
        """The first `limit` (None: all) test examples in float batches of EVAL_BATCH, the last partial one kept."""

    def digest(self, split: str) -> str:
        """A short digest of a split's examples ("train" or "test"), for the MLflow dataset record."""


@dataclass(frozen=True)
class Arrays:
    """Examples held as numpy arrays: images (n, *spec.shape) (MNIST's (n, 28, 28) too), or named features
    (`Spec.features`: `x_train` and `x_test` dicts of arrays (n, *feature.shape)); labels (n,) in the task's dtype.
    Memory-mapped inputs stay on disk, read a batch at a time; their labels are held in memory."""

    x_train: np.ndarray
    y_train: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray
    synthetic: bool
    spec: Spec = MNIST

    def __post_init__(self) -> None:
        for split in ("train", "test"):
            check_split(self.spec, split, getattr(self, f"x_{split}"), getattr(self, f"y_{split}"))

    @property
    def train_size(self) -> int:
        return count_examples(self.x_train)

    @property
    def test_size(self) -> int:
        return count_examples(self.x_test)

    def train(self) -> Indexed:
        return examples(self.x_train, self.y_train, self.spec)

    def test(self, limit: int | None = None) -> Any:
        x, y = self.x_test, self.y_test[:limit]
        x = {k: v[:limit] for k, v in x.items()} if isinstance(x, dict) else x[:limit]
        if isinstance(x, np.memmap):
            return eval_batches(examples(x, y, self.spec))
        return eval_dataset(x, y, self.spec)

    def digest(self, split: str) -> str:
        x, y = (self.x_train, self.y_train) if split == "train" else (self.x_test, self.y_test)
        return array_digest(x, y)


def check_split(spec: Spec, split: str, x: Any, y: np.ndarray) -> None:
    """Refuse, in one line, examples and labels that do not match each other or `spec` (a user's `load` builds
    `Arrays` of them: a mismatch would surface as a shape error of the model's loss, or a label out of range as
    TensorFlow's op error); the image spec (h, w, 1) takes (n, h, w) images too (MNIST's)."""
    n, shape = count_examples(x), tuple(spec.shape)
    if n != len(y):
        raise DataError(f"Arrays: x_{split} has {n} examples and y_{split} {len(y)} labels; give one label each")
    takes = [shape, shape[:-1]] if len(shape) == 3 and shape[-1] == 1 else [shape]
    if not isinstance(x, dict) and tuple(x.shape[1:]) not in takes:
        raise DataError(f"Arrays: x_{split} {tuple(x.shape)} holds examples of shape {tuple(x.shape[1:])}; its spec "
                        f"({spec}) takes {shape}: make the dataset's spec() say what load gives")
    if spec.target == "class" and n:
        low, high = int(np.min(y)), int(np.max(y))
        if low < 0 or high >= spec.classes:
            raise DataError(f"Arrays: y_{split} has labels {low} to {high}; its spec's {spec.classes} classes "
                            f"(Spec.classes) take 0 to {spec.classes - 1}")


def count_examples(x: Any) -> int:
    """The examples in `x`: an array's rows, or those of each array of a dict of named features."""
    return len(next(iter(x.values()))) if isinstance(x, dict) else len(x)


def array_digest(x: Any, y: np.ndarray | None = None) -> str:
    """sha256 of the examples' and labels' (if any) bytes, read in place (8 hex digits): of named features each
    feature's, in name order; of a memory-mapped array only its shape and first 2**20 values (not the whole file into
    memory)."""
    digest = hashlib.sha256()
    for part in [v for _, v in sorted(x.items())] if isinstance(x, dict) else [x]:
        if isinstance(part, np.memmap):
            digest.update(repr((part.shape, part.dtype.str)).encode() + part.reshape(-1)[: 1 << 20].tobytes())
        else:
            digest.update(np.ascontiguousarray(part).data)
    if y is not None:
        digest.update(np.ascontiguousarray(y).data)
    return digest.hexdigest()[:8]


@dataclass(frozen=True)
class Indexed:
    """Examples addressable by index. Batches of indices are made whole, a block of them at a time (tf.data's
    shuffle and batch cost about 0.5 us an example on the host's cores: 0.28 ms a 512-example batch, 0.07 so), and
    each batch then gathers its examples in one op."""

    x: Any  # (n, ...) examples in their stored dtype: a tf.Tensor, or a memory-mapped numpy array; or a dict of them
    y: Any  # (n,) labels in the task's dtype (int32 classes): a tf.Tensor
    order: Any  # the indices into x and y to read, in order: a `range` (all of them, a shard: kept lazy) or an array
    spec: Spec = field(default=MNIST)
    buffer: int | None = None  # None: one pass in order; 0: in order, repeated; N: shuffled N at a time, repeated
    seed: int = 0

    def shard(self, shards: int, index: int) -> Indexed:
        """Examples index, index + shards, index + 2 shards, ... of `order`."""
        return replace(self, order=self.order[index::shards])

    def shuffled(self, buffer: int, seed: int) -> Indexed:
        """Endless, each consecutive `buffer` indices of `order` permuted (afresh each epoch, by the seed); an
        epoch's tail is not dropped by drop_remainder, it starts the next batch."""
        return replace(self, buffer=buffer, seed=seed)

    def blocks(self) -> Any:
        """A tf.data.Dataset of (k,) int64 index blocks: `order` in CHUNK-index blocks, or under `shuffled` its
        `buffer`-index windows each permuted (stateless: the seed and the block's number in the stream)."""
        import tensorflow as tf

        n, size = len(self.order), self.buffer or CHUNK
        count = -(-n // size)  # blocks an epoch
        order = self.order if isinstance(self.order, range) else tf.constant(np.asarray(self.order))

        def block(k: Any) -> Any:
            lo = (k % count) * size
            at = tf.range(lo, tf.minimum(lo + size, n), dtype=tf.int64)  # positions in `order`
            ids = order.start + order.step * at if isinstance(order, range) else tf.cast(tf.gather(order, at), tf.int64)
            return tf.random.experimental.stateless_shuffle(ids, tf.stack([self.seed, k])) if self.buffer else ids

        numbers = tf.data.Dataset.range(count) if self.buffer is None else tf.data.Dataset.counter()
        return numbers.map(block)

    def take(self, i: Any) -> tuple[Any, Any]:
        """The stored examples and labels at indices `i` (b,): one gather, or one numpy read of a memory-mapped file."""
        import tensorflow as tf

        if isinstance(self.x, np.memmap):
            return mapped_rows(self.x, i), tf.gather(self.y, i)
        return tf.nest.map_structure(lambda a: tf.gather(a, i), self.x), tf.gather(self.y, i)  # a dict: each feature's

    def batched(self, batch: int, opts: Any, drop_remainder: bool = True) -> Any:
        def gather(i):  # i: (batch,) int64 indices
            return to_float(*self.take(i), self.spec)

        out = self.blocks().rebatch(batch, drop_remainder=drop_remainder)
        return finish(out.map(gather, num_parallel_calls=autotune(opts.map_parallelism)), opts)


def mapped_rows(x: np.memmap, i: Any, width: int | None = None) -> Any:
    """Rows `i` (b,) of a memory-mapped array whose first row starts at its file offset (the whole array, or a leading
    slice), inside a tf.data map: a tensor of the stored dtype, its shape set; `width`: of a 1-D array (a token
    stream), the `width` values from each of `i` (b, width). Read with pread so that the page cache keeps them, not
    this process's resident set (indexing the mapping would)."""
    import tensorflow as tf

    assert x.flags.c_contiguous, "a memory-mapped .npy array is stored in C order"
    shape = x.shape[1:] if width is None else (width,)

    def read(rows: np.ndarray) -> np.ndarray:
        out = np.empty((len(rows), *shape), x.dtype)
        flat = out.reshape(len(rows), -1).view(np.uint8)  # (b, bytes a row)
        fd = os.open(x.filename, os.O_RDONLY)
        try:
            for k, r in enumerate(rows):  # a row (or a window) starts x.strides[0] bytes after the one before it
                flat[k] = np.frombuffer(os.pread(fd, flat.shape[1], x.offset + int(r) * x.strides[0]), np.uint8)
        finally:
            os.close(fd)
        return out

    rows = tf.numpy_function(read, [i], tf.as_dtype(x.dtype))
    rows.set_shape((None, *shape))
    return rows


def examples(x: Any, y: Any, spec: Spec = MNIST) -> Indexed:
    """The examples in their stored order and dtype (labels in the task's, in memory); memory-mapped inputs stay on
    disk."""
    import tensorflow as tf

    x = x if isinstance(x, np.memmap) else tf.nest.map_structure(tf.constant, x)
    return Indexed(x, tf.constant(np.asarray(y, spec.task.labels_dtype)), range(len(y)), spec)


def to_float(x, y, spec: Spec = MNIST):
    """Stored examples -> what the model takes (`Spec`): float32 images (uint8 scaled to [0, 1]), int32 token ids,
    or a dict of named features; labels in the task's dtype (b, *spec.labels_shape)."""
    import tensorflow as tf

    y = tf.reshape(tf.cast(y, spec.task.labels_dtype), (-1, *spec.labels_shape))
    if spec.features:
        return {f.name: tf.cast(x[f.name], f.dtype) for f in spec.features}, y
    if spec.token_ids:
        return tf.reshape(tf.cast(x, tf.int32), (-1, *spec.shape)), y
    x = tf.reshape(tf.cast(x, tf.float32), (-1, *spec.shape))
    return (x / 255.0 if spec.dtype == "uint8" else x), y


def autotune(value: int) -> int:
    import tensorflow as tf

    return tf.data.AUTOTUNE if value == -1 else value


def finish(ds: Any, opts: Any) -> Any:
    """Prefetch on the host; `opts.private_threads` > 0 gives this pipeline its own thread pool of that size."""
    import tensorflow as tf

    out = ds.prefetch(autotune(opts.prefetch))
    if opts.private_threads:
        options = tf.data.Options()
        options.threading.private_threadpool_size = opts.private_threads
        out = out.with_options(options)
    return out


@dataclass(frozen=True)
class Feed:
    """A pipeline's feed (the `Batches` contract): `next()`, called inside the compiled loop, gives a batch a tower."""

    next: Callable[[], list[tuple[Any, Any]]]


def per_tower_batch(global_batch: int, towers: int) -> int:
    """Examples each tower gets per step (config validation guarantees divisibility)."""
    assert global_batch % towers == 0, (global_batch, towers)
    return global_batch // towers


def eval_batches(ds: Examples) -> Any:
    """Examples in their stored order, in float batches of EVAL_BATCH, the last partial batch kept."""
    return ds.batched(EVAL_BATCH, PipelineOptions(), drop_remainder=False)  # the pipelines' default host options


def eval_dataset(x: np.ndarray, y: np.ndarray, spec: Spec = MNIST):
    """An in-memory test set in batches of EVAL_BATCH, the last partial one kept; cached where small
    (EVAL_CACHE_BYTES)."""
    import tensorflow as tf

    ds = tf.data.Dataset.from_tensor_slices((x, y)).batch(EVAL_BATCH)
    ds = ds.map(lambda xb, yb: to_float(xb, yb, spec), num_parallel_calls=tf.data.AUTOTUNE)
    if spec.input_bytes * len(y) <= EVAL_CACHE_BYTES:  # float32 bytes
        ds = ds.cache()
    return ds.prefetch(tf.data.AUTOTUNE)
