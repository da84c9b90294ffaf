"""Predictions for a sweep's combinations: each validated without TensorFlow, grouped by device set, calibrated in
one fresh process per device set (or read from the cache), then priced by the cost model."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from runner.errors import UserError, one_line
from runner.measure.peak import BUSY
from runner.predict import calibrate
from runner.predict.costs import Prediction, check_covered, combination, predict

log = logging.getLogger(__name__)

TIE = 0.10  # predicted rates closer than this are called a tie: the model is not finer than that


@dataclass
class Outcome:
    """One combination: its overrides, its name, and its prediction or why there is none."""

    overrides: list[str]
    label: str
    prediction: Prediction | None = None
    error: str | None = None


def expand(overrides: list[str]) -> list[list[str]]:
    """Every combination of a sweep's overrides (`strategy=a,b gpus=2,4`), in the order Hydra's basic sweeper runs
    them; flags (`-m`) and Hydra's own settings (`hydra.*`, but for the user's config folders) are left out."""
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
    from hydra.core.override_parser.overrides_parser import OverridesParser

    kept = [o for o in overrides if not o.startswith("-")
            and (not o.startswith("hydra.") or o.startswith("hydra.searchpath="))]
    parsed = OverridesParser.create().parse_overrides(kept)
    return [list(c) for c in BasicSweeper.split_arguments(parsed, None)[0]] if parsed else [[]]


def _plan(overrides: list[str]) -> tuple[Any, str | None]:
    """A combination's plan (None if refused) and why it cannot be predicted (refused, or no cost model).

    An override Hydra cannot compose (`gpus=abc`) is raised, not a row: it is the command's error, reported in the
    one line `python -m runner` gives it, before any calibration.
    """
    from runner.config import compose, validate

    cfg = compose(overrides)
    try:
        plan = validate(cfg)
    except Exception as e:  # noqa: BLE001 - any refusal is this combination's row
        return None, one_line(e)
    try:
        check_covered(plan)
    except UserError as e:
        return plan, one_line(e)
    return plan, None


def _child(args: list[str], timeout: int) -> Any:
    """Run `python ARGS` in a fresh process and return the JSON of its result line, or the reason there is none as
    {"error": ...} (its last line on stderr, or that it ran out of time)."""
    try:
        proc = subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=timeout,
                              env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"})
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout} s"}
    lines = [line for line in proc.stdout.splitlines() if line.startswith(calibrate.RESULT)]
    if not lines:
        said = [line for line in proc.stderr.splitlines() if line.strip()]
        return {"error": said[-1] if said else f"exit {proc.returncode}"}
    return json.loads(lines[-1].removeprefix(calibrate.RESULT))


def _calibrate(overrides: list[list[str]], wanted: set[str]) -> dict[str, dict]:
    """Measure `wanted` for combinations of one device set in a fresh process (devices are set once per process)."""
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump({"overrides": overrides, "wanted": sorted(wanted)}, f)
    try:
        result = _child(["-m", "runner.predict.calibrate", f.name], 600)
    finally:
        Path(f.name).unlink(missing_ok=True)
    return {"error": f"calibration failed: {result['error']}"} if "error" in result else result


def predict_all(combos: list[list[str]], recalibrate: bool = False, cache_dir: Path | None = None) -> list[Outcome]:
    """A prediction (or the reason there is none) for every combination, calibrating what the cache lacks."""
    outcomes, groups = [], {}
    for overrides in combos:
        plan, error = _plan(overrides)
        outcome = Outcome(overrides, combination(plan) if plan else " ".join(overrides), error=error)
        outcomes.append(outcome)
        if error is None:
            groups.setdefault(calibrate.device_set_key(plan), []).append((plan, outcome))
    cached = calibrate.read_cache(cache_dir)
    for members in groups.values():
        plans = [plan for plan, _ in members]
        needed = set().union(*(keys(p) for p in plans))
        wanted = needed if recalibrate else {k for k in needed if k not in cached}
        measured = _calibrate(_covering(members, wanted), wanted) if wanted else {}
        if "error" in measured:
            for _, outcome in members:
                outcome.error = measured["error"]
            continue
        disturbed = max((e.get("others_cpu_share", 0.0) for e in measured.values()), default=0.0)
        if disturbed > BUSY:  # others' load slowed the figures: use them once, never cache them
            log.warning("calibration disturbed: other processes used %.0f%% of the CPUs; not cached, and "
                        "these predictions are too slow", 100 * disturbed)
        elif measured:
            calibrate.write_cache(measured, cache_dir)
        entries = {**cached, **measured}
        for plan, outcome in members:
            outcome.prediction = _priced(plan, entries)
    return outcomes


def _covering(members: list[tuple[Any, Outcome]], wanted: set[str]) -> list[list[str]]:
    """The overrides of the first combinations that between them need every calibration in `wanted`: the child
    composes only those (composing a config costs ~0.1 s, a grid has dozens per device set)."""
    left, out = set(wanted), []
    for plan, outcome in members:
        if keys(plan) & left:
            out.append(outcome.overrides)
            left -= keys(plan)
    return out


def keys(plan: Any) -> set[str]:
    """The calibrations a plan's prediction needs."""
    return {calibrate.machine_key(plan), calibrate.towers_key(plan), calibrate.input_key(plan)}


