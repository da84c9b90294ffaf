"""Predictions for a sweep's combinations: each validated without TensorFlow, grouped by device set, calibrated in
one fresh process per device set (or read from the cache), then priced by the cost model."""

from __future__ import annotations

import json
import logging
import math
import os
import subprocess
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from runner.config import REPEATS, UNCOMPUTED, compose, validate
from runner.errors import ConfigError, UserError, last_line, one_line
from runner.measure.peak import BUSY, timed_with_others_share
from runner.paths import read_cache, write_cache
from runner.predict import calibrate, spec_sheet
from runner.predict.costs import TERMS, Prediction, combination, predict
from runner.report.prediction import TIE  # predicted rates closer than it: a tie
from runner.report.table import markdown, markdown_row
from runner.runtime.devices import import_tensorflow
from runner.runtime.quiet import filtered_stderr
from runner.strategies.common import build_model, tables

log = logging.getLogger(__name__)


@dataclass
class Outcome:
    """One combination: its overrides, its name, and its prediction or why there is none."""

    overrides: list[str]
    label: str  # the combination, then its `setting`
    prediction: Prediction | None = None
    error: str | None = None
    given: dict[str, Any] = field(default_factory=dict)  # strategy, pipeline, gpus, nodes, as composed
    setting: str = ""  # the overrides the sweep varies besides the combination's own (`varied_overrides`)
    disturbed: float | None = None  # others' share of the CPUs while its calibration was measured, where over BUSY
    note: str = ""  # how its prediction departs from the config (a precision priced as another), said under the table


def calibration(o: Outcome) -> str:
    """A prediction's calibration as a table cell: disturbed (other processes' share of the CPUs meanwhile), or '-'."""
    return f"disturbed (others used {o.disturbed:.0%} of the CPUs)" if o.disturbed else "-"


def expand(overrides: list[str]) -> list[list[str]]:
    """Every combination of a sweep's overrides (`strategy=a,b gpus=2,4`), in the order Hydra's basic sweeper runs
    them; flags (`-m`) and Hydra's own settings (`hydra.*`, but for the user's config folders) are left out."""
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
    from hydra.core.override_parser.overrides_parser import OverridesParser

    kept = [o for o in overrides if not o.startswith("-")
            and (not o.startswith("hydra.") or o.startswith("hydra.searchpath="))]
    parsed = OverridesParser.create().parse_overrides(kept)
    return [list(c) for c in BasicSweeper.split_arguments(parsed, None)[0]] if parsed else [[]]


def varied_overrides(combos: list[list[str]]) -> list[str]:
    """Each combination's overrides of the keys the sweep varies (`swept`): `hardware=gce_k80x8`,
    `train.precision=mixed_float16`, else ''. Without them two hardware's or two precisions' rows had one name."""
    values, varied = _values(combos), swept(combos)
    return [" ".join(f"{k}={v[k]}" for k in varied if k in v) for v in values]


def swept(combos: list[list[str]]) -> list[str]:
    """The keys whose values vary across a sweep's combinations and change what it computes or is predicted on:
    not what a combination's label names (model, strategy, pipeline, gpus), not its seed or round, not where it is
    logged or saved (`config.UNCOMPUTED`, but for the hardware a prediction is for)."""
    values, named = _values(combos), ("model", "model.variant", "strategy", "pipeline", "gpus", *REPEATS)
    return sorted({k for v in values for k in v if len({w.get(k) for w in values}) > 1 and k not in named
                   and not (k.startswith(UNCOMPUTED) and not k.startswith("hardware."))})


def _values(combos: list[list[str]]) -> list[dict[str, str]]:
    return [dict(o.lstrip("+~").split("=", 1) for o in c if "=" in o) for c in combos]


