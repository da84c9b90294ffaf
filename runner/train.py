"""The training loop: compiled calls of several steps, warm-up-excluded timing, periodic evaluation.

The loop only sees the strategy's entry points (`train_loop(batches)` and `evaluate(dataset)`), so every strategy
and pipeline plugs in without changing it. What is done around the calls without changing them (checkpoints, the
allocator reset, a profiler trace) comes in as `Hook`s; measurements after training live in `runner.measure`.
"""

from __future__ import annotations

import contextlib
import logging
import math
import sys
import time
from dataclasses import dataclass, field
from typing import Any, Callable, ContextManager

import numpy as np

import runner
from runner import signals
from runner.errors import UserError

log = logging.getLogger(__name__)

Record = Callable[[dict, int], None]  # (metrics, step) -> logged


class NonFiniteLoss(UserError):
    """The training loss became NaN or infinite."""


class Hook:
    """Something done around the training calls without changing them; subclasses override what they need."""

    def around(self, calls: int, n: int) -> ContextManager[None] | None:
        """A context to run the next call in (`calls` made so far, `n` steps in it); such a call is not timed."""
        return None

    def after(self, step: int, n: int, seconds: float, last: bool) -> None:
        """After the call of `n` steps that ended at `step` took `seconds`; `last`: the run's final call."""

    def stopped(self, step: int) -> None:
        """The run is stopping early at `step` (a signal asked it to); save what is needed to resume."""

    def figures(self) -> dict[str, float]:
        """Summary figures this hook adds to the run's result."""
        return {}


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


def _call(loop: Any, n: int, step: int) -> tuple[float, float]:
    """One compiled call of n steps from `step`: (mean loss, seconds). Raises NonFiniteLoss naming the bad step."""
    import tensorflow as tf

    t0 = time.perf_counter()
    mean_loss, done = loop(tf.constant(n))
    loss, done = float(mean_loss), int(done)  # reading the values waits for the call to finish
    seconds = time.perf_counter() - t0
    if done < n:
        raise NonFiniteLoss(f"training loss is not finite at step {step + done + 1}; stopped there")
    return loss, seconds


def evaluate(strategy: Any, eval_ds: Any, record: Record, step: int) -> tuple[float, float]:
    """Test loss and accuracy now, recorded at `step`."""
    test_loss, test_acc = strategy.evaluate(eval_ds)
    record({"test_loss": test_loss, "test_accuracy": test_acc}, step)
    return test_loss, test_acc


def steps_to_time(train: Any) -> int:
    """The fewest steps a run needs for one timed call: calls 1 (one step) and 2 (up to the first multiple of
    steps_per_call) are never full, and the first `warmup_calls` calls are warm-up."""
    return max(3, train.warmup_calls + 1) * train.steps_per_call - train.steps_per_call


def untimed(train: Any, steps: int) -> str:
    """Why a run of `steps` steps timed nothing, and what would: the one line a too-short run logs."""
    return (f"images/s not measured: {steps} steps leave no full call after warm-up (train.warmup_calls="
            f"{train.warmup_calls}, train.steps_per_call={train.steps_per_call}); timing needs train.steps >= "
            f"{steps_to_time(train)}")


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
    """Where the training calls got to: the last step and loss, and when the first step ended."""

    timer: Timer
    step: int
    loss: float = float("nan")
    first_step_at: float | None = None  # wall clock when the first call (one step) returned


def _one_call(loop: Any, done: _Calls, n: int, hooks: list[Hook]) -> float:
    """Run the next call inside whatever context a hook asks for; returns its seconds."""
    contexts = [c for c in (h.around(done.timer.calls, n) for h in hooks) if c is not None]
    with contextlib.ExitStack() as stack:
        for context in contexts:
            stack.enter_context(context)
        done.loss, seconds = _call(loop, n, done.step)
    done.timer.add(n, seconds, timed=not contexts)
    return seconds


def _run_calls(loop: Any, strategy: Any, eval_ds: Any, train: Any, steps: int, start: int, record: Record,
               hooks: list[Hook]) -> _Calls:
    """Call the compiled loop until `steps`, logging each call, evaluating on schedule, and telling the hooks."""
    done, progress = _Calls(Timer(train.warmup_calls, train.steps_per_call), start), Progress(steps)
    with signals.at_call_boundaries():  # Ctrl-C or SIGTERM: stop after the running call, its step saved
        while done.step < steps:
            n = min(call_size(done.step - start, train.steps_per_call), steps - done.step)
            seconds = _one_call(loop, done, n, hooks)
            done.first_step_at = done.first_step_at or time.time()
            done.step += n
            rate = n * train.global_batch_size / seconds
            record({"train_loss": done.loss, "call_images_per_sec": rate}, done.step)
            progress.update(done.step, done.loss, rate)
            for hook in hooks:
                hook.after(done.step, n, seconds, last=done.step >= steps)
            if signals.requested() is not None and done.step < steps:
                log.warning("stopping at step %d of %d on request", done.step, steps)
                for hook in hooks:
                    hook.stopped(done.step)
                signals.stop()
            if done.step < steps and crossed(done.step, n, train.eval_every):
                evaluate(strategy, eval_ds, record, done.step)
    return done


def fit(strategy: Any, batches: Any, eval_ds: Any, train: Any, steps: int, record: Record, start: int = 0,
        hooks: list[Hook] | None = None) -> dict:
    """Train from step `start` to `steps`, evaluate, and return the summary metrics.

    Args:
        strategy: gives train_loop(batches), input_loop(batches) and evaluate(dataset).
        batches: the pipeline's feed, as the strategy made it.
        eval_ds: the test set.
        train: the validated `train` config.
        steps: optimizer steps the whole run makes.
        record: called with (metrics, step) for every logged point.
        start: steps already done (restored from a checkpoint); the feed skips their batches.
        hooks: called around and after every compiled call (checkpoints, profiler, allocator).

    Returns:
        train_loss, test_loss, test_accuracy, train_seconds, steps, resumed_from_step, seconds_to_first_step,
        images_per_sec (± stderr), step_time_ms, timed_steps, and the hooks' figures.
    """
    hooks = hooks or []
    if start:
        fast_forward(strategy, batches, start)
    loop = strategy.train_loop(batches)
    t0 = time.perf_counter()
    done = _run_calls(loop, strategy, eval_ds, train, steps, start, record, hooks)
    train_seconds = time.perf_counter() - t0
    test_loss, test_acc = evaluate(strategy, eval_ds, record, done.step)
    return {
        "train_loss": done.loss,
        "test_loss": test_loss,
        "test_accuracy": test_acc,
        "train_seconds": train_seconds,
        "steps": float(done.step),
        "resumed_from_step": float(start),
        # start-up, data, tracing and one step:
        "seconds_to_first_step": (done.first_step_at or time.time()) - runner.STARTED_AT,
        **done.timer.summary(train.global_batch_size),
        **{k: v for hook in hooks for k, v in hook.figures().items()},
    }
