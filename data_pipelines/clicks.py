"""Synthetic click logs in Criteo's layout: 13 dense features, 26 categorical ids, a click label a model can learn.

No click log ships in a package registry, so this generates one shaped as the Criteo Terabyte logs TF Model
Garden's DLRM trains on: 13 dense values (log(1 + a count)) and 26 categorical ids per example, each feature with its
own vocabulary (Criteo's sizes, capped) and power-law id frequencies. The label is drawn from a hidden logistic model
(a weight per dense feature, an effect per id, one pairwise interaction, a click rate near Criteo's 25%), so a model
that learns it well nears the hidden model's own AUC (`bayes_auc`). Imports only numpy.
"""

from __future__ import annotations

import contextlib
import csv
import hashlib
import io
import itertools
import logging
import math
import os
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Literal

import numpy as np

from runner.data_pipelines import DATASETS, TABLE_SIZES, DataError, DatasetOptions, Feature, Spec
from runner.data_pipelines.records import SHARDS, wrapped
from runner.paths import cache_dir
from runner.registry import Rule

log = logging.getLogger(__name__)

# TF Model Garden's dlrm_criteo vocabulary sizes (official/recommendation/ranking/configs), feature C1 to C26.
CRITEO_VOCABULARIES = (39884406, 39043, 17289, 7420, 20263, 3, 7120, 1543, 63, 38532951, 2953546, 403346, 10, 2208,
                       11938, 155, 4, 976, 14, 39979771, 25641295, 39664984, 585935, 12972, 108, 36)
DENSE_FEATURES = 13
# data.tables -> the largest table's rows (Criteo's sizes capped there): tiny for tests, default for one machine,
# criteo as Model Garden's.
CAPS = {"tiny": 100, "default": 250_000, "criteo": max(CRITEO_VOCABULARIES)}
INFORMATIVE = 0.5  # the share of categorical features whose ids carry signal (the others are noise, as in Criteo)


def vocabularies(tables: str) -> tuple[int, ...]:
    """Each categorical feature's vocabulary for `data.tables`."""
    return tuple(min(v, CAPS[tables]) for v in CRITEO_VOCABULARIES)


def _mix(values: np.ndarray, salt: int) -> np.ndarray:
    """A fixed pseudo-random uint64 for each value (splitmix64's finaliser): a hidden effect per id without a table."""
    with np.errstate(over="ignore"):  # uint64 arithmetic wraps modulo 2**64, as splitmix64 means it to
        z = values.astype(np.uint64) + np.uint64(salt) * np.uint64(0x9E3779B97F4A7C15)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


def _normal(values: np.ndarray, salt: int) -> np.ndarray:
    """A fixed standard normal for each value (Box-Muller on two hashes)."""
    u1 = (_mix(values, salt) >> np.uint64(11)).astype(np.float64) / 2**53 + 2**-54
    u2 = (_mix(values, salt + 1) >> np.uint64(11)).astype(np.float64) / 2**53
    return np.sqrt(-2 * np.log(u1)) * np.cos(2 * np.pi * u2)


def _ranks(rng: np.random.Generator, n: int, vocabulary: int, power: float) -> np.ndarray:
    """n ranks in [0, vocabulary) with P(r) ~ (r + 1)^-power (the inverse CDF of the continuous power law)."""
    u = rng.random(n)
    top = (vocabulary + 1.0) ** (1 - power)
    return np.minimum((1 + u * (top - 1)) ** (1 / (1 - power)), vocabulary).astype(np.int64) - 1


def _multiplier(vocabulary: int) -> int:
    """A multiplier coprime with `vocabulary`: rank -> (rank * m + 7) mod vocabulary is a permutation of the ids."""
    m = 2654435761 % max(vocabulary, 2) or 1
    while math.gcd(m, vocabulary) != 1:
        m += 1
    return m


