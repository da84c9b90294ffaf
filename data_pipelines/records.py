"""Examples streamed from TFRecord files of serialized examples: shards in the layout tf_cnn_benchmarks and
TensorFlow's image models read (`data=files`), or a prepared TensorFlow Datasets dataset (`data=tfds`).

Nothing is held in memory: tf.data reads the files in parallel, decodes each record to the spec, shuffles within a
buffer and prefetches. `shard(N, i)` splits by file where there are at least N files, else by record.
"""

from __future__ import annotations

import hashlib
import os
import re
import struct
from dataclasses import dataclass, replace
from functools import cached_property
from typing import Any, Callable

from runner.data_pipelines import DataError, Spec
from runner.data_pipelines.common import autotune, eval_batches, finish, to_float

SHARDS = {"train": "train-*", "test": "validation-*"}  # the TFRecord layout's file patterns

IMAGE_KEY, LABEL_KEY = "image/encoded", "image/class/label"  # tf_cnn_benchmarks' and TF's ImageNet records
TOKENS_KEY = "input_ids"  # a token record's ids (keras_hub's and BERT's name); its class, if any, under "label"
# The decoders' assertion messages (`below`), which training turns into one DataError line (`refused`):
BAD_LABEL = "label out of range"  # a label outside 0 to data.classes - 1
BAD_TOKEN = "token id out of range"  # an id outside the vocabulary
BAD_CLICK = "click label not 0 or 1"  # a click record's label other than 0 or 1
BAD_ID = "categorical id out of range"  # a click record's id outside its column's table: [column, id]
BAD_DENSE = "dense value not finite"  # a click record's dense feature NaN or infinite: [position, value]
_APART = r"[\]\s\[]*"  # between the message and each value in TensorFlow's text: "[label out of range] [-3]"


HEADER = 12  # a record's header: its data's length (uint64, little-endian) and the length's masked CRC-32C (uint32)
DAMAGED = "write it again (tf.io.TFRecordWriter; a TFDS dataset: tfds build)"  # what to do about a damaged file
# A file's first bytes -> what it is and the command that turns it into what it should be, where a format's own
# check fails on it: compressed (gunzip and its kin refuse a name without their suffix), or text in UTF-16
WRAPPED = {b"\x1f\x8b": ("gzip-compressed", "gzip -dc"), b"BZh": ("bzip2-compressed", "bzip2 -dc"),
           b"\xfd7zXZ": ("xz-compressed", "xz -dc"), b"\x28\xb5\x2f\xfd": ("zstd-compressed", "zstd -dc"),
           b"\xff\xfe": ("UTF-16 text", "iconv -f UTF-16 -t UTF-8"), b"\xfe\xff": ("UTF-16 text", "iconv -f UTF-16 -t UTF-8")}


def wrapped(head: bytes, path: object) -> str:
    """What the file `path` starting with `head` is, when compressed or UTF-16, and the command that undoes it under
    its own name ('gzip-compressed: gzip -dc < F > F.tmp && mv F.tmp F'), else ''."""
    what, undo = next((found for magic, found in WRAPPED.items() if head.startswith(magic)), ("", ""))
    return f"{what}; undo it in place: {undo} < {path} > {path}.tmp && mv {path}.tmp {path}" if what else ""


def _crc32c_table() -> tuple[int, ...]:
    """CRC-32C's (Castagnoli, reflected polynomial 0x82F63B78) byte table: TFRecord's checksum."""
    table = []
    for byte in range(256):
        crc = byte
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 if crc & 1 else 0)
        table.append(crc)
    return tuple(table)


CRC32C = _crc32c_table()


