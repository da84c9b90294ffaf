"""Text as a language model reads it: a stream of token ids cut into windows, each window's labels the next token.

A training example is the window of `length` tokens from a start, its labels the tokens one position on, as
nanoGPT's `get_batch` draws them; the starts are every position, in an order fixed by the seed (an epoch visits each
once). The validation examples are consecutive windows, so an evaluation scores each token once. Only the streams
are held in memory; a batch is gathered from the stream in one op.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from runner.data_pipelines import DataError, Spec
from runner.data_pipelines.common import Arrays, Indexed, array_digest, eval_batches, eval_dataset, mapped_rows


def characters(text: str, vocabulary: str) -> np.ndarray:
    """`text` as ids into `vocabulary` (one character each), uint8 where it has at most 256 characters."""
    lookup = np.full(max(map(ord, vocabulary)) + 1, -1, np.int64)
    lookup[[ord(c) for c in vocabulary]] = np.arange(len(vocabulary))
    codes = np.frombuffer(text.encode("utf-32-le"), np.uint32)
    if codes.max(initial=0) >= len(lookup) or (ids := lookup[codes]).min(initial=0) < 0:
        unknown = sorted(set(text) - set(vocabulary))
        raise DataError(f"the text has characters outside its vocabulary: {''.join(unknown)[:20]!r}")
    return ids.astype(np.uint8 if len(vocabulary) <= 256 else np.int32)


@dataclass(frozen=True)
class Windows(Indexed):
    """A language model's indexed examples (`y` unused), from a tensor or a memory-mapped array `x`: a token stream
    (n,) whose index i is the window starting at i, or token sequences (n, length + 1) whose index i is row i."""

    def take(self, i: Any) -> tuple[Any, Any]:
        """Ids (b, length) and their next tokens (b, length), in one gather (or one read a window or row)."""
        import tensorflow as tf

        width = self.spec.shape[0] + 1 if len(self.x.shape) == 1 else None  # a stream's windows, else rows
        if isinstance(self.x, np.memmap):
            rows = mapped_rows(self.x, i, width)
        elif width:
            rows = tf.gather(self.x, tf.cast(i, tf.int64)[:, None] + tf.range(width, dtype=tf.int64))
        else:
            rows = tf.gather(self.x, i)  # (b, length + 1)
        return rows[:, :-1], rows[:, 1:]


@dataclass(frozen=True)
class Stream:
    """A dataset's text as the runner trains on it (the `Data` contract): a training and a validation stream."""

    train_ids: np.ndarray  # (n,) token ids
    test_ids: np.ndarray  # (m,) token ids
    spec: Spec
    seed: int
    train_limit: int | None = None  # the first N windows of the seed's order
    synthetic: bool = False

    @property
    def train_size(self) -> int:
        windows = len(self.train_ids) - self.spec.shape[0]
        return min(windows, self.train_limit) if self.train_limit else windows

    @property
    def test_size(self) -> int:
        return (len(self.test_ids) - 1) // self.spec.shape[0]

    def train(self) -> Windows:
        import tensorflow as tf

        # every window's start in the training stream, in the seed's order (int32: 4 bytes a start)
        starts = np.random.default_rng(self.seed).permutation(len(self.train_ids) - self.spec.shape[0])
        return Windows(tf.constant(self.train_ids), None, starts[: self.train_limit].astype(np.int32), self.spec)

    def test(self, limit: int | None = None) -> Any:
        """Consecutive windows of the validation stream: ids (k, length) and next tokens (k, length)."""
        length, count = self.spec.shape[0], min(self.test_size, limit or self.test_size)
        x = self.test_ids[: count * length].reshape(count, length)
        y = self.test_ids[1: count * length + 1].reshape(count, length)
        return eval_dataset(x, y, self.spec)

    def digest(self, split: str) -> str:
        ids = self.train_ids if split == "train" else self.test_ids
        return array_digest(ids)


@dataclass(frozen=True)
class MappedStream(Stream):
    """A user's token stream in memory-mapped files (nanoGPT's `train.bin` layout as .npy), read a window at a time.
    The training windows start at every position in stored order, shuffled by the pipeline's buffer (a permutation of
    every start, as `Stream`'s, would hold 4 bytes a token in memory)."""

    def train(self) -> Windows:
        return Windows(self.train_ids, None, range(self.train_size), self.spec)

    def test(self, limit: int | None = None) -> Any:
        length, count = self.spec.shape[0], min(self.test_size, limit or self.test_size)
        return eval_batches(Windows(self.test_ids, None, range(0, count * length, length), self.spec))


@dataclass(frozen=True)
class SequenceFiles(Arrays):
    """A user's token sequences (n, length + 1) without labels (`y_train`, `y_test` None), as a language model trains
    on them: every row is an example, each of its positions labelled with the next id."""

    def __post_init__(self) -> None:
        """Rows of length + 1 ids, unlabelled: data=files checked them as it read them (`Files._vocabulary`)."""

    def _examples(self, x: np.ndarray) -> Windows:
        return Windows(x, None, range(len(x)), self.spec)

    def train(self) -> Windows:
        return self._examples(self.x_train)

    def test(self, limit: int | None = None) -> Any:
        return eval_batches(self._examples(self.x_test[:limit]))


def split_by_position(ids: np.ndarray, validation: float, length: int, source: str) -> tuple[np.ndarray, np.ndarray]:
    """The first (1 - validation) of the stream for training, the rest for validation (nanoGPT: 90% / 10%)."""
    cut = int(len(ids) * (1 - validation))
    if cut <= length or len(ids) - cut <= length:
        raise DataError(f"{source}: {len(ids)} tokens leave fewer than sequence_length={length} + 1 on a side of "
                        f"the {1 - validation:.0%} / {validation:.0%} split; use a shorter data.sequence_length")
    return ids[:cut], ids[cut:]


def synthetic_stream(tokens: int, vocabulary: int, seed: int, split: int = 0, words: int | None = None) -> np.ndarray:
    """`tokens` ids below `vocabulary` with structure a model can learn: a fixed dictionary of `words` (default:
    vocabulary / 2, at least 8) random words of 2 to 8 ids, drawn at random one after the other, so the loss a model
    can reach is far below log(vocabulary) (uniform noise). `split` draws another text (0: training, 1: validation)
    from the same dictionary."""
    words = words or max(8, vocabulary // 2)  # fewer words: a text learnt in fewer steps
    rng = np.random.default_rng(seed)
    lengths = rng.integers(2, 9, words)  # (words,)
    dictionary = rng.integers(0, vocabulary, lengths.sum())  # every word's ids, one after the other
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]])
    drawn = np.random.default_rng([seed, split]).integers(0, words, tokens // 2 + 1)  # each word has >= 2 ids
    sizes = lengths[drawn]
    offsets = np.arange(sizes.sum()) - np.repeat(np.cumsum(sizes) - sizes, sizes)  # position within its word
    ids = dictionary[np.repeat(starts[drawn], sizes) + offsets][:tokens]
    return ids.astype(np.uint8 if vocabulary <= 256 else np.int32)
