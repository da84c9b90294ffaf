"""Dataset `files`: the user's own examples from a folder, in one of three layouts (`data.format`; `auto` tells them
apart; docs/your-model-your-data.md describes each):

- `npy`: `x_train.npy`, `y_train.npy`, `x_test.npy`, `y_test.npy`: images or token ids with their labels; or, without
  labels, a language model's token ids, rows (n, length) or one stream (n,) cut into windows. The arrays are
  memory-mapped, never read whole, and the spec comes from their headers;
- `criteo_tsv`: click logs `train.tsv` and `test.tsv` in Criteo's layout, read and checked before TensorFlow starts;
- `tfrecord`: TFRecord shards `train-*` and `validation-*` of encoded images, token ids or click logs, streamed.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, ClassVar, Literal

import numpy as np

from runner.data_pipelines import (DATASETS, ID_LIMIT, IMAGE_SHAPE_OR_NULL, TABLE_SIZES, DataError, DatasetOptions, Spec,
                                   language_model)
from runner.data_pipelines.records import SHARDS, wrapped
from runner.registry import Rule, non_negative
from runner.tasks import TASKS, from_labels

log = logging.getLogger(__name__)
ARRAYS = ("x_train", "y_train", "x_test", "y_test")  # the .npy files of the npy layout
NPY_MAGIC = b"\x93NUMPY"  # how every .npy file begins (numpy.lib.format)
# The largest target whose squared error, summed over a batch of up to 2**20 examples (the loss's reduce_sum),
# float32 holds: 1.8e16
SQUARABLE = math.sqrt(np.finfo(np.float32).max / 2**20)
DTYPES = ("uint8", "float32")  # stored image dtypes the spec knows
UNLABELLED = "integer token ids, rows (n, length) or one stream (n,)"  # what the npy layout takes without labels


def labels(y: np.ndarray) -> np.ndarray:
    """Labels of shape (n,) or (n, 1) (keras.datasets' CIFAR arrays) as (n,), in their task's dtype (integers: int32
    classes)."""
    return np.asarray(y, TASKS[from_labels(y.dtype.name) or "class"].labels_dtype).reshape(-1)


@DATASETS.register
@dataclass
class Files(DatasetOptions):
    """Your images from a folder: .npy arrays (memory-mapped) or TFRecord shards of encoded images."""

    name: str = "files"
    path: str = ""  # the folder holding the files
    # auto: npy if x_train.npy is there, criteo_tsv if train.tsv is, else tfrecord
    format: Literal["auto", "npy", "tfrecord", "criteo_tsv"] = "auto"
    shape: list[int] | None = None  # tfrecord: [height, width, channels] each image is resized to
    classes: int | None = None  # null: npy, the largest training label + 1; tfrecord: required
    label_offset: int = 0  # subtracted from every stored label (1 for ImageNet records counting from 1)
    vocabulary_size: int | None = None  # token ids: how many ids the model's embedding has (null: largest id + 1)
    # tfrecord token ids: ids per record (its input_ids); an npy token stream (n,): the context, each window this many
    # ids and the next
    sequence_length: int | None = None
    vocabulary_sizes: list[int] | None = None  # click logs (criteo_tsv, tfrecord): each categorical column's table size

    RULES: ClassVar[dict[str, Rule]] = {
        **DatasetOptions.RULES,
        "shape": IMAGE_SHAPE_OR_NULL,
        "classes": (lambda v: v is None or v >= 2, "an integer of at least 2, or null"),
        "label_offset": (non_negative, "0 or a positive integer"),
        "vocabulary_size": (lambda v: v is None or 2 <= v <= ID_LIMIT, f"an integer from 2 to 2**31 ({ID_LIMIT:,}: "
                            "token ids are int32), or null"),
        "vocabulary_sizes": TABLE_SIZES,
        "sequence_length": (lambda v: v is None or v >= 2, "an integer of at least 2, or null"),
    }

    def describe(self) -> str:
        return f"{self.path} ({self._format()})"

    def _folder(self) -> Path:
        folder = Path(self.path).expanduser()
        if not self.path or not folder.is_dir():
            arrays, shards = ", ".join(a + ".npy" for a in ARRAYS), " and ".join(SHARDS.values())
            raise DataError(f"data.path={self.path!r} is not a folder; data=files needs the folder holding {arrays} "
                            f"or TFRecord shards {shards}")
        return folder

    def _format(self) -> str:
        if self.format != "auto":
            return self.format
        folder = self._folder()
        if (folder / "x_train.npy").is_file():
            return "npy"
        return "criteo_tsv" if (folder / "train.tsv").is_file() else "tfrecord"

    def spec(self) -> Spec:
        """From the arrays' headers (npy), train.tsv's first line, or data.* (tfrecord); no TensorFlow."""
        if self._format() == "criteo_tsv":
            from runner.data_pipelines.clicks import tsv_spec

            return tsv_spec(self._folder(), tuple(self.vocabulary_sizes or ()))
        if self._format() == "npy" and self.vocabulary_sizes:  # click logs are not read from the npy layout
            from runner.data_pipelines.clicks import LAYOUTS

            raise DataError(f"data.vocabulary_sizes declares click logs and {self.path} holds x_train.npy, which "
                            f"data=files reads as images or token ids: click logs are {LAYOUTS}")
        return self._npy_spec() if self._format() == "npy" else self._tfrecord_spec()

    def train_examples(self) -> int | None:
        if self._format() != "npy":
            return self.train_limit
        x = self._array("x_train")
        n = len(x) - (self.sequence_length or 0) if self._layout() == "stream" else len(x)  # a stream: its windows
        return min(n, self.train_limit) if self.train_limit else n

    def load(self, seed: int) -> Any:
        """The arrays, memory-mapped and cut to the limits; the click logs, read and checked; or the TFRecord shards
        (`seed` is unused)."""
        if self._format() == "criteo_tsv":
            from runner.data_pipelines.clicks import load_tsv

            return load_tsv(self._folder(), self.spec(), self.train_limit, self.test_limit)
        if self._format() == "npy" and self._layout() == "stream":  # the validation stream cut to test_limit windows
            from runner.data_pipelines.text import MappedStream

            spec, test = self._npy_spec(), self._array("x_test")
            test = test[: self.test_limit * spec.shape[0] + 1] if self.test_limit else test
            return MappedStream(self._array("x_train"), test, spec, seed, self.train_limit)
        if self._format() == "npy" and self._layout() == "sequences":
            from runner.data_pipelines.text import SequenceFiles

            return SequenceFiles(self._array("x_train")[: self.train_limit], None,
                                 self._array("x_test")[: self.test_limit], None, synthetic=False, spec=self._npy_spec())
        if self._format() == "npy":
            from runner.data_pipelines.common import Arrays

            x_train, y_train, x_test, y_test = (self._array(a) for a in ARRAYS)
            spec, y = self._npy_spec(), labels(y_train[: self.train_limit])
            if spec.target == "class" and y.min() == y.max():  # trains and scores well, having learnt nothing
                log.warning("%s/y_train.npy holds one class (%d) only: a classifier learns to answer it whatever the "
                            "input, and its accuracy says nothing of the model", self.path, y[0])
            return Arrays(x_train[: self.train_limit], y, x_test[: self.test_limit], labels(y_test[: self.test_limit]),
                          synthetic=False, spec=spec)
        from runner.data_pipelines.records import RecordData, click_decoder, decoder, token_decoder

        train, test = (self._shards(split) for split in SHARDS)
        spec = self._tfrecord_spec()
        decode = partial(click_decoder, spec) if spec.features else partial(token_decoder, spec, self.sequence_length) \
            if spec.token_ids else partial(decoder, spec, self.label_offset)
        return RecordData(train, test, spec, decode, self.train_limit, self.test_limit)

    def _array(self, name: str) -> np.ndarray:
        """`name`.npy memory-mapped; DataError where it is missing, unreadable, not a .npy file (no numpy header: an
        empty file, a CSV, an .npz archive), not an array numpy can map, in the other byte order (read raw, its values
        would be garbage) or holding no example (an empty split would fail only after the run had started)."""
        path = self._folder() / f"{name}.npy"
        try:
            with open(path, "rb") as f:
                header = f.read(len(NPY_MAGIC))
            x = np.load(path, mmap_mode="r") if header == NPY_MAGIC else None
        except FileNotFoundError:
            raise DataError(f"data.path={self.path} has no {name}.npy; the npy layout needs "
                            f"{', '.join(a + '.npy' for a in ARRAYS)}") from None
        except OSError as e:  # permissions, an I/O error, a folder of that name
            raise DataError(f"{path} cannot be read: {e.strerror or e}") from None
        except (ValueError, EOFError) as e:  # pickled objects, a header numpy cannot parse or that ends too soon
            raise DataError(f"{path} is not a .npy array numpy can memory-map: {e}") from None
        if x is None and (what := wrapped(header, path)):
            raise DataError(f"{path} is not a .npy file: it is {what}")
        if x is None:
            raise DataError(f"{path} is not a .npy file: it {'is empty' if not header else 'has no numpy header'} "
                            "(np.save writes one; an .npz archive holds several arrays: save each as its .npy)")
        if not x.dtype.isnative:
            raise DataError(f"{path} holds {x.dtype.str} values, in the other byte order than this machine's; save "
                            "them in its own: np.save(path, x.astype(x.dtype.newbyteorder('=')))")
        if not x.ndim or not x.size:  # a 0-d array: one value, not examples; (n, 0): examples of nothing
            raise DataError(f"{path} holds no examples ({x.dtype} {x.shape}); every file of data=files needs at "
                            "least one, of at least one value")
        return x

    def _finite(self, x: np.ndarray, name: str, bound: float = math.inf) -> None:
        """DataError where float `x` holds a NaN or an infinity: a NaN pixel comes out of a ReLU as 0 and the run
        trains on, a NaN label makes every score NaN (checked in slices of rows: no copy of a large array); or a
        value beyond `bound` (a target whose squared errors overflow float32: the loss is infinite at step 1)."""
        if x.dtype.kind != "f":
            return
        for start in range(0, len(x), rows := max(1, 2**24 // max(1, x[0].size))):
            within = np.abs(x[start:start + rows]) <= bound  # NaN compares False
            if not within.all():
                where = np.unravel_index(int(np.argmin(within)), within.shape)
                value = x[start:start + rows][where]
                rule = ("data=files takes finite values" if not np.isfinite(value) else f"beyond {bound:.2g}, squared "
                        "errors summed over a batch overflow float32: scale the targets (e.g. y / np.abs(y).max())")
                raise DataError(f"{self.path}/{name}.npy holds {value:g} at index "
                                f"{(start + int(where[0]), *map(int, where[1:]))}; {rule}")

    def _layout(self) -> Literal["labelled", "sequences", "stream"]:
        """What the npy files hold: examples with labels (y_train.npy and y_test.npy), or, without labels, a
        language model's integer token ids: rows (n, length) or one stream (n,)."""
        labelled = [(self._folder() / f"{y}.npy").is_file() for y in ("y_train", "y_test")]
        if all(labelled):
            return "labelled"
        if any(labelled):
            missing = [f"{y}.npy" for y, has in zip(("y_train", "y_test"), labelled) if not has]
            raise DataError(f"data.path={self.path} has no {' or '.join(missing)}: labels for both splits (a "
                            f"classifier), or for neither ({UNLABELLED}: a language model on them)")
        x = self._array("x_train")
        if x.ndim not in (1, 2) or x.dtype.kind not in "iu":
            floats = " (token ids stored as floats? save x.astype(np.int32))" if x.dtype.kind == "f" else ""
            raise DataError(f"{self.path}/x_train.npy holds {x.dtype} {x.shape} and the folder has no y_train.npy or "
                            f"y_test.npy: without labels data=files takes {UNLABELLED}{floats}; images need labels")
        return "stream" if x.ndim == 1 else "sequences"

    def _stream_spec(self) -> Spec:
        """A language model on one stream of token ids: windows of data.sequence_length ids, each labelled with the
        next id at every position."""
        x_train, x_test = self._array("x_train"), self._array("x_test")
        if x_test.ndim != 1 or x_test.dtype.kind not in "iu":
            raise DataError(f"{self.path}: x_train.npy is a stream of token ids {x_train.dtype} {x_train.shape} and "
                            f"x_test.npy holds {x_test.dtype} {x_test.shape}; a stream's validation ids are one too, "
                            "integers (n,)")
        length = self.sequence_length
        if length is None:
            raise DataError(f"{self.path}/x_train.npy is a stream of {len(x_train):,} token ids: set "
                            "data.sequence_length, the context (ids a window takes; each labelled with the next)")
        for x, split in ((x_train, "train"), (x_test, "test")):
            if len(x) <= length:
                raise DataError(f"{self.path}/x_{split}.npy holds {len(x):,} token ids, fewer than a window of "
                                f"data.sequence_length + 1 = {length + 1:,}; use a shorter data.sequence_length")
        return language_model(length, self._vocabulary(x_train, x_test))

    def _sequences_spec(self) -> Spec:
        """A language model on the token files: inputs (length - 1,), labels each position's next id."""
        x_train, x_test = self._array("x_train"), self._array("x_test")
        if x_test.dtype.kind not in "iu" or x_test.shape[1:] != x_train.shape[1:] or x_train.shape[1] < 2:
            raise DataError(f"{self.path}: x_train.npy {x_train.dtype} {x_train.shape} and x_test.npy {x_test.dtype} "
                            f"{x_test.shape}: a language model's token files are integer ids (n, length), the same "
                            "length in both, at least 2")
        self._by_rows(x_train, "train")
        self._by_rows(x_test, "test")
        return language_model(int(x_train.shape[1]) - 1, self._vocabulary(x_train, x_test))

    def _by_rows(self, x: np.ndarray, split: str) -> None:
        if not x.flags.c_contiguous:
            raise DataError(f"{self.path}/x_{split}.npy is stored in Fortran order, which cannot be read by rows; "
                            "save it with np.save(path, np.ascontiguousarray(x))")

    def _npy_spec(self) -> Spec:
        if self.shape is not None:
            raise DataError(f"data.shape={self.shape} resizes TFRecord images; the npy layout in {self.path} is used "
                            "at its stored size: leave data.shape out, or store the arrays at the size you want")
        if (layout := self._layout()) != "labelled":
            return self._stream_spec() if layout == "stream" else self._sequences_spec()
        x_train, y_train, x_test, y_test = (self._array(a) for a in ARRAYS)
        tokens = x_train.dtype.kind in "iu" and x_train.ndim == 2
        if not tokens and (x_train.dtype.name not in DTYPES or x_train.ndim not in (3, 4)):
            rows = (" (rows of features: store them as (n, features, 1), x[..., None], a one-column image)"
                    if x_train.dtype.kind == "f" and x_train.ndim == 2 else "")
            raise DataError(f"{self.path}/x_train.npy holds {x_train.dtype} {x_train.shape}; data=files takes uint8 "
                            "or float32 images (n, height, width, channels) or (n, height, width), or integer token "
                            f"ids (n, length){rows}; without labels, {UNLABELLED}")
        shape = x_train.shape[1:] if x_train.ndim in (2, 4) else (*x_train.shape[1:], 1)
        for x, y, split in ((x_train, y_train, "train"), (x_test, y_test, "test")):
            if len(x) != len(y) or x.shape[1:] != x_train.shape[1:] or y.shape[1:] not in ((), (1,)):
                raise DataError(f"{self.path}: x_{split}.npy {x.shape} and y_{split}.npy {y.shape} do not match "
                                f"(one label per image, (n,) or (n, 1); every image {x_train.shape[1:]})")
            if from_labels(y.dtype.name) is None:
                takes = ", ".join(f"{t.labels_dtype} ({t.said.format(classes='N')})" for t in TASKS.values()
                                  if not t.per_position and t.labels_dtype != "int32")
                raise DataError(f"{self.path}/y_{split}.npy holds {y.dtype} labels; data=files takes integer class "
                                f"labels 0 to classes - 1{', or ' + takes if takes else ''}")
            alike = x.dtype.kind in "iu" if tokens else x.dtype == x_train.dtype  # uint8 is scaled, float32 is not
            if not alike or (y.dtype.kind in "iu") != (y_train.dtype.kind in "iu"):  # int64 and uint8 ids alike
                why = ("integer labels are class ids, float ones values" if alike else "token ids are integers"
                       if tokens else "uint8 images are scaled to [0, 1], float32 ones read as they are")
                raise DataError(f"{self.path}: x_test.npy {x_test.dtype} and y_test.npy {y_test.dtype}, x_train.npy "
                                f"{x_train.dtype} and y_train.npy {y_train.dtype}: store both splits alike ({why})")
            self._by_rows(x, split)
            self._finite(x, f"x_{split}")
            self._finite(y, f"y_{split}", SQUARABLE)
        task = from_labels(y_train.dtype.name)  # integers: classes; else the task of labels of that dtype
        if task != "class" and self.classes is not None:
            raise DataError(f"data.classes={self.classes} counts a classifier's classes, and {self.path}/y_train.npy "
                            f"holds {y_train.dtype} values, a {task}: store class labels as integers "
                            "(y.astype(np.int64)), or leave data.classes out")
        classes = self._classes(y_train, y_test) if task == "class" else 1  # one output otherwise
        if task != "class" and len(y_train) and np.array_equal(y_train, np.round(y_train)) and \
                len(np.unique(y_train)) <= 1000:
            log.warning("%s/y_train.npy holds %s values that are all whole numbers (%g to %g): trained as a %s (one "
                        "output); class labels are stored as integers (y.astype(np.int64))", self.path,
                        y_train.dtype, y_train.min(), y_train.max(), task)
        if tokens:
            return Spec((int(shape[0]),), classes, "int32", task, self._vocabulary(x_train, x_test))
        return Spec(tuple(int(d) for d in shape), classes, x_train.dtype.name, task)

    def _vocabulary(self, x_train: np.ndarray, x_test: np.ndarray) -> int:
        """data.vocabulary_size, checked against both splits' ids; else the largest id + 1 (one pass over each)."""
        ranges = {split: (int(x.min()), int(x.max())) for x, split in ((x_train, "train"), (x_test, "test"))}
        vocabulary = self.vocabulary_size or max(high for _, high in ranges.values()) + 1  # each range found once
        if vocabulary > ID_LIMIT:  # hashes, not ids: the embedding would have a row for each of 2**40 values
            split = max(ranges, key=lambda k: ranges[k][1])
            raise DataError(f"{self.path}/x_{split}.npy has token ids up to {vocabulary - 1:,}: a vocabulary of "
                            f"{vocabulary:,} (2**{math.log2(vocabulary):.1f}) embedding rows; token ids are int32, "
                            f"below 2**31 ({ID_LIMIT:,}): number the distinct ids 0 to n - 1 (np.unique(x, "
                            "return_inverse=True))")
        for split, (low, high) in ranges.items():
            if low < 0 or high >= vocabulary:
                needs = (f"data.vocabulary_size={vocabulary} needs them from 0 to {vocabulary - 1}" if
                         self.vocabulary_size else "token ids number the tokens from 0 (np.unique(x, return_inverse="
                         "True))")  # not set: the largest id + 1, so only a negative id is outside
                raise DataError(f"{self.path}/x_{split}.npy has token ids from {low} to {high}; {needs}")
        return max(vocabulary, 2)

    def _classes(self, y_train: np.ndarray, y_test: np.ndarray) -> int:
        """data.classes, checked against both splits' labels; else the largest training label + 1."""
        classes = self.classes or int(y_train.max()) + 1
        if classes > ID_LIMIT:  # ids, hashes: an output layer of that many logits (was refused as a batch too large)
            raise DataError(f"{self.path}/y_train.npy has labels up to {classes - 1:,}: {classes:,} classes; class "
                            "labels number the classes 0 to n - 1 (np.unique(y, return_inverse=True))")
        for y, split in ((y_train, "train"), (y_test, "test")):
            low, high = (int(y.min()), int(y.max())) if len(y) else (0, 0)
            if low < 0 or high >= classes:
                if self.classes:
                    needs = f"data.classes={classes} needs them from 0 to {classes - 1}"
                elif low >= 0:  # counted from the training labels (data.classes not set): the test split has more
                    needs = (f"y_train.npy's labels (up to {classes - 1}) make {classes} classes; set data.classes to "
                             "how many there are")
                else:
                    needs = ("integer labels are class ids from 0 (np.unique(y, return_inverse=True)); a value to "
                             "regress is stored as floats (y.astype(np.float32))")
                raise DataError(f"{self.path}/y_{split}.npy has labels from {low} to {high}; {needs}")
        return max(classes, 2)

    def _shards(self, split: str) -> tuple[str, ...]:
        files = tuple(sorted(str(p) for p in self._folder().glob(SHARDS[split])))
        if not files:
            from runner.data_pipelines.clicks import LAYOUTS

            raise DataError(f"data.path={self.path} has no {SHARDS[split]} files (TFRecord shards), no x_train.npy "
                            f"(the npy layout) and no train.tsv; click logs are {LAYOUTS}")
        return files

    def _check_shards(self) -> None:
        """Both splits' shards framed as TFRecord files are, and each split holding a record (an empty one would
        end training, or the final evaluation after all of it, in an error)."""
        from runner.data_pipelines.records import check_framing

        for split in SHARDS:
            if not check_framing(files := self._shards(split)):
                more = f" and {len(files) - 1} more" if len(files) > 1 else ""
                raise DataError(f"{files[0]}{more}: the {SHARDS[split]} shards of data.path={self.path} hold no "
                                "records; each split needs at least one")

    def _tfrecord_spec(self) -> Spec:
        """data.shape and data.classes, once the shards of both splits are there and framed as TFRecord files are
        (their first headers: a cheap check that finds a file that is not one before anything starts)."""
        self._shards("train")
        if self.vocabulary_sizes:  # click logs: the declared tables say so
            from runner.data_pipelines.clicks import click_spec

            self._check_shards()
            return click_spec(tuple(int(v) for v in self.vocabulary_sizes))
        tokens = self.vocabulary_size is not None and self.shape is None
        if tokens and self.sequence_length is None:
            raise DataError(f"data=files with TFRecord shards of token ids in {self.path} (data.vocabulary_size="
                            f"{self.vocabulary_size}) needs data.sequence_length: how many ids each record's input_ids "
                            "holds")
        if not tokens and (self.shape is None or self.classes is None):
            raise DataError(f"data=files with TFRecord shards in {self.path} needs data.shape=[height,width,channels] "
                            "(each image is resized to it) and data.classes (how many labels); or, for token ids, "
                            "data.vocabulary_size and data.sequence_length")
        self._check_shards()
        if not tokens:
            return Spec(tuple(self.shape), self.classes)
        vocabulary, length = self.vocabulary_size, self.sequence_length
        if self.classes:  # a text classifier: a record's ids and its label
            return Spec((length,), self.classes, "int32", "class", vocabulary)
        return language_model(length - 1, vocabulary)  # a language model on the ids