def masked_crc32c(data: bytes) -> int:
    """TFRecord's masked CRC-32C of `data`: the CRC rotated right by 15 bits plus 0xa282ead8 (mod 2**32)."""
    crc = 0xFFFFFFFF
    for byte in data:
        crc = CRC32C[(crc ^ byte) & 0xFF] ^ (crc >> 8)
    crc ^= 0xFFFFFFFF
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def record_length(header: bytes, path: str, offset: int, size: int) -> int:
    """The data length in the header read at byte `offset` of the `size`-byte TFRecord file `path`; DataError
    (naming the file) unless the length passes its own checksum and the record ends within the file."""
    if len(header) == HEADER and struct.unpack("<I", header[8:])[0] != masked_crc32c(header[:8]):
        what = wrapped(header, path) if offset == 0 else ""
        raise DataError(f"{path} is not a TFRecord file: the record header at byte {offset} fails its checksum "
                        + (f"(it is {what})" if what else f"(damaged, or another format); {DAMAGED}"))
    length = struct.unpack("<Q", header[:8])[0] if len(header) == HEADER else size
    if offset + HEADER + length + 4 > size:
        raise DataError(f"{path} is not a whole TFRecord file: its last record ends past the file's end; {DAMAGED}")
    return length


def check_framing(files: tuple[str, ...]) -> int:
    """How many of the files hold a record, each one's first record header checked (`record_length`; no
    TensorFlow): a cheap check that finds files that are not TFRecord files before anything starts. DataError for a
    file that cannot be read."""
    holding = 0
    for path in files:
        try:
            with open(path, "rb") as f:
                header, size = f.read(HEADER), os.fstat(f.fileno()).st_size
        except OSError as e:
            raise DataError(f"{path} cannot be read ({e.strerror}); data shards must be readable files") from None
        if header:
            record_length(header, path, 0, size)
            holding += 1
    return holding


def count_records(path: str) -> int:
    """Records in a TFRecord file, from its headers alone (each checked: `record_length`; no TensorFlow)."""
    count, size = 0, os.path.getsize(path)
    with open(path, "rb") as f:
        while (offset := f.tell()) < size:
            f.seek(record_length(f.read(HEADER), path, offset, size) + 4, os.SEEK_CUR)
            count += 1
    return count


# serialized record -> (image float32 (H, W, C) in 0..255, label int32 ()), or (ids int32 (length,), label)
Decoder = Callable[[Any], tuple[Any, Any]]


def _unless(bad: Any, values: Any, message: str, column: bool) -> Any:
    """A context in which ops run only if no value of `values` is `bad`; else training stops with `message` and the
    first bad value (after its position, where `column`), instead of training on it or looking it up."""
    import tensorflow as tf

    bad = tf.reshape(bad, [-1])
    first = tf.argmax(tf.cast(bad, tf.int32))  # the first bad value (if any)
    shown = [first, tf.reshape(values, [-1])[first]] if column else [tf.reshape(values, [-1])[first]]
    return tf.control_dependencies([tf.debugging.Assert(tf.logical_not(tf.reduce_any(bad)), [message, *shown])])


def below(values: Any, limit: Any, message: str, column: bool = False) -> Any:
    """Integer `values` (a label, or ids) as int32 where each is from 0 to `limit` - 1 (one limit, or one per
    column: `column` names which table); else training stops with `message`."""
    import tensorflow as tf

    with _unless(tf.logical_or(values < 0, values >= limit), values, message, column):
        return tf.cast(values, tf.int32)


def finite(values: Any) -> Any:
    """Float `values` where each is finite; else training stops (BAD_DENSE): through a ReLU a NaN feature is 0, and
    a click model trained on them learned nothing (AUC 0.49) without a word."""
    import tensorflow as tf

    with _unless(tf.logical_not(tf.math.is_finite(values)), values, BAD_DENSE, column=True):
        return tf.identity(values)


def refused(error: str, source: str) -> DataError | None:
    """The one line for a value `below` stopped training on (TensorFlow's `error` text names its message and the
    value), naming the data `source`; None for an error that is not such a refusal."""
    if found := re.search(rf"{BAD_LABEL}{_APART}(-?\d+)", error):
        return DataError(f"the data has label {found.group(1)} after data.label_offset, outside 0 to data.classes - 1; "
                         "set data.classes or data.label_offset to match the files")
    if found := re.search(rf"{BAD_TOKEN}{_APART}(-?\d+)", error):
        return DataError(f"{source} has token id {found.group(1)}, outside 0 to data.vocabulary_size - 1; set "
                         "data.vocabulary_size to the model's vocabulary, or fix the files")
    if found := re.search(rf"{BAD_CLICK}{_APART}(-?\d+)", error):
        return DataError(f"{source} has label {found.group(1)}, not 0 or 1 (a click model's label); fix the files")
    if found := re.search(rf"{BAD_ID}{_APART}(\d+){_APART}(-?\d+)", error):
        column = int(found.group(1))
        return DataError(f"{source} has id {found.group(2)} in categorical column {column + 1}, outside its table "
                         f"(data.vocabulary_sizes[{column}]); fix the files or the table sizes")
    if found := re.search(rf"{BAD_DENSE}{_APART}(\d+){_APART}(-?\w+)", error):
        return DataError(f"{source} has {found.group(2)} in dense feature {int(found.group(1)) + 1}, not a finite "
                         "number; fix the files")
    return None