def plan_for(overrides: list[str], refusals_raise: bool = False) -> tuple[Any, Any, str | None]:
    """A combination's composed config, its plan (None if refused) and why it cannot be predicted (refused, or no
    cost model). An override Hydra cannot compose (`gpus=abc`) is raised: the command's error, not a row; so is a
    refusal with `refusals_raise`."""
    cfg = compose(overrides)
    try:
        _check_named(overrides, cfg)
        plan = validate(cfg, priced=True)
    except Exception as e:  # noqa: BLE001 - any refusal is this combination's row
        if refusals_raise and isinstance(e, UserError):
            raise
        return cfg, None, one_line(e)
    try:  # ConfigError where the strategy has no cost model (traffic), or no spec-sheet one (exchange); a bug raises
        plan.strategy.traffic(plan.local_towers, 0, 0) if plan.hardware.measured else plan.strategy.exchange(1, 1, 0.0)
    except UserError as e:
        if refusals_raise:
            raise
        return cfg, plan, one_line(e)
    return cfg, plan, None


def _check_named(overrides: list[str], cfg: Any) -> None:
    """ConfigError where the sheet chosen as `hardware=mine` says `name: dgx1_p100`: its predictions would be
    labelled as, and told from, the other sheet's."""
    chosen = next((o.split("=", 1)[1] for o in overrides if o.startswith("hardware=")), None)
    if chosen and cfg.hardware.get("name") not in (None, chosen):
        raise ConfigError(f"hardware={chosen}'s sheet says name: {cfg.hardware.name}, and its predictions would be "
                          f"labelled so; set name: {chosen} in it (or drop hardware.name=)")


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
        return {"error": last_line(proc.stderr, f"exit {proc.returncode}")}
    return json.loads(lines[-1].removeprefix(calibrate.RESULT))


def _calibrate(overrides: list[list[str]], wanted: set[str]) -> dict[str, dict]:
    """Measure `wanted` for combinations of one device set in a fresh process (devices are set once per process)."""
    spec = json.dumps({"overrides": overrides, "wanted": sorted(wanted)})
    result = _child(["-m", "runner.predict.calibrate", spec], 600)
    return {"error": f"calibration failed: {result['error']}"} if "error" in result else result


@filtered_stderr()
def predict_all(combos: list[list[str]], recalibrate: bool = False, cache_dir: Path | None = None,
                refusals_raise: bool = False) -> list[Outcome]:
    """A prediction (or the reason there is none) for every combination: on a named hardware from its spec sheet,
    on this machine from calibrations (measuring what the cache lacks); TensorFlow's start-up lines, wherever a
    model's build, an XLA key or a user's module imports it, filtered as a run's are. `refusals_raise`: a config the
    runner refuses, or one no cost model covers, is raised (`runner predict` of one combination), not its row."""
    outcomes, groups, layers = [], {}, {}
    for overrides, setting in zip(combos, varied_overrides(combos)):
        cfg, plan, error = plan_for(overrides, refusals_raise)
        named = " ".join(o for o in overrides if not o.startswith("hydra."))  # not the user's config folders
        outcome = Outcome(overrides, f"{combination(plan)} {setting}".rstrip() if plan else named,
                          error=error, given=_given(plan.cfg if plan else cfg, plan and plan.hardware), setting=setting)
        outcomes.append(outcome)
        if error is None and not plan.hardware.measured:
            _from_spec_sheet(plan, outcome, layers, refusals_raise)
        elif error is None:
            groups.setdefault(calibrate.device_set_key(plan), []).append((plan, outcome))
    path = calibrate.cache_path(cache_dir)
    cached = read_cache(path)
    for members in groups.values():
        plans = [plan for plan, _ in members]
        needed = set().union(*(keys(p) for p in plans))
        wanted = needed if recalibrate else {k for k in needed if k not in cached}
        left, covering = set(wanted), []  # the first combinations that between them need every wanted key
        for plan, outcome in members:
            if keys(plan) & left:
                covering.append(outcome.overrides)
                left -= keys(plan)
        if wanted:  # seconds for a small model, minutes for a large one on many simulated devices: said first
            print(f"calibrating this machine at gpus={plans[0].gpus} for {len(members)} combinations ({len(wanted)} "
                  f"measurements, a fresh process; cached in {path})", file=sys.stderr, flush=True)
        measured = _calibrate(covering, wanted) if wanted else {}
        if "error" in measured:
            for _, outcome in members:
                outcome.error = measured["error"]
            continue
        disturbed = max((e.get("others_cpu_share", 0.0) for e in measured.values()), default=0.0)
        if disturbed > BUSY:  # others' load moved the figures, by how much and which way unknown: used once, marked
            log.warning("calibration disturbed: other processes used %.0f%% of the CPUs while it measured; not "
                        "cached, and the predictions resting on it (marked in the table) may be off either way",
                        100 * disturbed)
            for plan, outcome in members:
                outcome.disturbed = round(disturbed, 2) if keys(plan) & measured.keys() else None
        elif measured:
            write_cache(path, measured)
        entries = {**cached, **measured}
        for plan, outcome in members:
            outcome.prediction = _priced(plan, entries)
    return outcomes


