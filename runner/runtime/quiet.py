"""TensorFlow's start-up lines, filtered to those that matter.

Importing TensorFlow writes a dozen lines from C++ before its logging is configured (absl's notice, oneDNN being on,
CUDA drivers not found, the CPU instructions it was not built for, an alarming `failed call to cuInit` on a machine
without GPUs); the run records what matters of them itself (the `tensorflow.onednn` and `devices.*` tags).
`filtered_stderr` drops them at the file-descriptor level; `quiet_cpp_log` keeps TensorFlow's later C++ log (a line
per TFRecord reader, an aborted "rendezvous" before an `error:` line) to errors. RUNNER_VERBOSE_TENSORFLOW=1 leaves
both alone.
"""

from __future__ import annotations

import os
import re
import sys
import threading
from contextlib import contextmanager
from typing import Iterator

NOISE = re.compile(
    r"All log messages before absl::InitializeLog|oneDNN custom operations are on|Could not find cuda drivers"
    r"|cpu_feature_guard|To enable the following instructions|rebuild TensorFlow with the appropriate compiler"
    r"|failed call to cuInit|Unable to register cu(DNN|FFT|BLAS) factory|computation placer already registered"
    r"|TF-TRT Warning"
)


def _pump(source: int, target: int) -> None:
    """Copy lines from `source` to `target`, dropping the NOISE ones, until `source` closes."""
    with os.fdopen(source, "rb", closefd=True) as lines:
        for line in lines:
            if not NOISE.search(line.decode(errors="replace")):
                os.write(target, line)


def verbose() -> bool:
    """Whether the user asked for TensorFlow's own output unfiltered (RUNNER_VERBOSE_TENSORFLOW=1)."""
    return os.environ.get("RUNNER_VERBOSE_TENSORFLOW", "") not in ("", "0")


def quiet_cpp_log() -> None:
    """TensorFlow's C++ log at ERROR and above only (TF_CPP_MIN_LOG_LEVEL=2), unless the user set the level or asked
    for verbose output. Call before TensorFlow is imported: it reads the level once, when it loads."""
    if not verbose():
        os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


@contextmanager
def filtered_stderr() -> Iterator[None]:
    """While the block runs, the process's stderr (file descriptor 2, C++ writes included) loses the NOISE lines."""
    if verbose():
        yield
        return
    sys.stderr.flush()
    saved = os.dup(2)
    read, write = os.pipe()
    os.dup2(write, 2)
    os.close(write)
    pump = threading.Thread(target=_pump, args=(read, saved), daemon=True)
    pump.start()
    try:
        yield
    finally:
        sys.stderr.flush()
        os.dup2(saved, 2)  # closes the pipe's last write end: the pump sees the end and stops
        pump.join(timeout=5)
        os.close(saved)