def checked(image: Any, label: Any, spec: Spec) -> tuple[Any, Any]:
    """An image resized to spec's height and width as float32, and its checked label."""
    import tensorflow as tf

    image = tf.image.resize(image, spec.shape[:2])  # float32 (H, W, C)
    image.set_shape(spec.shape)
    return image, below(label, spec.classes, BAD_LABEL)


def token_decoder(spec: Spec, length: int) -> Decoder:
    """A tf.train.Example of `length` int64 token ids (TOKENS_KEY) -> a text classifier's (ids (length,), its
    checked `label`), or a language model's (ids[:-1], ids[1:]: each position's next id); an id outside the
    vocabulary stops training (BAD_TOKEN) instead of being looked up."""
    import tensorflow as tf

    classify = not spec.task.per_position  # a label per record, else each position's next id
    features = {TOKENS_KEY: tf.io.FixedLenFeature([length], tf.int64)}
    if classify:
        features["label"] = tf.io.FixedLenFeature([], tf.int64)

    def decode(record):
        example = tf.io.parse_single_example(record, features)
        ids = below(example[TOKENS_KEY], spec.vocabulary, BAD_TOKEN)  # (length,)
        return (ids, below(example["label"], spec.classes, BAD_LABEL)) if classify else (ids[:-1], ids[1:])

    return decode


def click_decoder(spec: Spec) -> Decoder:
    """A tf.train.Example of a click log (the spec's features by name: "dense" float32s, "categorical" int64 ids, one
    per column, and "label" 0 or 1) -> ({"dense" (13,), "categorical" (k,) int32}, label int32); an id outside its
    column's table (BAD_ID), another label (BAD_CLICK) or a dense value not finite (BAD_DENSE) stops training instead
    of being trained on."""
    import tensorflow as tf

    dense, categorical = spec.features
    features = {dense.name: tf.io.FixedLenFeature(dense.shape, tf.float32),
                categorical.name: tf.io.FixedLenFeature(categorical.shape, tf.int64),
                "label": tf.io.FixedLenFeature([], tf.int64)}
    tables = tf.constant(categorical.vocabularies, tf.int64)  # (k,)

    def decode(record):
        example = tf.io.parse_single_example(record, features)
        ids = below(example[categorical.name], tables, BAD_ID, column=True)  # (k,)
        return {dense.name: finite(example[dense.name]), categorical.name: ids}, below(example["label"], 2, BAD_CLICK)

    return decode


def decoder(spec: Spec, label_offset: int) -> Decoder:
    """A tf.train.Example of tf_cnn_benchmarks' layout -> (image, label): the encoded JPEG or PNG decoded to spec's
    channels, `label_offset` subtracted, then `checked`."""
    import tensorflow as tf

    features = {IMAGE_KEY: tf.io.FixedLenFeature([], tf.string), LABEL_KEY: tf.io.FixedLenFeature([], tf.int64)}

    def decode(record):
        example = tf.io.parse_single_example(record, features)
        image = tf.io.decode_image(example[IMAGE_KEY], channels=spec.shape[2], expand_animations=False)  # (h, w, C)
        return checked(image, example[LABEL_KEY] - label_offset, spec)

    return decode


