"""The training loop: compiled calls of several steps, warm-up-excluded timing, periodic evaluation.

The loop only sees the strategy's two entry points (`train_loop(batches)` and `evaluate(dataset)`), so every
strategy and pipeline plugs in without changing it.
"""

from __future__ import annotations

import functools
import logging
import math
import resource
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np

import runner
from runner import malloc

log = logging.getLogger(__name__)
INPUT_BOUND_RATIO = 3  # a pipeline slower than 3x the step rate leaves the devices waiting for data


class NonFiniteLoss(RuntimeError):
    """The training loss became NaN or infinite."""


def total_steps(train: Any, n_train: int) -> int:
    """Steps to run: `train.steps`, else `train.epochs` worth of global batches (at least one)."""
    if train.steps:
        return int(train.steps)
    return max(1, math.ceil(train.epochs * n_train / train.global_batch_size))


@dataclass
class Timer:
    """Per-call wall times, skipping the warm-up calls (tracing, compilation, first allocations)."""

    warmup_calls: int
    steps_per_call: int
    calls: int = 0
    steps: list[int] = field(default_factory=list)
    seconds: list[float] = field(default_factory=list)

    def add(self, n: int, dt: float, timed: bool = True) -> None:
        self.calls += 1
        # Short tail calls are excluded too: their per-step cost differs from a full call's.
        if timed and self.calls > self.warmup_calls and n == self.steps_per_call:
            self.steps.append(n)
            self.seconds.append(dt)

    def summary(self, global_batch: int) -> dict[str, float]:
        """images/s (mean and standard error over timed calls) and step time, or {} if nothing was timed."""
        if not self.seconds:
            return {}
        rates = np.array(self.steps) * global_batch / np.array(self.seconds)  # images/s per call
        stderr = rates.std(ddof=1) / math.sqrt(len(rates)) if len(rates) > 1 else 0.0
        return {
            "images_per_sec": float(sum(self.steps) * global_batch / sum(self.seconds)),
            "images_per_sec_stderr": float(stderr),
            "step_time_ms": float(1000 * sum(self.seconds) / sum(self.steps)),
            "timed_steps": float(sum(self.steps)),
        }


class Progress:
    """A one-line bar on an interactive terminal; otherwise a log line about every 10% (log files stay readable)."""

    def __init__(self, total: int):
        self.total = total
        self.tty = sys.stderr.isatty()
        self.next_log = 0.0

    def update(self, step: int, loss: float, rate: float) -> None:
        if self.tty:
            done = int(30 * step / self.total)
            bar = "#" * done + "." * (30 - done)
            sys.stderr.write(f"\r[{bar}] step {step}/{self.total} loss {loss:.4f} {rate:,.0f} img/s")
            sys.stderr.flush()
            if step >= self.total:
                sys.stderr.write("\n")
        elif step >= self.next_log or step >= self.total:
            log.info("step %d/%d loss %.4f %.0f img/s", step, self.total, loss, rate)
            self.next_log = step + self.total / 10


def input_rate(strategy: Any, batches: Any, steps_per_call: int, calls: int = 3, reuse_memory: bool = True) -> float:
    """Steps per second the input pipeline delivers alone (no model), timed after one warm-up call."""
    import tensorflow as tf

    drain = strategy.input_loop(batches)
    n = tf.constant(steps_per_call)
    int(drain(n)[1])
    if reuse_memory:
        malloc.reuse()  # the warm-up started this feed's iterators (see `_call`)
    t0 = time.perf_counter()
    for _ in range(calls):
        int(drain(n)[1])
    return calls * steps_per_call / (time.perf_counter() - t0)


def input_figures(strategy: Any, make_batches: Callable[[], Any], train: Any, timed: dict) -> dict:
    """Pipeline-alone rate beside the training step rate; input-bound when the pipeline is under 3x the steps."""
    if not timed:
        return {}
    pipeline = input_rate(strategy, make_batches(), train.steps_per_call, reuse_memory=train.reuse_freed_memory)
    step = 1000.0 / timed["step_time_ms"]
    bound = pipeline < INPUT_BOUND_RATIO * step
    if bound:
        log.warning("input-bound: the pipeline alone gives %.0f batches/s, under %dx the %.0f steps/s of training",
                    pipeline, INPUT_BOUND_RATIO, step)
    return {"input_batches_per_sec": pipeline, "step_batches_per_sec": step, "input_bound": float(bound)}


def _call(loop: Any, n: int, step: int, reuse_memory: bool) -> tuple[float, float]:
    """One compiled call of n steps from `step`: (mean loss, seconds). Raises NonFiniteLoss naming the bad step."""
    import tensorflow as tf

    t0 = time.perf_counter()
    mean_loss, done = loop(tf.constant(n))
    loss, done = float(mean_loss), int(done)  # reading the values waits for the call to finish
    seconds = time.perf_counter() - t0
    if reuse_memory:
        # A generator-based input iterator (tf.distribute's, prefetch_to_device's) starts in a call and leaves glibc
        # mapping and unmapping every tensor over 128 KiB from then on (runner/malloc.py); undo that after every call.
        malloc.reuse()
    if done < n:
        raise NonFiniteLoss(f"training loss is not finite at step {step + done + 1}; stopped there")
    return loss, seconds


def _profiled_call(loop: Any, n: int, step: int, reuse_memory: bool, folder: Path) -> tuple[float, float]:
    """`_call` under TensorFlow's profiler, writing the trace to `folder`."""
    from runner import profile

    with profile.trace(folder):
        return _call(loop, n, step, reuse_memory)