@dataclass(frozen=True)
class Hidden:
    """The hidden model the labels are drawn from, fixed by the seed: the same for the training and test logs."""

    vocabularies: tuple[int, ...]
    seed: int
    power: float

    def draw(self, n: int, split: int) -> tuple[dict[str, np.ndarray], np.ndarray, np.ndarray]:
        """`n` examples of split `split` (0 train, 1 test): features {"dense" (n, 13) float32, "categorical" (n, 26)
        int32}, labels (n,) int32 and the hidden logits (n,)."""
        rng = np.random.default_rng([self.seed, split])
        weights = np.random.default_rng([self.seed, 99])
        counts = rng.lognormal(1.0, 1.5, (n, DENSE_FEATURES)).astype(np.int64)  # (n, 13) counts
        dense = np.log1p(counts).astype(np.float32)
        w_dense = weights.normal(0, 0.35, DENSE_FEATURES)
        logit = (dense - 1.2) @ w_dense  # (n,)
        ids = np.empty((n, len(self.vocabularies)), np.int32)
        informative = weights.random(len(self.vocabularies)) < INFORMATIVE
        effects = []
        for k, vocabulary in enumerate(self.vocabularies):
            rank = _ranks(rng, n, vocabulary, self.power)
            ids[:, k] = (rank * _multiplier(vocabulary) + 7) % vocabulary
            effects.append(_normal(rank * 64 + k, self.seed) if informative[k] else np.zeros(n))
        logit += 0.6 * np.sum(effects, axis=0)
        if len(effects) > 1 and informative[0] and informative[1]:  # one pair interacts (one table: no pair)
            logit += 0.8 * effects[0] * effects[1]
        logit -= 1.6  # a click rate near Criteo's quarter
        labels = (rng.random(n) < 1 / (1 + np.exp(-logit))).astype(np.int32)
        return {"dense": dense, "categorical": ids}, labels, logit


@DATASETS.register
@dataclass
class Clicks(DatasetOptions):
    """Synthetic click logs in Criteo's layout (module docstring); the same for the same seed.

    Held in memory: 160 bytes per example (13 float32, 26 int32, the label).
    """

    name: str = "clicks"
    train_limit: int = 1_000_000
    test_limit: int = 100_000
    tables: Literal["tiny", "default", "criteo"] = "default"  # Criteo's vocabularies capped: 100, 250,000, none
    vocabulary_sizes: list[int] | None = field(default=None)  # one per categorical feature; null: data.tables'
    power: float = 1.1  # an id's frequency ~ (its rank + 1)^-power

    RULES: ClassVar[dict[str, Rule]] = {
        **DatasetOptions.RULES,
        "vocabulary_sizes": TABLE_SIZES,
        "power": (lambda v: 1 < v <= 3, "a number in (1, 3]"),
    }

    def vocabularies(self) -> tuple[int, ...]:
        return tuple(int(v) for v in self.vocabulary_sizes) if self.vocabulary_sizes else vocabularies(self.tables)

    def spec(self) -> Spec:
        return click_spec(self.vocabularies())

    def in_memory_bytes(self) -> int:
        """Bytes the generated examples take (validation refuses what this machine cannot hold)."""
        return (self.train_limit + self.test_limit) * (4 * DENSE_FEATURES + 4 * len(self.vocabularies()) + 4)

    def describe(self) -> str:
        return f"data=clicks (synthetic, Criteo's layout, tables={self.tables})"

    def load(self, seed: int) -> Any:
        """The training and test logs, drawn from the seed's hidden model (kept in the cache: `drawn`)."""
        from runner.data_pipelines.common import Arrays

        hidden = Hidden(self.vocabularies(), seed, self.power)
        (x_train, y_train), (x_test, y_test) = drawn(hidden, self.train_limit, 0), drawn(hidden, self.test_limit, 1)
        return Arrays(x_train, y_train, x_test, y_test, synthetic=True, spec=self.spec())


