"""The training loop: compiled calls of several steps, warm-up-excluded timing, periodic evaluation.

The loop only sees the strategy's entry points (`train_loop(batches)` and `evaluate(dataset)`), so every strategy
and pipeline plugs in without changing it. What is done around the calls without changing them (checkpoints, the
allocator reset, a profiler trace) comes in as `Hook`s; measurements after training live in `runner.measure.hooks`.
"""

from __future__ import annotations

import contextlib
import logging
import math
import re
import shutil
import sys
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, ContextManager

import numpy as np

import runner
from runner.errors import ConfigError, UserError, one_line
from runner.lazy import tf
from runner.runtime import signals
from runner.tasks import FIRST_CHECK, Target

if TYPE_CHECKING:
    from runner.config import TrainConf

log = logging.getLogger(__name__)

Record = Callable[[dict, int], None]  # (metrics, step) -> logged


class NonFiniteLoss(UserError):
    """The training loss became NaN or infinite."""


class Hook:
    """Something done around the training calls without changing them; subclasses override what they need."""

    def start(self, elapsed: Elapsed) -> None:
        """Training starts (from step 0 or a checkpoint's) with `elapsed`, the run's training time over all its
        parts, which the loop keeps current; a hook that saves the run's state fills in what it restored."""

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


def total_steps(train: TrainConf, n_train: int) -> int:
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

    def summary(self, per_step: int, unit: str = "images") -> dict[str, float]:
        """`unit`/s (mean and standard error over timed calls; `per_step` units a step) and step time, or {} if
        nothing was timed. One timed call has no standard error (not 0: nothing measured its spread)."""
        if not self.seconds:
            return {}
        rates = np.array(self.steps) * per_step / np.array(self.seconds)  # units/s per call
        stderr = {f"{unit}_per_sec_stderr": float(rates.std(ddof=1) / math.sqrt(len(rates)))} if len(rates) > 1 else {}
        return {
            f"{unit}_per_sec": float(sum(self.steps) * per_step / sum(self.seconds)),
            **stderr,
            "step_time_ms": float(1000 * sum(self.seconds) / sum(self.steps)),
            "timed_steps": float(sum(self.steps)),
        }


class Progress:
    """tqdm's bar on an interactive terminal (steps, loss, images/s, elapsed, time left); elsewhere a log line about
    every 10% with the same figures, so that log files stay readable."""

    def __init__(self, total: int, start: int = 0, unit: str = "images"):
        self.total, self.t0, self.next_log = total, time.monotonic(), 0.0
        self.first: tuple[int, float] | None = None  # the first logged step and when: time left is timed from it
        self.unit = {"images": "img", "tokens": "tok", "examples": "ex"}[unit]
        self.bar = None
        if sys.stderr.isatty():
            from tqdm import tqdm

            width = shutil.get_terminal_size((100, 20)).columns  # a terminal of unknown size: 100 columns
            self.bar = tqdm(total=total, initial=start, unit="step", ncols=width, file=sys.stderr, leave=True)

    def update(self, step: int, loss: float, rate: float) -> None:
        if self.bar is not None:
            self.bar.set_postfix_str(f"loss {loss:.4f}, {rate:,.0f} {self.unit}/s", refresh=False)
            self.bar.update(step - self.bar.n)
            if step >= self.total:
                self.bar.close()
        elif step >= self.next_log or step >= self.total:
            now = time.monotonic()
            first_step, first_at = self.first = self.first or (step, now)
            # from the first logged step on: the time to it holds the step's tracing ('22:27:03 left' of 1.5 h)
            left = (f", {_clock((now - first_at) / (step - first_step) * (self.total - step))} left"
                    if step > first_step else "")
            log.info("step %d/%d loss %.4f %.0f %s/s, %s elapsed%s", step, self.total, loss, rate, self.unit,
                     _clock(now - self.t0), left)
            self.next_log = step + self.total / 10


def _clock(seconds: float) -> str:
    """12.3 s, 4:05 or 1:02:03."""
    if seconds < 60:
        return f"{seconds:.1f} s"
    minutes, secs = divmod(int(seconds), 60)
    return f"{minutes // 60}:{minutes % 60:02d}:{secs:02d}" if minutes >= 60 else f"{minutes}:{secs:02d}"


FROM_INPUT = "IteratorGetNext"  # named in a TensorFlow error raised while an input iterator made a batch