@dataclass(frozen=True)
class Records:
    """TFRecord shards of encoded images (or of token ids) as training or test examples (the `Examples` contract)."""

    files: tuple[str, ...]
    spec: Spec
    decoder: Callable[[], Decoder]  # makes the decode function (called once TensorFlow may be imported)
    shards: int = 1  # this stream is shard `index` of `shards`
    index: int = 0
    buffer: int = 0  # shuffle buffer in examples (0: stored order)
    seed: int = 0
    endless: bool = False  # repeated forever (training), else one pass (evaluation)
    limit: int | None = None  # use only the first `limit` records (this shard's share of them)

    def by_file(self) -> bool:
        """Whether sharding splits the files (each shard reads only its own) rather than the records."""
        return len(self.files) >= self.shards

    def own_files(self) -> tuple[str, ...]:
        """The files this stream reads: its share of them when sharded by file, else all of them."""
        return self.files[self.index::self.shards] if self.by_file() else self.files

    def shard(self, shards: int, index: int) -> Records:
        """Shard `index` of `shards`: files index, index + shards, ... (or, with fewer files than shards, records)."""
        assert self.shards == 1, "a shard is not sharded again"
        return replace(self, shards=shards, index=index)

    def shuffled(self, buffer: int, seed: int) -> Records:
        """Records through a `buffer`-example shuffle and, where that cannot change which records this stream reads,
        files in a new order, every epoch; repeated forever."""
        return replace(self, buffer=buffer, seed=seed, endless=True)

    def batched(self, batch: int, opts: Any, drop_remainder: bool = True) -> Any:
        """A tf.data.Dataset of (float32 (batch, H, W, C) in [0, 1], int32 (batch,)), or of token ids (batch,
        length) and their labels, prefetched on the host."""
        import tensorflow as tf

        files = tf.data.Dataset.from_tensor_slices(list(self.own_files()))
        # The file order is shuffled, but not where shards split the records (every shard must split the same
        # order, or their records overlap) nor under a limit (the first records must be the same every epoch).
        if self.buffer and self.by_file() and not self.limit:
            files = files.shuffle(len(self.own_files()), seed=self.seed, reshuffle_each_iteration=True)
        parallel = autotune(opts.map_parallelism)
        ds = files.interleave(tf.data.TFRecordDataset, cycle_length=min(8, len(self.own_files())),
                              num_parallel_calls=parallel, deterministic=True)
        if not self.by_file() and self.shards > 1:
            ds = ds.shard(self.shards, self.index)
        if self.limit:
            ds = ds.take(max(1, self.limit // self.shards))
        if self.buffer:
            ds = ds.shuffle(self.buffer, seed=self.seed, reshuffle_each_iteration=True)
        if self.endless:
            ds = ds.repeat()
        ds = ds.map(self.decoder(), num_parallel_calls=parallel)
        ready = ds.batch(batch, drop_remainder=drop_remainder).map(lambda x, y: to_float(x, y, self.spec))
        return finish(ready, opts)


@dataclass(frozen=True)
class RecordData:
    """A dataset in TFRecord files: its training and test files and their decoder (the `Data` contract)."""

    train_files: tuple[str, ...]
    test_files: tuple[str, ...]
    spec: Spec
    decoder: Callable[[], Decoder]
    train_limit: int | None = None
    test_limit: int | None = None
    synthetic: bool = False

    @cached_property  # counted once: a header read per record
    def train_size(self) -> int:
        return _records(self.train_files, self.train_limit)

    @cached_property
    def test_size(self) -> int:
        return _records(self.test_files, self.test_limit)

    def train(self) -> Records:
        return Records(self.train_files, self.spec, self.decoder, limit=self.train_limit)

    def test(self, limit: int | None = None) -> Any:
        """The first `limit` (and at most test_limit) test examples, in file order, in batches of EVAL_BATCH."""
        limit = min(x for x in (limit, self.test_limit) if x) if (limit or self.test_limit) else None
        return eval_batches(Records(self.test_files, self.spec, self.decoder, limit=limit))

    def digest(self, split: str) -> str:
        """sha256 of the split's file names and sizes (8 hex digits): which shards a run read, without reading them."""
        digest = hashlib.sha256()
        for path in self.train_files if split == "train" else self.test_files:
            digest.update(f"{os.path.basename(path)}:{os.path.getsize(path)}\n".encode())
        return digest.hexdigest()[:8]


def _records(files: tuple[str, ...], limit: int | None) -> int:
    total = sum(count_records(f) for f in files)
    return min(total, limit) if limit else total
