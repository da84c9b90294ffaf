"""train.jit_compile=auto decided by measurement: the run's own model, batch and device, its compiled step timed
with XLA and without in alternating calls, once per machine (cached like the matmul peak), the faster kept.

Not by device kind: on one CPU XLA speeds some models up and slows others down (BENCHMARKS.md). The caller builds
the two loops (runner.experiment); the cost model and the bench read the same cached decision (`cached`).
"""

from __future__ import annotations

import functools
import hashlib
import logging
import math
import sys
import time
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any, Callable

from runner.errors import one_line
from runner.paths import cache_dir, read_cache, write_cache

log = logging.getLogger(__name__)

CACHE_FILE = "xla.json"
ROUNDS = 3  # alternating timed calls each way; the fastest call of each side counts
CALL_SECONDS = 0.15  # one timed call's length in steps of the side's speed (mlp, gpt, dlrm: as at 0.3 s, 0.9 s sooner)
TIE = 0.05  # XLA kept only when its step is at least this much faster: within it, its compile time buys nothing

# fn(steps) -> seconds: run `steps` compiled training steps and wait for them (a loop's first call compiles it).
Timed = Callable[[int], float]


@dataclass(frozen=True)
class Decision:
    """What train.jit_compile=auto chose for a run, and why (the run's `jit_compile_reason`)."""

    on: bool
    reason: str


def key(plan: Any, device_name: str) -> str:
    """The cache entry of a run's decision: the device (`peak.describe`), a digest of the model's options, the
    data's spec and the optimizer (its update is part of the compiled step), the per-device batch, the precision, and
    of what compiles the step (`step_code`: a new version of it measures again)."""
    from runner.measure.peak import describe

    optimizer = (plan.train.optimizer, plan.train.fused_optimizer)
    digest = hashlib.sha256(repr((plan.model, plan.spec, optimizer, step_code(plan))).encode()).hexdigest()[:16]
    return f"{describe(device_name)[0]}|{digest}|b{plan.train.per_device_batch_size}|{plan.train.precision}"


def step_code(plan: Any) -> tuple[str, str]:
    """TensorFlow's version and a digest of the source that makes the run's step: the model's module (a user's
    builder's own), the step and the optimizers (runner.strategies.common, runner.optimizers)."""
    import inspect

    from runner import optimizers
    from runner.registry import locate
    from runner.strategies import common

    target = getattr(plan.model, "target", "")
    files = {inspect.getfile(locate(target, "model") if target else type(plan.model)), common.__file__,
             optimizers.__file__}
    code = hashlib.sha256(b"".join(Path(f).read_bytes() for f in sorted(files))).hexdigest()[:16]
    return _tensorflow_version(), code


@functools.lru_cache(maxsize=None)
def _tensorflow_version() -> str:
    """TensorFlow's version: the imported module's (a run's), else the installed distribution's, read without
    importing it (the cost model reads decisions without it; finding the distribution takes 0.1-0.2 s)."""
    if "tensorflow" in sys.modules:
        return sys.modules["tensorflow"].__version__
    names = metadata.packages_distributions().get("tensorflow", [])
    return metadata.version(names[0]) if names else "none"


def setting(plan: Any, device_name: str, folder: Path | None = None) -> Decision | None:
    """train.jit_compile resolved without measuring, or None (auto, and nothing cached for this model and batch):
    a fixed true or false; off where the strategy cannot compile its step; the decision cached by an earlier run."""
    if plan.train.jit_compile != "auto":
        return Decision(bool(plan.train.jit_compile), f"train.jit_compile={str(plan.train.jit_compile).lower()}")
    if refusal := plan.strategy.jit_refusal():
        return Decision(False, f"off: {refusal}")
    return cached(key(plan, device_name), folder)


def cached(entry_key: str, folder: Path | None = None) -> Decision | None:
    """The decision cached for `entry_key`, or None: the cost model and the bench read it without measuring."""
    entry = read_cache(_path(folder)).get(entry_key)
    return _decision(entry, True) if isinstance(entry, dict) and {"xla_ms", "xla_error"} & set(entry) else None


def decide(entry_key: str, label: str, timed: Callable[[bool], Timed], folder: Path | None = None) -> Decision:
    """XLA on or off for the run (`entry_key`: its `key`): the cached decision, else measured now (announced in one
    line) and cached; `label` says what was timed, `timed(jit)` gives the run's step compiled that way."""
    found = cached(entry_key, folder)
    if found is not None:
        return found
    path = _path(folder)
    log.info("train.jit_compile=auto: timing the step of %s with XLA and without, once (cached in %s)", label, path)
    entry = {**measure(timed), "label": label, "measured": time.strftime("%Y-%m-%dT%H:%M:%S")}
    try:
        write_cache(path, {entry_key: entry})
    except OSError as e:  # an unwritable cache costs a probe next time, not the run
        log.warning("train.jit_compile=auto: decision not cached (%s)", e)
    decision = _decision(entry, False)
    log.info("train.jit_compile=auto: %s", decision.reason)
    return decision


def measure(timed: Callable[[bool], Timed]) -> dict[str, float]:
    """Milliseconds per step without XLA and with it: each side's loop compiled and warmed by a first call, then
    ROUNDS alternating calls of about CALL_SECONDS each; the fastest call of each side (others' load only slows)."""
    loops = {False: timed(False), True: timed(True)}
    per_step = {}
    for on, loop in loops.items():
        try:
            loop(2)  # traces and compiles (XLA: the cluster too)
        except Exception as e:  # noqa: BLE001 - an op XLA cannot compile (a sparse update): the step stays plain
            if not on:
                raise
            return {"plain_ms": round(per_step[False] * 1e3, 3), "xla_error": one_line(e)}
        per_step[on] = loop(2) / 2
    steps = {on: max(1, math.ceil(CALL_SECONDS / max(s, 1e-6))) for on, s in per_step.items()}
    best = {False: math.inf, True: math.inf}
    for _ in range(ROUNDS):
        for on, loop in loops.items():
            best[on] = min(best[on], loop(steps[on]) / steps[on])
    return {"plain_ms": round(best[False] * 1e3, 3), "xla_ms": round(best[True] * 1e3, 3)}


def _decision(entry: dict, was_cached: bool) -> Decision:
    """On when XLA's step is more than TIE faster; the reason names both figures and what was timed."""
    label, when = entry.get("label", "this model"), entry.get("measured", "") + (" (cached)" if was_cached else "")
    if "xla_error" in entry:
        return Decision(False, f"off: XLA cannot compile the step of {label} ({entry['xla_error']}), {when}")
    plain, xla = float(entry["plain_ms"]), float(entry["xla_ms"])
    on, ratio = xla < plain * (1 - TIE), plain / xla if xla > 0 else math.inf
    return Decision(on, f"{'on' if on else 'off'}: measured {xla:.3g} ms/step with XLA against {plain:.3g} without "
                        f"({ratio:.2f}x) for {label}, {when}")


def _path(folder: Path | None) -> Path:
    return (folder or cache_dir()) / CACHE_FILE