def _bad_data(e: Exception, source: str) -> Exception | None:
    """A DataError for an example the data's own checks refused (`records.refused`) or its input pipeline could
    not read (an error raised through an input iterator), naming `source`; None for an error that is not the data's."""
    from runner.data_pipelines import DataError, records

    if refused := records.refused(str(e), source):
        return refused
    if FROM_INPUT in str(e):
        # a fixed-length feature of another length: the config's length, not the files, may be what is wrong
        length = " (are its input_ids data.sequence_length ids long?)" if "Key: input_ids" in str(e) else ""
        return DataError(f"an example of {source} cannot be read: {one_line(e).rstrip('.')}{length}; fix the files, "
                         "or leave out the one holding it")
    return None


# What TensorFlow says when an XLA cluster (train.jit_compile) holds what it cannot compile: an op with no XLA
# kernel, or an op input XLA needs as a constant (a shape or a count computed at run time).
XLA_NO_KERNEL = re.compile(r"Detected unsupported operations when trying to compile graph \S+ on XLA_\w+_JIT: "
                           r"(\w+(?:, \w+)*)")
XLA_NOT_CONSTANT = re.compile(r"with op (\w+) must be a compile-time constant")


def _not_compilable(e: Exception) -> Exception | None:
    """A ConfigError naming what XLA could not compile (the model's: train.jit_compile put its forward and backward
    in an XLA cluster), or None for an error that is not XLA's refusal."""
    text = str(e)
    if found := XLA_NO_KERNEL.search(text):
        what = f"op {', '.join(dict.fromkeys(found.group(1).split(', ')))} (no XLA kernel)"
    elif found := XLA_NOT_CONSTANT.search(text):
        what = f"op {found.group(1)} (an input computed at run time, which XLA needs as a constant)"
    else:
        return None
    return ConfigError(f"train.jit_compile: XLA cannot compile the model's {what}; set train.jit_compile=false")


@dataclass
class Elapsed:
    """A run's training time over all its parts (evaluation excluded): a run resumed from its checkpoint trains in
    several processes, and its time to target counts every part's (runner.checkpoints saves it).

    Attributes:
        earlier: training seconds of the parts before this process, through the step it resumed from.
        now: this process's training seconds through its last call.
        reached: (step, training seconds of all parts) when the full test set first reached the target.
        unknown: why the earlier parts' training time is not known (a checkpoint saved without it); '' when known.
    """

    earlier: float = 0.0
    now: float = 0.0
    reached: tuple[int, float] | None = None
    unknown: str = ""

    @property
    def seconds(self) -> float:
        """Training seconds of all parts so far; NaN when an earlier part's are not known."""
        return math.nan if self.unknown else self.earlier + self.now


@dataclass
class Evaluations:
    """Evaluation during training, timed apart from it (`seconds`): the `full` test set every `eval_every` steps and
    at the end, and checks toward `target` (time to accuracy, or to a loss, as MLPerf's time-to-train): every
    `check_every` steps the `checks` subset (its first examples) is evaluated, and a check that meets the target is
    confirmed on the full set, whose crossing fixes the step and the training seconds (`elapsed`). `record` logs
    (metrics, step)."""

    strategy: Any
    full: Any
    checks: Any
    record: Record
    target: Target | None = None
    eval_every: int = 0
    check_every: int = 0
    seconds: float = 0.0
    elapsed: Elapsed = field(default_factory=Elapsed)
    tested: int = 0  # evaluations that could have met the target so far
    first_check: bool = False  # the target met at the first of them: its time is the start-up's, not training's

    def after_call(self, step: int, n: int, train_seconds: float, evaluate: bool = True) -> None:
        """Note this process's `train_seconds` after the call of `n` steps that ended at `step`, and evaluate what is
        due then (`evaluate` False: nothing, the run's last call, which `final` evaluates, or a run stopping)."""
        t0 = time.perf_counter()
        self.elapsed.now = train_seconds
        if evaluate and crossed(step, n, self.eval_every):
            self.tested += 1
            self._full(step)
        elif evaluate and self.target and not self.elapsed.reached and crossed(step, n, self.check_every):
            self.tested += 1
            scores = self.strategy.evaluate(self.checks)
            seconds = self.elapsed.seconds
            self.record({f"check_{self.target.metric}": scores[self.target.metric],
                         **({"check_train_seconds": seconds} if not math.isnan(seconds) else {})}, step)
            if self.target.met(scores):
                self._full(step)
        self.seconds += time.perf_counter() - t0

    def _full(self, step: int) -> dict[str, float]:
        """The full test set's scores, logged as test_<score>."""
        scores = {f"test_{k}": v for k, v in self.strategy.evaluate(self.full).items()}
        self.record(scores, step)
        if self.target and not self.elapsed.reached and self.target.met({k[5:]: v for k, v in scores.items()}):
            self.elapsed.reached, self.first_check = (step, self.elapsed.seconds), self.tested == 1
            after = (f"after {self.elapsed.seconds:.1f} s of training" if not self.elapsed.unknown else
                     f"(its training time is not known: {self.elapsed.unknown})")
            log.info("%s reached the target %s at step %d %s",
                     ", ".join(f"{k[5:]} {v:.4f}" for k, v in scores.items()), self.target, step, after)
        return scores

    def final(self, step: int, train_seconds: float) -> dict[str, float]:
        """The end-of-run evaluation, and the time-to-accuracy figures (the steps alone where the run's training
        time is not known)."""
        t0 = time.perf_counter()
        self.elapsed.now = train_seconds
        self.tested += 1
        scores = self._full(step)
        self.seconds += time.perf_counter() - t0
        out = {**scores, "eval_seconds": self.seconds}
        if self.target:
            target, seconds, steps = self.target.keys
            out[target] = self.target.value
            if self.elapsed.reached:
                out[steps], out[FIRST_CHECK] = float(self.elapsed.reached[0]), float(self.first_check)
                if not math.isnan(self.elapsed.reached[1]):
                    out[seconds] = self.elapsed.reached[1]
            if self.elapsed.unknown:
                log.warning("time to %s not measured: %s", self.target, self.elapsed.unknown)
        return out

    def tags(self) -> dict[str, str]:
        """The run's tags about its target: whether it was reached and, where its time could not be measured, why."""
        if not self.target:
            return {}
        said = {"target.reached": str(self.elapsed.reached is not None).lower()}
        return {**said, "target.untimed": self.elapsed.unknown} if self.elapsed.unknown else said