def _evaluate(strategy: Any, eval_ds: Any, record: Callable[[dict, int], None], step: int) -> tuple[float, float]:
    test_loss, test_acc = strategy.evaluate(eval_ds)
    record({"test_loss": test_loss, "test_accuracy": test_acc}, step)
    return test_loss, test_acc


def call_size(done: int, steps_per_call: int) -> int:
    """Steps in the next compiled call after `done` steps of this process: 1 for the first, then up to a multiple.

    The first call traces the loop and runs a single step, so its return marks the end of the first step (the job
    overhead figure) and the first loss is logged at once; from then on calls end on multiples of steps_per_call.
    """
    return 1 if done == 0 else steps_per_call - done % steps_per_call


def crossed(step: int, n: int, every: int) -> bool:
    """Whether the call of `n` steps that ended at `step` passed a multiple of `every` (0: never)."""
    return bool(every) and step // every > (step - n) // every


def fast_forward(strategy: Any, batches: Any, steps: int) -> None:
    """Pull the batches of `steps` steps through the feed unused: a resumed run continues where its data left off.

    The pipelines are deterministic for a seed, so this reproduces the uninterrupted run's data position exactly.
    """
    import tensorflow as tf

    t0 = time.perf_counter()
    int(strategy.input_loop(batches)(tf.constant(steps))[1])
    log.info("input fast-forwarded past %d finished steps in %.1f s", steps, time.perf_counter() - t0)


@dataclass
class _Calls:
    """Where the training calls got to: the last step and loss, and what was timed or traced on the way."""

    timer: Timer
    step: int
    loss: float = float("nan")
    first_step_at: float | None = None  # wall clock when the first call (one step) returned
    profiled: dict = field(default_factory=dict)


def _run_calls(
    loop: Any, strategy: Any, eval_ds: Any, train: Any, steps: int, start: int,
    record: Callable[[dict, int], None], checkpointer: Any, profile_dir: Path | None,
) -> _Calls:
    """Call the compiled loop until `steps`, logging each call and checkpointing/evaluating on schedule."""
    done, progress = _Calls(Timer(train.warmup_calls, train.steps_per_call), start), Progress(steps)
    while done.step < steps:
        n = min(call_size(done.step - start, train.steps_per_call), steps - done.step)
        # Trace the first full call that would be timed (never the first call: that one traces the tf.function).
        trace = (profile_dir is not None and not done.profiled and n == train.steps_per_call
                 and done.timer.calls >= max(1, train.warmup_calls))
        call = functools.partial(_profiled_call, folder=profile_dir) if trace else _call
        done.loss, dt = call(loop, n, done.step, train.reuse_freed_memory)
        done.timer.add(n, dt, timed=not trace)
        if trace:
            done.profiled = {"profile_steps": float(n), "profile_seconds": dt}
        done.first_step_at = done.first_step_at or time.time()
        done.step += n
        rate = n * train.global_batch_size / dt
        record({"train_loss": done.loss, "call_images_per_sec": rate}, done.step)
        progress.update(done.step, done.loss, rate)
        if checkpointer is not None and done.step < steps and crossed(done.step, n, train.checkpoint_every):
            checkpointer.save(done.step)
        if done.step < steps and crossed(done.step, n, train.eval_every):
            _evaluate(strategy, eval_ds, record, done.step)
    return done


def fit(
    strategy: Any, make_batches: Callable[[], Any], eval_ds: Any, cfg: Any, steps: int,
    record: Callable[[dict, int], None], checkpointer: Any = None, start: int = 0, profile_dir: Path | None = None,
) -> dict:
    """Train from step `start` to `steps`, evaluate, time the input pipeline alone, and return the summary metrics.

    Args:
        strategy: gives train_loop(batches), input_loop(batches) and evaluate(dataset).
        make_batches: makes a fresh pipeline feed, as the strategy wants it.
        eval_ds: the test set.
        cfg: the validated config.
        steps: optimizer steps the whole run makes.
        record: called with (metrics, step) for every logged point.
        checkpointer: saves the training state every `train.checkpoint_every` steps (None: never).
        start: steps already done (restored from a checkpoint); the feed skips their batches.
        profile_dir: trace the first call that would be timed into this folder (that call is left out of timing).

    Returns:
        train_loss, test_loss, test_accuracy, images_per_sec (± stderr), step_time_ms, train_seconds, and the
        pipeline-alone rate beside the step rate (input_batches_per_sec, step_batches_per_sec, input_bound),
        and with `profile_dir` the traced call's profile_steps and profile_seconds.
    """
    train = cfg.train
    batches = make_batches()
    if start:
        fast_forward(strategy, batches, start)
    loop = strategy.train_loop(batches)
    t0 = time.perf_counter()
    done = _run_calls(loop, strategy, eval_ds, train, steps, start, record, checkpointer, profile_dir)
    train_seconds = time.perf_counter() - t0
    del loop, batches  # frees the training feed (sharded: its device buffers) before the pipeline is timed alone
    test_loss, test_acc = _evaluate(strategy, eval_ds, record, done.step)
    timed = done.timer.summary(train.global_batch_size)
    return {
        "train_loss": done.loss,
        "test_loss": test_loss,
        "test_accuracy": test_acc,
        "train_seconds": train_seconds,
        "steps": float(done.step),
        "resumed_from_step": float(start),
        # start-up, data, tracing and one step:
        "seconds_to_first_step": (done.first_step_at or time.time()) - runner.STARTED_AT,
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,  # ru_maxrss is in KiB on Linux
        **timed,
        **done.profiled,
        **(input_figures(strategy, make_batches, train, timed) if train.measure_input else {}),
    }