def _from_spec_sheet(plan: Any, outcome: Outcome, layers: dict[tuple, list], refusals_raise: bool = False) -> None:
    """`outcome`'s prediction on the plan's named hardware, or why there is none (`layers`: read once per model;
    `refusals_raise`: the reason raised, a lone combination's)."""
    accelerator, precision = plan.hardware.accelerator, str(plan.train.precision)
    if precision != "float32" and not spec_sheet.sixteen_bits(accelerator, precision):
        outcome.note = (f"train.precision={precision} on hardware={plan.hardware.name} is priced as float32: the "
                        f"{accelerator.name} has no tensor cores (Keras warns it may run slower)"
                        + ("" if accelerator.architecture else ", or its sheet does not give them (tensor_flops)"))
    try:
        outcome.prediction = spec_sheet_prediction(plan, model_layers(plan, layers))
    except UserError as e:
        if refusals_raise:
            raise
        outcome.error = one_line(e)


def model_layers(plan: Any, cache: dict[tuple, Any]) -> list[spec_sheet.Layer]:
    """The plan's model as the spec sheet prices it (`spec_sheet.layers`), built once per model and data shape in
    `cache`; UserError where it cannot be priced there."""
    model = OmegaConf.to_container(plan.cfg.model, resolve=True)
    key = (json.dumps(model, sort_keys=True), tuple(plan.spec.shape), plan.spec.classes)
    if key not in cache:
        import_tensorflow()
        try:
            built = build_model(plan.model, plan.spec, plan.train.seed)
            cache[key] = _unpriced(plan, tables(built)) or spec_sheet.layers(built)
        except UserError as e:
            cache[key] = one_line(e)
    if isinstance(cache[key], str):
        raise UserError(cache[key])
    return cache[key]


def spec_sheet_prediction(plan: Any, found: list[spec_sheet.Layer],
                          constants: spec_sheet.Constants = spec_sheet.FIT) -> Prediction:
    """The plan's prediction on its named hardware from the model's `found` layers and `constants`."""
    terms, one_device = spec_sheet.price(plan, found, constants)
    return Prediction(combination(plan), plan.train.global_batch_size, terms, plan.spec.unit,
                      plan.spec.units_per_example, one_device, max(plan.gpus, 1))


def _unpriced(plan: Any, held: list) -> str:
    """Why a model with embedding tables (`strategies.common.tables`) has no spec-sheet prediction: their memory, the
    rows each strategy moves and applies are priced on this machine's calibrations alone ('': none)."""
    if not held:
        return ""
    size = sum(4 * math.prod(t.shape) for t in held)
    return (f"model={plan.model.name}'s {len(held)} embedding tables ({size / 1e9:,.2f} GB) are not priced on spec "
            "sheets (their memory, and the rows each strategy moves and applies); runner predict without hardware= "
            "prices them on this machine")


def keys(plan: Any) -> set[str]:
    """The calibrations a plan's prediction needs."""
    return {calibrate.machine_key(plan), calibrate.towers_key(plan), calibrate.input_key(plan)}