def predict_run(plan: Any, devices: Any, examples: Any, cache_dir: Path | None = None) -> Prediction:
    """A run's own prediction, after its training: the cache's calibrations, what it lacks measured in this process
    (whose devices are the run's) and cached unless other processes disturbed it. Raises UserError (no cost
    model)."""
    from runner.measure.peak import timed_with_others_share

    check_covered(plan)
    cached = calibrate.read_cache(cache_dir)
    wanted = {k for k in keys(plan) if k not in cached}
    if wanted:  # seconds after the run's last step: said before they start
        log.info("calibrating the cost model for this combination once (cached in %s): a few seconds",
                 calibrate.cache_path(cache_dir))
    measured, others = timed_with_others_share(
        lambda: calibrate.measure_here([plan], wanted, devices, lambda _: examples) if wanted else {})
    if measured and others <= BUSY:
        calibrate.write_cache({k: {**e, "others_cpu_share": round(others, 2)} for k, e in measured.items()}, cache_dir)
    return _priced(plan, {**cached, **measured})


def _priced(plan: Any, entries: dict[str, dict]) -> Prediction:
    """The plan's prediction from calibration entries holding its keys."""
    return predict(plan, entries[calibrate.machine_key(plan)], entries[calibrate.towers_key(plan)],
                   entries[calibrate.input_key(plan)])


def ranked(outcomes: list[Outcome]) -> list[Outcome]:
    """Predicted combinations fastest first, then the others in their given order."""
    priced = sorted((o for o in outcomes if o.prediction), key=lambda o: -o.prediction.rate)
    return priced + [o for o in outcomes if not o.prediction]


def table(outcomes: list[Outcome]) -> list[str]:
    """The markdown table and the line naming the predicted fastest (and what ties with it)."""
    from runner.predict.costs import TERMS

    unit = next((o.prediction.unit for o in outcomes if o.prediction), "images")
    lines = [f"| combination | predicted {unit}/s | step ms | dominant term | "
             + " | ".join(f"{t} ms" for t in TERMS) + " |", "|" + "---|" * (4 + len(TERMS))]
    for o in ranked(outcomes):
        if o.prediction is None:
            lines.append(f"| {o.label} | not predicted: {o.error} |" + " |" * (2 + len(TERMS)))
            continue
        p = o.prediction
        lines.append(f"| {o.label} | {p.rate:,.0f} | {1e3 * p.step_seconds:.2f} | {p.dominant} | "
                     + " | ".join(f"{1e3 * p.terms[t]:.2f}" for t in TERMS) + " |")
    return lines + ["", fastest_line(outcomes)]


def fastest_line(outcomes: list[Outcome]) -> str:
    """`predicted fastest: X (rate); ties within 10%: Y, Z` or why none was predicted."""
    priced = [o for o in ranked(outcomes) if o.prediction]
    if not priced:
        return "predicted fastest: none (no combination could be predicted)"
    best = priced[0].prediction.rate
    ties = [o.label for o in priced[1:] if o.prediction.rate >= (1 - TIE) * best]
    text = f"predicted fastest: {priced[0].label} ({best:,.0f} {priced[0].prediction.unit}/s)"
    return text + (f"; within {TIE:.0%} of it (a tie for this model): {', '.join(ties)}" if ties else "")


def predict_elsewhere(combos: list[list[str]]) -> list[Outcome]:
    """`predict_all` in a fresh process, for callers inside a Hydra app (a sweep's start), where composing other
    configs is not allowed."""
    result = _child(["-m", "runner.predict.grid", json.dumps(combos)], 1200)
    if isinstance(result, dict):  # {"error": ...}
        return [Outcome(c, " ".join(c), error=f"prediction failed: {result['error']}") for c in combos]
    return [Outcome(**{**item, "prediction": item["prediction"] and Prediction(**item["prediction"])})
            for item in result]


if __name__ == "__main__":
    found = predict_all(json.loads(sys.argv[1]))
    sys.stdout.write(calibrate.RESULT + json.dumps([asdict(o) for o in found]) + "\n")
