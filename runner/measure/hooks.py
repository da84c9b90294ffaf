"""What a run measures beside the training loop: hooks around its calls, and figures taken after it."""

from __future__ import annotations

import logging
import resource
import sys
import timeit
from pathlib import Path
from typing import Any, ContextManager

from runner.measure import malloc
from runner.train import Hook

log = logging.getLogger(__name__)
INPUT_BOUND_RATIO = 3  # a pipeline slower than 3x the step rate leaves the devices waiting for data


class ReuseFreedMemory(Hook):
    """Undo, after every call, the allocator setting generator-based input iterators leave (malloc.py)."""

    def after(self, step: int, n: int, seconds: float, last: bool) -> None:
        malloc.reuse()


class LossScaleMetrics(Hook):
    """Log the loss scale and the updates skipped so far after every call; the skipped count goes in the result."""

    def __init__(self, scale: Any, record: Any):
        self.scale, self.record = scale, record
        self.last: dict[str, float] = {}

    def after(self, step: int, n: int, seconds: float, last: bool) -> None:
        self.last = self.scale.state()
        self.record(self.last, step)

    def figures(self) -> dict[str, float]:
        return {"skipped_steps": self.last.get("skipped_steps", 0.0)}


class Profile(Hook):
    """Trace the first full call that would be timed (never the first call: that one traces the tf.function) into
    `folder` with TensorFlow's profiler (host and any GPU: `<folder>/plugins/profile/<time>/*.xplane.pb`, which
    `profile.op_seconds` reads); that call is then left out of the timing, and its steps and seconds become figures."""

    def __init__(self, folder: Path, steps_per_call: int, warmup_calls: int):
        self.folder, self.steps_per_call, self.warmup_calls = folder, steps_per_call, warmup_calls
        self.tracing = False
        self.traced: dict[str, float] = {}

    def around(self, calls: int, n: int) -> ContextManager[None] | None:
        if self.traced or n != self.steps_per_call or calls < max(1, self.warmup_calls):
            return None
        import tensorflow as tf

        self.tracing = True
        return tf.profiler.experimental.Profile(str(self.folder))

    def after(self, step: int, n: int, seconds: float, last: bool) -> None:
        if self.tracing:
            self.tracing = False
            self.traced = {"profile_steps": float(n), "profile_seconds": seconds}

    def figures(self) -> dict[str, float]:
        return self.traced


def input_figures(strategy: Any, batches: Any, train: Any, timed: dict) -> dict:
    """The steps per second the input pipeline delivers alone (no model; three calls timed after one warm-up call)
    beside the training step rate; input-bound when the pipeline is under 3x the steps."""
    if "step_time_ms" not in timed:
        return {}
    import tensorflow as tf

    drain, n, calls = strategy.input_loop(batches), tf.constant(train.steps_per_call), 3
    int(drain(n)[1])
    if train.reuse_freed_memory:
        malloc.reuse()  # the warm-up started this feed's iterators (see ReuseFreedMemory)
    pipeline = calls * train.steps_per_call / timeit.timeit(lambda: int(drain(n)[1]), "gc.enable()", number=calls)
    step = 1000.0 / timed["step_time_ms"]
    bound = pipeline < INPUT_BOUND_RATIO * step
    if bound:
        log.warning("input-bound: the pipeline alone gives %.0f batches/s, under %dx the %.0f steps/s of training",
                    pipeline, INPUT_BOUND_RATIO, step)
    return {"input_batches_per_sec": pipeline, "step_batches_per_sec": step, "input_bound": float(bound)}


def peak_rss_mb() -> float:
    """The process's own peak resident memory so far, in MiB: Linux's VmHWM, which starts again at exec (ru_maxrss
    keeps the peak of the parent's copy a child had before exec); elsewhere ru_maxrss (KiB; bytes on macOS)."""
    try:
        with open("/proc/self/status") as status:
            return next(int(line.split()[1]) for line in status if line.startswith("VmHWM:")) / 1024
    except (OSError, StopIteration):
        maxrss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return maxrss / 2**20 if sys.platform == "darwin" else maxrss / 1024