def predict_run(plan: Any, devices: Any, examples: Any, cache_dir: Path | None = None) -> Prediction:
    """A run's own prediction, after its training: the cache's calibrations, what it lacks measured in this process
    (whose devices are the run's) and cached unless other processes disturbed it. UserError: no cost model."""
    plan.strategy.traffic(plan.local_towers, 0, 0)  # ConfigError where it has no cost model: before any measuring
    path = calibrate.cache_path(cache_dir)
    cached = read_cache(path)
    wanted = {k for k in keys(plan) if k not in cached}
    if wanted:  # seconds after the run's last step: said before they start
        log.info("calibrating the cost model for this combination once (cached in %s): a few seconds", path)
    measured, others = timed_with_others_share(
        lambda: calibrate.measure_here([plan], wanted, devices, lambda _: examples) if wanted else {})
    if measured and others <= BUSY:
        write_cache(path, {k: {**e, "others_cpu_share": round(others, 2)} for k, e in measured.items()})
    return _priced(plan, {**cached, **measured})


def _priced(plan: Any, entries: dict[str, dict]) -> Prediction:
    """The plan's prediction from calibration entries holding its keys."""
    return predict(plan, entries[calibrate.machine_key(plan)], entries[calibrate.towers_key(plan)],
                   entries[calibrate.input_key(plan)])


def ranked(outcomes: list[Outcome]) -> list[Outcome]:
    """Predicted combinations fastest first within each unit (never ranked across units), then the others."""
    priced = [o for o in outcomes if o.prediction]
    units = list(dict.fromkeys(o.prediction.unit for o in priced))
    ordered = [o for u in units for o in sorted((o for o in priced if o.prediction.unit == u),
                                                 key=lambda o: -o.prediction.rate)]
    return ordered + [o for o in outcomes if not o.prediction]


def table(outcomes: list[Outcome]) -> list[str]:
    """One markdown table per unit of the predicted rates, each with the line naming its predicted fastest (and what
    ties with it); combinations that could not be predicted in a table of their own at the end."""
    units = list(dict.fromkeys(o.prediction.unit for o in outcomes if o.prediction))
    lines: list[str] = []
    for unit in units:
        lines += _unit_table([o for o in outcomes if o.prediction and o.prediction.unit == unit], unit)
    failed = [o for o in outcomes if not o.prediction]
    if failed:
        lines += [*markdown(["combination", "not predicted"], [[o.label, o.error] for o in failed]), ""]
    notes = dict.fromkeys(o.note for o in outcomes if o.note and o.prediction)
    return lines + [f"note: {n}" for n in notes] + ([] if units else [fastest_line([])])


def _unit_table(outcomes: list[Outcome], unit: str) -> list[str]:
    """The table of predictions in one unit, fastest first, and its fastest line."""
    scaled = any(o.prediction.efficiency is not None for o in outcomes)
    marked = any(o.disturbed for o in outcomes)  # a column only where some calibration was disturbed
    lines = markdown(["combination", f"predicted {unit}/s", "step ms", *(["efficiency"] if scaled else []),
                      "dominant term", *(f"{t} ms" for t in TERMS), *(["calibration"] if marked else [])])
    for o in ranked(outcomes):
        p = o.prediction
        efficiency = [f"{p.efficiency:.0%}" if p.efficiency is not None else "-"] if scaled else []
        lines.append(markdown_row([o.label, f"{p.rate:,.0f}", f"{1e3 * p.step_seconds:.2f}", *efficiency, p.dominant,
                                   *(f"{1e3 * p.terms[t]:.2f}" for t in TERMS), *([calibration(o)] if marked else [])]))
    work: dict[tuple[str, str], list[Outcome]] = {}  # a model's own fastest, in each setting: never across models
    for o in ranked(outcomes):  # the lines in the table's order: the group with the fastest row first
        work.setdefault((o.label.split(" ", 1)[0], o.setting), []).append(o)
    return lines + ["", *(fastest_line(group) for group in work.values()), ""]


def records(outcomes: list[Outcome]) -> list[dict[str, Any]]:
    """One JSON-ready record per combination (`predict.format=json`): what scripts read."""
    return [{"combination": o.label, "overrides": o.overrides, **o.given, "predicted": (p := o.prediction) is not None,
             "rate": p and p.rate, "unit": p and p.unit, "step_seconds": p and p.step_seconds,
             "efficiency": p and p.efficiency, "terms": p and p.terms, "calibration_disturbed": o.disturbed,
             "note": o.note or None, "error": o.error} for o in outcomes]