def check_cadence(train: TrainConf, steps: int) -> int:
    """Steps between accuracy checks: `train.check_every`, else about 20 per run on call boundaries."""
    if train.check_every:
        return int(train.check_every)
    per_call = train.steps_per_call
    return max(per_call, math.ceil(steps / 20 / per_call) * per_call)


def steps_to_time(train: TrainConf) -> int:
    """The fewest steps a run needs for one timed call: calls 1 (one step) and 2 (up to the first multiple of
    steps_per_call) are never full, and the first `warmup_calls` calls are warm-up."""
    return max(3, train.warmup_calls + 1) * train.steps_per_call - train.steps_per_call


def untimed(train: TrainConf, steps: int, unit: str = "images", start: int = 0) -> str:
    """Why a run of `steps` steps, resumed at step `start`, timed nothing, and what would."""
    if start == steps:
        return f"{unit}/s not measured: resumed at step {start} of {steps}, no step was left to time"
    calls = (f"leave no full call after warm-up (train.warmup_calls={train.warmup_calls}, train.steps_per_call="
             f"{train.steps_per_call})")
    if start:
        return (f"{unit}/s not measured: resumed at step {start}, the {steps - start} steps left {calls}; a part "
                f"of a run is timed with {steps_to_time(train)} steps or more left")
    return f"{unit}/s not measured: {steps} steps {calls}; timing needs train.steps >= {steps_to_time(train)}"


def call_size(done: int, steps_per_call: int) -> int:
    """Steps in the next compiled call after `done` steps of this process: 1 for the first (its return marks the
    end of the first step, and logs the first loss at once), then up to a multiple of steps_per_call."""
    return 1 if done == 0 else steps_per_call - done % steps_per_call


def crossed(step: int, n: int, every: int) -> bool:
    """Whether the call of `n` steps that ended at `step` passed a multiple of `every` (0: never)."""
    return bool(every) and step // every > (step - n) // every


def fast_forward(strategy: Any, batches: Any, steps: int) -> None:
    """Pull the batches of `steps` steps through the feed unused: a resumed run continues where its data left off
    (the pipelines are deterministic for a seed)."""
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
    train_seconds: float = 0.0  # the loop's time, evaluation excluded


