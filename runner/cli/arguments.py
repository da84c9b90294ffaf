"""Argument types the subcommands and the bench share: each refuses a value in argparse's one line, naming it."""

from __future__ import annotations

import argparse
import math
from typing import NoReturn


class Parser(argparse.ArgumentParser):
    """argparse's parser refusing in the house's one line, `error: <what>`, exit 2 (argparse prints its usage first:
    three to six lines); an unknown or missing argument points at `--help`."""

    def error(self, message: str) -> NoReturn:
        lost = message.startswith(("unrecognized arguments", "the following arguments are required"))
        self.exit(2, f"error: {message}" + (f"; `{self.prog} --help` lists them" if lost else "") + "\n")


def positive(text: str) -> int:
    """A count of at least 1 (steps, rounds, repeats, a batch)."""
    try:
        value = int(text)
    except ValueError:
        value = 0  # refused below, in the same words
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text} is not a positive count")
    return value


def tolerance(text: str) -> float:
    """A tolerance: a finite number >= 0 (a negative one would call every pair of runs or losses different)."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan  # refused below, in the same words
    if not 0 <= value < math.inf:
        raise argparse.ArgumentTypeError(f"{text} is not a finite number >= 0")
    return value