def _given(cfg: Any, hardware: Any = None) -> dict[str, Any]:
    """The strategy, pipeline, gpus and nodes of a combination: a plan's resolved config (every option filled in)
    and spec sheet (the nodes it prices: `nodes_for`), else the composed one (a refused combination: the names it
    gives, a user's YAML perhaps only its `_target_`)."""
    gpus = int(cfg.gpus) if isinstance(cfg.gpus, int) else cfg.gpus
    per_node = cfg.hardware.get("devices_per_node") if isinstance(gpus, int) else None
    nodes = 1
    if per_node:  # a spec sheet's: the nodes it prices on, or (refused) as few as hold the devices
        nodes = hardware.nodes_for(gpus) if hasattr(hardware, "nodes_for") else -(-max(gpus, 1) // per_node)
    named = {group: cfg[group].get("name") or cfg[group].get("_target_") for group in ("strategy", "pipeline")}
    return {**named, "gpus": gpus, "nodes": nodes, "hardware": cfg.hardware.get("name"),
            "architecture": (cfg.hardware.get("accelerator") or {}).get("architecture")}


def fastest_line(outcomes: list[Outcome]) -> str:
    """`predicted fastest: X (rate); ties within 10%: Y, Z` among predictions of one unit, or why none was."""
    priced = [o for o in ranked(outcomes) if o.prediction]
    if not priced:
        return "predicted fastest: none (no combination could be predicted)"
    top, best = priced[0], priced[0].prediction.rate
    ties = [o for o in priced[1:] if o.prediction.rate >= (1 - TIE) * best]
    text = f"predicted fastest: {top.label} ({best:,.0f} {top.prediction.unit}/s{_on(top)})"
    # pipelines priced alike on a spec sheet (no host-side input work): their tie is the model's, not a measurement's
    unpriced = top.given.get("hardware") not in (None, "this") and any(
        o.given.get("pipeline") != top.given.get("pipeline") for o in ties if o.prediction.rate == best)
    return text + (f"; within {TIE:.0%} of it (a tie for this model): {', '.join(o.label for o in ties)}" if ties
                   else "") + ("; a spec sheet prices no input pipeline: which pipeline is fastest is measured on "
                               "this machine (runner predict without hardware=)" if unpriced else "")


def _on(o: Outcome) -> str:
    """Where a prediction is for: `, on dgx1_v100's spec sheet` (its architecture's constants unchecked where no
    published table fitted them), `, on this machine` (calibrated here), '' where the config does not say."""
    name, architecture, fit = o.given.get("hardware"), o.given.get("architecture"), spec_sheet.FIT
    if name in (None, "this"):
        return ", on this machine" if name else ""
    unchecked = (f"; {architecture or 'an unnamed architecture'} priced with {fit.reference}'s constants, unchecked "
                 "against any published table" if architecture not in fit.architecture else "")
    unit = o.prediction.unit if o.prediction else spec_sheet.FIT_UNIT
    if unit != spec_sheet.FIT_UNIT:
        unchecked += f"; {unit}/s priced with constants fitted to image CNNs, unchecked against any table of {unit}/s"
    return f", on {name}'s spec sheet{unchecked}"


def predict_elsewhere(combos: list[list[str]]) -> list[Outcome]:
    """`predict_all` in a fresh process, for callers inside a Hydra app, where composing other configs is refused."""
    result = _child(["-m", "runner.predict.grid", json.dumps(combos)], 1200)
    if isinstance(result, dict):  # {"error": ...}
        return [Outcome(c, " ".join(c), error=f"prediction failed: {result['error']}") for c in combos]
    return [Outcome(**{**item, "prediction": item["prediction"] and Prediction(**item["prediction"])})
            for item in result]


if __name__ == "__main__":
    found = predict_all(json.loads(sys.argv[1]))
    sys.stdout.write(calibrate.RESULT + json.dumps([asdict(o) for o in found]) + "\n")