def _one_call(loop: Any, done: _Calls, n: int, hooks: list[Hook]) -> float:
    """Run the next compiled call of `n` steps inside whatever context a hook asks for, its mean loss kept in `done`;
    returns its seconds. Raises NonFiniteLoss naming the bad step."""
    contexts = [c for c in (h.around(done.timer.calls, n) for h in hooks) if c is not None]
    with contextlib.ExitStack() as stack:
        for context in contexts:
            stack.enter_context(context)
        t0 = time.perf_counter()
        mean_loss, ran = loop(tf.constant(n))
        loss, ran = float(mean_loss), int(ran)  # reading the values waits for the call to finish
        seconds = time.perf_counter() - t0
        if ran < n:
            raise NonFiniteLoss(f"training loss is not finite at step {done.step + ran + 1}; stopped there (look for "
                                "NaN or infinite values in the data, or lower train.learning_rate)")
        done.loss = loss
    done.timer.add(n, seconds, timed=not contexts)
    return seconds


def _run_calls(loop: Any, evals: Evaluations, train: TrainConf, steps: int, start: int, record: Record,
               hooks: list[Hook], unit: tuple[str, int]) -> _Calls:
    """Call the compiled loop until `steps`, logging each call, evaluating on schedule, and telling the hooks."""
    done = _Calls(Timer(train.warmup_calls, train.steps_per_call), start)
    progress = Progress(steps, start, unit[0])
    t0 = time.perf_counter()
    with signals.at_call_boundaries():  # Ctrl-C or SIGTERM: stop after the running call, its step saved
        while done.step < steps:
            n = min(call_size(done.step - start, train.steps_per_call), steps - done.step)
            seconds = _one_call(loop, done, n, hooks)
            done.first_step_at = done.first_step_at or time.time()
            done.step += n
            last = done.step >= steps
            rate = n * train.global_batch_size * unit[1] / seconds
            record({"train_loss": done.loss, f"call_{unit[0]}_per_sec": rate}, done.step)
            progress.update(done.step, done.loss, rate)
            # Evaluated before the hooks run, so that a checkpoint at this step holds a target reached at it; a run
            # asked to stop does not evaluate (it stops after the running call).
            evals.after_call(done.step, n, time.perf_counter() - t0 - evals.seconds,
                             evaluate=not last and signals.requested() is None)
            for hook in hooks:
                hook.after(done.step, n, seconds, last=last)
            if signals.requested() is not None:  # the last step's too: a start again has no step left to train
                log.warning("stopping at step %d of %d on request", done.step, steps)
                for hook in hooks:
                    hook.stopped(done.step)
                signals.raise_noted()
    done.train_seconds = time.perf_counter() - t0 - evals.seconds
    return done


def fit(strategy: Any, batches: Any, evals: Evaluations, train: TrainConf, steps: int, record: Record, start: int = 0,
        hooks: list[Hook] | None = None, source: str = "the data", unit: tuple[str, int] = ("images", 1)) -> dict:
    """Train `strategy` on `batches` (its feed) from step `start` (restored: the feed skips its batches) to `steps`,
    evaluate, and return the summary metrics: train_loss, the test scores, train_seconds (evaluation excluded),
    eval_seconds, steps, resumed_from_step, seconds_to_first_step, the timer's figures, the target's, the hooks'.
    `record` logs (metrics, step); `source` names where the examples come from when one cannot be read; `unit`:
    what the throughput counts and how many of it an example holds."""
    hooks = hooks or []
    for hook in hooks:
        hook.start(evals.elapsed)
    try:
        if start:
            fast_forward(strategy, batches, start)
            evals.tested += 1  # a resumed run trained before: a check of this part meeting its target is not start-up
        done = _run_calls(strategy.train_loop(batches), evals, train, steps, start, record, hooks, unit)
        final = evals.final(done.step, done.train_seconds)
    except (tf.errors.InvalidArgumentError, tf.errors.DataLossError) as e:
        # In one line when the cause is the user's to fix, which reaches Python as TensorFlow's error: an example
        # that cannot be used (`_bad_data`) or a model op XLA cannot compile (`_not_compilable`).
        raise _not_compilable(e) or _bad_data(e, source) or e
    except UnicodeDecodeError:  # TensorFlow's message naming a record it could not parse was not text itself
        from runner.data_pipelines import DataError

        raise DataError(f"a record of {source} cannot be parsed as a tf.train.Example (random or foreign bytes); fix "
                        "the files") from None
    return {
        "train_loss": done.loss,
        **final,
        "train_seconds": done.train_seconds,
        "steps": float(done.step),
        "resumed_from_step": float(start),
        # start-up, data, tracing and one step:
        "seconds_to_first_step": (done.first_step_at or time.time()) - runner.STARTED_AT,
        **done.timer.summary(train.global_batch_size * unit[1], unit[0]),
        **{k: v for hook in hooks for k, v in hook.figures().items()},
    }