def drawn(hidden: Hidden, n: int, split: int) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """`hidden.draw(n, split)`'s features and labels, read back from the cache where an earlier run drew them
    (reading is far faster than drawing). The file is named by a digest of the arguments and of this module's source,
    so a change to the generator draws anew; an unreadable file is drawn again, an unwritable cache only not kept."""
    key = hashlib.sha256(repr((hidden, n, split)).encode() + Path(__file__).read_bytes()).hexdigest()[:16]
    path = cache_dir("clicks") / f"{key}.npz"
    try:
        with np.load(path) as kept:
            return {"dense": kept["dense"], "categorical": kept["categorical"]}, kept["labels"]
    except (OSError, ValueError, KeyError, zipfile.BadZipFile):  # not there yet, or cut short
        pass
    x, labels, _ = hidden.draw(n, split)
    partial = path.with_name(f"{path.stem}.{os.getpid()}.npz")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        np.savez(partial, labels=labels, **x)
        os.replace(partial, path)  # whole or not at all, whoever else draws the same at once
    except OSError as e:  # a full disk, a read-only cache
        with contextlib.suppress(OSError):
            partial.unlink(missing_ok=True)
        log.info("the drawn click logs are not kept (%s): the next run draws them again", e)
    return x, labels


def click_spec(vocabularies: tuple[int, ...]) -> Spec:
    """A click model's examples: DENSE_FEATURES float32 features ("dense"), one id per categorical column below its
    table's size ("categorical"), a 0/1 label."""
    features = (Feature("dense", (DENSE_FEATURES,), "float32"),
                Feature("categorical", (len(vocabularies),), "int32", tuple(vocabularies)))
    return Spec((), 2, "features", "binary", features=features)


def bayes_auc(tables: str = "default", n: int = 100_000, seed: int = 0, power: float = 1.1) -> float:
    """The AUC of the hidden model's own logits on `n` test examples: what no model can beat on average."""
    from runner.tasks import auc

    _, labels, logits = Hidden(vocabularies(tables), seed, power).draw(n, 1)
    return auc(labels, logits)


# Your own click logs: Criteo's tab-separated layout (`data=files data.format=criteo_tsv`), or TFRecord shards.
TSV = {"train": "train.tsv", "test": "test.tsv"}
# What a refusal of a user's click logs names: the layouts data=files reads them in.
LAYOUTS = (f"{TSV['train']} and {TSV['test']} (Criteo's tab-separated layout: a 0/1 label, "
           f"{DENSE_FEATURES} dense counts, then one integer id per categorical column) or TFRecord shards "
           f"{SHARDS['train']} and {SHARDS['test']} (tf.train.Examples of dense, categorical and label), each with "
           "data.vocabulary_sizes")


def tsv_spec(folder: Path, vocabularies: tuple[int, ...] | None) -> Spec:
    """The spec of `folder`'s click logs from train.tsv's first line and the declared vocabularies, one per
    categorical column; no TensorFlow. A missing or empty file is found here, not when the run reads it."""
    there = [name for name in TSV.values() if (folder / name).is_file()]
    if len(there) < len(TSV):
        missing = " and no ".join(name for name in TSV.values() if name not in there)
        raise DataError(f"data.path={folder} has {f'{there[0]} but ' if there else ''}no {missing}: click logs "
                        f"are {LAYOUTS}")
    first = {name: _first_line(folder / name) for name in TSV.values()}
    if empty := [name for name, line in first.items() if not line]:
        raise DataError(f"{folder / empty[0]} is empty: each split of click logs needs at least one example (a line: "
                        f"a 0/1 label, {DENSE_FEATURES} dense counts, then one id per categorical column)")
    if wrapping := [(name, what) for name, line in first.items() if (what := wrapped(line, folder / name))]:
        raise DataError(f"{folder / wrapping[0][0]} is {wrapping[0][1]}; click logs are {LAYOUTS}")
    path = folder / TSV["train"]
    columns = first[TSV["train"]].rstrip(b"\r\n").count(b"\t") - DENSE_FEATURES  # fields after the label's
    if not vocabularies or len(vocabularies) != columns:
        given = f"{len(vocabularies)} sizes" if vocabularies else "none"
        raise DataError(f"{path} has {max(columns, 0)} categorical columns after the label and {DENSE_FEATURES} dense "
                        f"counts, data.vocabulary_sizes gives {given}: give one table size per categorical column")
    return click_spec(tuple(vocabularies))


def _first_line(path: Path) -> bytes:
    """The first line of `path` as bytes (b"" for an empty file); DataError (one line) where it cannot be read."""
    try:
        with open(path, "rb") as f:
            return f.readline()
    except OSError as e:
        raise DataError(f"{path} cannot be read: {e.strerror or e}") from None


def read_tsv(path: Path, spec: Spec, limit: int | None) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """The first `limit` lines of a click log as features {"dense" (n, 13) float32 log(1 + count), "categorical" (n,
    k) int32} and labels (n,) int32; an empty field is 0. DataError (naming the file and line) for a line of another
    length, a label other than 0 or 1, or an id that is not an integer or is outside its table."""
    import pandas

    vocabularies = np.array(spec.features[1].vocabularies)
    width = 1 + DENSE_FEATURES + len(vocabularies)
    with open(path, "rb") as f:
        lines = list(itertools.islice(f, limit))
    fields = np.array([line.count(b"\t") + 1 for line in lines])
    if (wrong := np.flatnonzero(fields != width)).size:
        raise DataError(f"{path} line {wrong[0] + 1} has {fields[wrong[0]]} tab-separated fields, the declared "
                        f"spec {width} (label, {DENSE_FEATURES} dense, {len(vocabularies)} categorical: "
                        "data.vocabulary_sizes)")
    table = pandas.read_csv(io.BytesIO(b"".join(lines)), sep="\t", header=None, names=range(width), dtype=str,
                            keep_default_na=False, encoding="latin-1",  # any byte reads: what is not a number says so
                            quoting=csv.QUOTE_NONE)  # a '"' is a byte of its field (pandas read on to a closing one)
    values = table.replace("", "0")
    numbers = values.apply(pandas.to_numeric, errors="coerce")
    bad = numbers.isna() | (numbers % 1 != 0) | (numbers.abs() >= 2**53)  # not a number, 3.5, beyond an exact int
    if bad.any().any():
        line, column = np.argwhere(bad.to_numpy())[0]
        rule = ("a label is 0 or 1" if column == 0 else "a dense field is an integer count; an empty one is 0"
                if column <= DENSE_FEATURES else "categorical ids must be integers below their table's size: hash raw "
                "values into ids first")
        raise DataError(f"{path} line {line + 1}: field {column + 1} is {values.iat[line, column]!r}, not an integer "
                        f"({rule})")
    array = numbers.to_numpy(np.int64)  # (n, width)
    y = array[:, 0]
    if (wrong := np.flatnonzero((y != 0) & (y != 1))).size:
        raise DataError(f"{path} line {wrong[0] + 1}: label {y[wrong[0]]} is not 0 or 1 (a click model's label)")
    ids = array[:, 1 + DENSE_FEATURES:]
    outside = (ids < 0) | (ids >= vocabularies)
    if outside.any():
        line, column = np.argwhere(outside)[0]
        raise DataError(f"{path} line {line + 1}: categorical column {column + 1} has id {ids[line, column]}, outside "
                        f"its table of {vocabularies[column]:,} rows (0 to {vocabularies[column] - 1:,}; "
                        f"data.vocabulary_sizes[{column}])")
    dense = np.log1p(np.maximum(array[:, 1:1 + DENSE_FEATURES], 0)).astype(np.float32)
    return {"dense": dense, "categorical": ids.astype(np.int32)}, y.astype(np.int32)


def load_tsv(folder: Path, spec: Spec, train_limit: int | None, test_limit: int | None) -> Any:
    """The training and test logs of `folder` (train.tsv, test.tsv), checked line by line."""
    from runner.data_pipelines.common import Arrays

    x_train, y_train = read_tsv(folder / TSV["train"], spec, train_limit)
    x_test, y_test = read_tsv(folder / TSV["test"], spec, test_limit)
    return Arrays(x_train, y_train, x_test, y_test, synthetic=False, spec=spec)
