"""`run(cfg) -> dict`: one experiment from a composed config to a finished MLflow run.

The flow reads top to bottom: validate (no TensorFlow yet; a plan) -> tracking run opened -> data -> devices ->
strategy (model and optimizer under its placement) -> pipeline feed -> training loop -> evaluation -> final metrics.
This module wires the components together; each does its own work.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import hashlib
import logging
import os
import time
import types
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from omegaconf import DictConfig

from runner import checkpoints, tracking, train
from runner.config import ROWS_ONLY, ConfigError, Plan, table_optimizer, validate
from runner.data_pipelines import DataError
from runner.errors import UserError, one_line
from runner.lazy import keras, tf
from runner.measure import floor, flops, hooks, profile
from runner.models import label
from runner.paths import unwritable
from runner.runtime import devices as devices_mod  # no TensorFlow import: devices.setup imports it
from runner.runtime import signals, watchdog
from runner.runtime.devices import Devices
from runner.runtime.output import OutputFolder
from runner.strategies import Training
from runner.strategies.common import (build_model, build_optimizer, effective_learning_rate, optimizer_state_bytes,
                                      tables, tower_models)
from runner.strategies.loss_scale import LossScale, LossScaling
from runner.strategies.single import SingleDevice
from runner.tasks import target_of
from runner.tracking.redact import redact_files, redact_logs

if TYPE_CHECKING:
    from runner.data_pipelines import Spec
    from runner.data_pipelines.common import Data, Examples
    from runner.strategies import Strategy

log = logging.getLogger(__name__)


def training_for(plan: Plan, jit_compile: bool = False) -> Any:
    """What the strategy builds and trains, from the plan (runner.strategies.Training), XLA-compiled
    as `jit_compile` says (train.jit_compile resolved: `jit_decision`)."""
    float16 = plan.train.precision == "mixed_float16"
    return Training(
        model=plan.model,
        model_fn=functools.partial(build_model, plan.model, plan.spec, fused_batch_norm=plan.train.fused_batch_norm),
        optimizer_fn=functools.partial(build_optimizer, plan.train),
        seed=plan.train.seed,
        global_batch=plan.train.global_batch_size,
        jit_compile=jit_compile,
        cluster=plan.cluster,
        loss_scaling=LossScaling(plan.train.loss_scale, plan.train.loss_scale_period) if float16 else None,
        spec=plan.spec,
        clip_norm=plan.train.clip_norm,
        weight_decay=plan.train.weight_decay if plan.train.optimizer == "adamw" else 0.0,  # the dense weights'
        tables_rows_only=table_optimizer(plan.train) in ROWS_ONLY,
    )


def jit_decision(plan: Plan, devices: Devices, data: Data) -> Any:
    """train.jit_compile resolved for the run (a `runner.measure.xla.Decision`): `xla.setting`, else (auto, not
    cached) the run's model timed both ways on its first device, the faster kept. A multi-worker job reads a cached
    decision only: its strategy must exist before any op runs."""
    from runner.measure import xla

    found = xla.setting(plan, devices.names[0])
    if found is not None:
        return found
    if plan.cluster is not None:
        return xla.Decision(False, "off: not measured (a multi-worker job cannot time a step before its strategy "
                                   "starts; a one-process run of the same model and batch measures it)")
    batch = plan.train.per_device_batch_size
    label = f"model={plan.model.name} at {batch} examples a step on one {devices.kind} device"
    decision = xla.decide(xla.key(plan, devices.names[0]), label, _timed_steps(plan, devices, data, batch))
    gc.collect()  # the probe's model and its compiled loops, before the run's own are built
    return decision


def _timed_steps(plan: Plan, devices: Devices, data: Data, batch: int) -> Any:
    """fn(jit) -> fn(steps) -> seconds: the run's model trained `steps` steps on its first device (the baseline's
    step, XLA as `jit` says) on one fixed batch of its training examples: what `jit_decision` compares. Both sides
    train one model and optimizer, built at the first call (a second model cost the probe 1 s of DLRM's 8)."""
    @functools.cache
    def built() -> tuple[SingleDevice, Any]:
        strategy = SingleDevice(devices.names[0], replace(training_for(plan), global_batch=batch))
        return strategy, strategy.batches(plan.pipeline, data.train(), plan.train.seed).next()  # one batch, reused

    def timed_step(jit: bool) -> Any:
        strategy, pairs = built()
        strategy.training = replace(strategy.training, jit_compile=jit)  # what `step` compiles
        loop = strategy.train_loop(types.SimpleNamespace(next=lambda: pairs))

        def timed(steps: int) -> float:
            start = time.perf_counter()
            float(loop(tf.constant(steps))[0])  # waits for the steps
            return time.perf_counter() - start

        return timed

    return timed_step


@dataclass
class Built:
    """A run's objects, built from its plan: what `run` trains and `runner check` measures."""

    data: Data  # the dataset's examples, as loaded (in-memory ones before TensorFlow)
    devices: Devices
    strategy: Strategy  # the model and optimizer placed on the devices
    examples: Examples  # the training examples as a tf.data dataset, for the pipeline's feed
    xla: Any  # train.jit_compile resolved (runner.measure.xla.Decision: on, and why)


def loaded(plan: Plan) -> Data:
    """The plan's examples (`Dataset.load`), or one DataError line where a user's dataset gives none: a file it cannot
    read (an OSError: missing, unreadable, a folder), or something else than a `Data` (keras.datasets' tuples); a
    ConfigError where the pipeline needs more examples than there are (`pipeline=sharded`: one per tower)."""
    try:
        data = plan.data.load(plan.train.seed)
    except OSError as e:
        raise DataError(f"data={plan.data.name} cannot load its examples: {e}") from e
    if not all(callable(getattr(type(data), method, None)) for method in ("train", "test", "digest")):
        raise DataError(f"data={plan.data.name}: load returned a {type(data).__name__}, not the examples' Data "
                        "(train(), test(), digest(): runner.data_pipelines.common.Data); for numpy arrays return "
                        "runner.data_pipelines.common.Arrays(x_train, y_train, x_test, y_test, synthetic=False, "
                        "spec=self.spec())")
    # counted now where validation could not without reading every file (a TSV's lines, a TFRecord's records)
    plan.pipeline.check(plan.local_towers * (plan.cluster.count if plan.cluster else 1), data.train_size)
    return data


def build(plan: Plan, run: tracking.Recorder, log_placement: bool = False) -> Built:
    """Data, devices, precision and strategy for `plan`: the one way a run's objects are made. Data first (a bad
    path fails before the slow TensorFlow import); the strategy right after the devices (MultiWorkerMirroredStrategy
    must exist before TensorFlow's runtime starts). `log_placement`: TensorFlow logs every op's device."""
    data = loaded(plan)
    devices_mod.float16_kernels(plan.train.precision)  # an environment setting TensorFlow reads as it starts
    devices = devices_mod.setup(plan.gpus, plan.train.intra_op_threads, plan.train.inter_op_threads)
    if log_placement:
        tf.debugging.set_log_device_placement(True)  # before any op runs, or the placer's log misses them
    run.tags({**devices.as_tags(), "devices.workers": "1", "tensorflow.onednn": devices_mod.onednn()})
    # TensorFlow's INFO lines (mirrored logs one "Reduce to ... then broadcast" per variable) drown the run's own.
    logging.getLogger("tensorflow").setLevel(logging.WARNING)

    # Every model built from here on computes in this precision (set each run: the policy is process-wide).
    keras.mixed_precision.set_dtype_policy(plan.train.precision)
    devices_mod.fuse_ops(plan.train.precision, devices)
    if warning := devices_mod.precision_warning(plan.train.precision, devices, devices_mod.host_cpu()):
        log.warning(warning)
    xla = jit_decision(plan, devices, data)
    training = training_for(plan, xla.on)
    if plan.cluster is None:
        strategy = plan.strategy.build(devices, training)
    else:  # a multi-worker strategy waits for its peers under a watchdog
        me = (plan.cluster.task_type, plan.cluster.task_index)
        others = [a for kind, addresses in plan.cluster.tasks.items() for i, a in enumerate(addresses)
                  if (kind, i) != me]
        uri = tracking.resolve_uri(plan.cfg.mlflow.tracking_uri) if run.run_id else None
        with watchdog.bounded_wait(plan.strategy.peer_wait(), plan.cluster.name, ", ".join(others), uri, run.run_id):
            strategy = plan.strategy.build(devices, training)
        signals.install()  # TensorFlow installed its own SIGTERM handler while it waited
    return Built(data, devices, strategy, data.train(), xla)


def _train(plan: Plan, run: tracking.Recorder, started: float) -> dict:
    """Everything after the run is opened: the run's objects, then the loop and what is measured after it."""
    built = build(plan, run)  # the process's first TensorFlow import, once the devices are configured
    if plan.train.checkpoint_every and run.run_id is not None:
        # This config's checkpoint folder taken before anything is trained or resumed, so a start beside a live run
        # of the same config is refused in seconds (a multi-worker job's chief takes it for all its workers).
        checkpoints.claim(checkpoints.directory(plan.train.checkpoint_dir, plan.config_hash), run.run_id)

    data, devices, strategy, examples = built.data, built.devices, built.strategy, built.examples
    _log_dataset(plan, data, run)
    run.tags({"tensorflow.version": tf.__version__, "batch_scaling": plan.train.batch_scaling, "task": plan.spec.target,
              "devices.requested": str(plan.gpus), "mfu.basis": _mfu_basis(devices, plan.train.precision),
              "xla": "on" if built.xla.on else "off", "jit_compile_reason": built.xla.reason, **strategy.describe()})
    run.params({"train.effective_learning_rate": f"{effective_learning_rate(plan.train):.6g}"})
    if plan.train.table_optimizer:  # the tables' own rate, after the same batch rule
        rate = effective_learning_rate(plan.train, plan.train.table_learning_rate or plan.train.learning_rate)
        run.params({"train.effective_table_learning_rate": f"{rate:.6g}"})
    steps = train.total_steps(plan.train, data.train_size)
    log.info(
        "training %s on %d %s device(s)%s for %d steps, global batch %d (%d per tower, %s scaling)%s",
        label(plan.model), devices.count, devices.kind, " (simulated)" if devices.simulated else "",
        steps, plan.train.global_batch_size, plan.train.per_device_batch_size,
        plan.train.batch_scaling, " on SYNTHETIC data" if data.synthetic else "",
    )
    if plan.train.lr_warmup_steps >= steps:  # a warning: model=gpt's recipe warms up 100 steps, debug=smoke runs 60
        log.warning("train.lr_warmup_steps=%d is not shorter than the run's %d steps: the learning rate never reaches "
                    "train.learning_rate", plan.train.lr_warmup_steps, steps)
    _warn_dense_tables(plan)
    checkpointer, start = _resume(plan, strategy, data, run)
    strategy.check_same_start(start, plan.config_hash)
    evals = train.Evaluations(strategy, data.test(), data.test(plan.train.check_examples), run.metrics,
                              target_of(plan.train), plan.train.eval_every, train.check_cadence(plan.train, steps))
    around = _around(plan, checkpointer, strategy, run)
    batches = strategy.batches(plan.pipeline, examples, plan.train.seed)
    result = train.fit(strategy, batches, evals, plan.train, steps, run.metrics, start, around, plan.data.describe(),
                       (plan.spec.unit, plan.spec.units_per_example))
    del batches  # frees the training feed (sharded: its device buffers) before the pipeline is timed alone
    _check_moving_state(plan, strategy, run)
    run.tags(evals.tags())  # reached or not; untimed where an earlier part's training time is not known
    if plan.spec.rate_key not in result:
        why = train.untimed(plan.train, steps, plan.spec.unit, start)
        log.warning(why)
        run.tags({f"{plan.spec.rate_key}.missing": why})
    result.update(_after_training(plan, strategy, examples, result, run, devices))
    hardware = _hardware_figures(plan, devices, run)  # after training: not in the time to the first step
    hardware["optimizer_state_bytes_per_device"] = float(max(optimizer_state_bytes(strategy).values(), default=0))
    if checkpointer is not None:
        checkpointer.finished()
    result["wall_seconds"] = time.perf_counter() - started
    # may re-probe the peak: before `hardware` is logged
    result.update(_utilisation(result, hardware, devices, plan.train.precision, run, plan.spec,
                               plan.cluster.hosts if plan.cluster else 1))
    result.update(hardware)  # summary figures, logged once at the final step with the others
    digest = weights_digest(strategy.weights())
    log.info("final weights sha256 %s", digest)
    run.tags({"weights.sha256": digest, **({"input_bound": str(bool(result["input_bound"])).lower()}
                                           if "input_bound" in result else {})})
    return result


def _log_dataset(plan: Plan, data: Data, run: tracking.Recorder) -> None:
    """The train and test examples as MLflow dataset inputs: name, a digest of their bytes, source, sizes, spec."""
    spec = data.spec
    # named features: each one's shape, dtype and vocabularies; else the one example shape
    shape = {} if spec.features else {"image_shape" if spec.unit == "images" else "example_shape": list(spec.shape)}
    named = {"target": spec.target, "features": [str(f) for f in spec.features]} if spec.features else {}
    for context, size in (("train", data.train_size), ("test", data.test_size)):
        about = {"examples": size, **shape, "classes": spec.classes, "dtype": spec.dtype, "synthetic": data.synthetic}
        run.dataset(plan.data.name, data.digest(context), plan.data.describe(), {**about, **named}, context)


def _warn_dense_tables(plan: Plan) -> None:
    """One warning where a recommender's tables get an optimizer that updates every row every step (Adam,
    train.optimizer's default, among them), where Adagrad and SGD update only the rows a batch looked up."""
    if plan.spec.features and (name := table_optimizer(plan.train)) not in ROWS_ONLY:
        key = "train.table_optimizer" if plan.train.table_optimizer else "train.optimizer"
        log.warning("%s=%s updates every row of model=%s's embedding tables every step (Keras' Adam, AdamW, momentum "
                    "and RMSprop decay every row's slots), not only the rows a batch looked up: for sparse updates use "
                    "train.optimizer=adagrad or sgd, or an optimizer per part as TF Model Garden trains DLRM: "
                    "train.optimizer=adam train.table_optimizer=sgd", key, name, plan.model.name)


def _resume(plan: Plan, strategy: Any, data: Data, run: tracking.Recorder) -> tuple[Any, int]:
    """The run's checkpointer (None: train.checkpoint_every=0) and the step to start from: > 0 when a killed run of
    this config left checkpoints (on the same `data`), whose metric history the new run continues."""
    if not plan.train.checkpoint_every:
        return None, 0
    spec = plan.cluster
    folder = checkpoints.directory(plan.train.checkpoint_dir, plan.config_hash)
    scratch = folder.with_name(f"{folder.name}.{spec.name}") if spec else None
    checkpointer = checkpoints.Checkpointer(folder, plan.train.checkpoint_every, strategy.checkpoint_objects(),
                                            run.run_id, spec is None or spec.is_chief, scratch, data.digest("train"))
    start, previous = checkpointer.restore()
    if start:
        run.tags({"resumed_from_step": str(start), **({"resumed_from": previous} if previous else {})})
        if previous:
            run.copy_history(previous, start)  # the new run's charts continue the killed run's
    return checkpointer, start


def _around(plan: Plan, checkpointer: Any, strategy: Any, run: tracking.Recorder) -> list:
    """What runs around the training calls: checkpoints, the loss scale's metrics, the allocator reset, a profiler
    trace."""
    around = [checkpointer] if checkpointer is not None else []
    if isinstance(strategy.loss_scale, LossScale):
        around.append(hooks.LossScaleMetrics(strategy.loss_scale, run.metrics))
    if plan.train.reuse_freed_memory:
        around.append(hooks.ReuseFreedMemory())
    if plan.train.profile:
        around.append(hooks.Profile(OutputFolder.current().path / "profile", plan.train.steps_per_call,
                                    plan.train.warmup_calls))
    return around


def _check_moving_state(plan: Plan, strategy: Any, run: tracking.Recorder) -> None:
    """For a model with moving state (batch normalization): tag what the strategy does with it and whether every copy
    ended with the same moving statistics (a warning if not)."""
    if copies := strategy.moving_statistics():
        import numpy as np

        equal = all(np.array_equal(c[0], other) for c in copies for other in c[1:])
        run.tags({"batch_norm": plan.strategy.describe_batch_norm(), "batch_norm.copies_equal": str(equal).lower()})
        if not equal:
            log.warning("the model copies of strategy=%s ended with different moving statistics (batch "
                        "normalization); the test figures are the first copy's", plan.strategy.name)


def weights_digest(variables: list) -> str:
    """sha256 of the weights' bytes (first 16 hex digits): equal digests mean bit-identical models."""
    sha = hashlib.sha256()
    for v in variables:
        sha.update(v.numpy().tobytes())
    return sha.hexdigest()[:16]


def _after_training(plan: Plan, strategy: Any, examples: Any, result: dict, run: tracking.Recorder,
                    devices: Devices) -> dict:
    """Figures taken once training is over: peak memory, the input pipeline alone, the profile's table, the floor."""
    figures: dict[str, Any] = {"peak_rss_mb": hooks.peak_rss_mb()}
    if plan.train.probe_floor and "step_time_ms" in result:
        if skipped := floor.not_a_bound(devices.simulated, devices.kind, devices.count):
            log.info("floor %s", skipped)
            run.tags({"floor": skipped})
        else:
            figures.update(_floor(plan, devices, examples, result, run))
    if plan.train.measure_input:
        batches = strategy.batches(plan.pipeline, examples, plan.train.seed)
        figures.update(hooks.input_figures(strategy, batches, plan.train, result))
    if plan.train.predict:
        figures.update(_prediction(plan, devices, examples, run))
    if "profile_steps" in result:
        # The traced call summed by op kind: the table (profile.md) and its figures; a failure here only warns.
        folder = OutputFolder.current().path / "profile"
        try:
            text, traced = profile.table(folder, int(result["profile_steps"]), result["profile_seconds"],
                                         len(os.sched_getaffinity(0)))
        except Exception as e:  # the run itself succeeded: keep it, say why there is no profile
            log.warning("no profile summary (%s: %s); the trace, if any, is in %s", type(e).__name__, e, folder)
        else:
            log.info("profile (trace in %s): %s", folder, text.splitlines()[0])
            run.text(text + "\n", "profile.md")
            run.metrics(traced, int(result["steps"]))
    elif plan.train.profile:
        log.warning("train.profile=true traced nothing: the profiler traces the first full call after warm-up; "
                    "it needs train.steps >= %d", train.steps_to_time(plan.train) + plan.train.steps_per_call)
    return figures


def _floor(plan: Plan, devices: Devices, examples: Any, result: dict, run: tracking.Recorder) -> dict[str, float]:
    """The step's floor (train.probe_floor, runner/measure/floor.py) and the step over it; a floor that cannot be
    measured (memory for a second set of models, say) is a warning and the run's `floor` tag, not a failed run."""
    from runner.predict.calibrate import real_batches

    log.info("measuring the step's floor (train.probe_floor): the towers' passes and one update alone, a few seconds")
    towers, batch = list(devices.names[:plan.local_towers]), plan.train.per_device_batch_size
    try:
        models = tower_models(plan.model, plan.spec, plan.train.seed, towers, plan.train.fused_batch_norm)
        on = [tables(model) for model in models]  # a model with tables: real ids (random ones all hit two rows)
        real = real_batches(plan, examples, batch, len(towers)) if on[0] else None
        figures = floor.floor_step_ms(models, batch, plan.train.optimizer, towers, xla=not plan.strategy.jit_refusal(),
                                      task=plan.spec.task, batches=real, tables=on,
                                      table_optimizer=table_optimizer(plan.train))
    except Exception as e:  # noqa: BLE001 - a figure added after training must not fail the run it describes
        log.warning("no floor for this run: %s", one_line(e))
        run.tags({"floor": f"failed: {one_line(e)}"})
        return {}
    return {**figures, "step_time_over_floor": result["step_time_ms"] / figures["floor_step_ms"]}


def _prediction(plan: Plan, devices: Devices, examples: Any, run: tracking.Recorder) -> dict[str, float]:
    """The cost model's prediction for this combination (runner/predict/), beside what the run measured."""
    from runner.predict.grid import predict_run

    try:
        prediction = predict_run(plan, devices, examples)
    except UserError as e:  # a strategy the cost model does not cover: the run says so, and goes on
        run.tags({"predicted": f"not predicted: {e}"})
        return {}
    except Exception as e:  # noqa: BLE001 - a figure added after training must not fail the run it describes
        log.warning("no prediction for this run: %s", one_line(e))
        run.tags({"predicted": f"failed: {one_line(e)}"})
        return {}
    run.tags({"predicted.dominant": prediction.dominant})
    return prediction.metrics()


def _hardware_figures(plan: Plan, devices: Devices, run: tracking.Recorder) -> dict:
    """FLOPs of one training step per example (if they can be counted) and the probed matmul peak, if enabled."""
    figures: dict[str, Any] = {}
    # On Keras' own layers: TensorFlow's FLOP statistics have no formula for the fused batch norm kernel
    count = flops.count_training_flops(build_model(plan.model, plan.spec, plan.train.seed, fused_batch_norm=False),
                                       plan.spec.task)
    if count is not None:
        figures["flops_per_example"] = count.flops_per_example
    run.tags({"flops.source": count.source if count else "not counted"})
    if plan.train.probe_peak:
        peak = _peak(devices, plan.train.precision)
        if peak is not None:
            figures["peak_gflops"] = peak
    return figures


def _peak(devices: Devices, precision: str, refresh: bool = False) -> float | None:
    """The matmul peak MFU is taken against, in the dtype the run's matmuls compute in (`_peak_dtype`): a GPU's
    probed in this process, the host CPU's in a fresh one (runner/measure/peak.py's cpu_peak)."""
    from runner.measure.peak import cpu_peak, probe_peak

    dtype = _peak_dtype(devices, precision)
    if devices.kind == "CPU":
        return cpu_peak(dtype, refresh)
    peak = probe_peak(devices.names[0], dtype, refresh=refresh)
    return peak.gflops if peak else None


def _peak_dtype(devices: Devices, precision: str) -> str:
    """The dtype the run's matmuls compute in, where the device runs it natively; else float32."""
    from runner.measure.peak import describe

    dtype = precision.removeprefix("mixed_")  # float32, bfloat16 or float16
    return dtype if describe(devices.names[0], dtype)[1] else "float32"


def _mfu_basis(devices: Devices, precision: str) -> str:
    dtype = _peak_dtype(devices, precision)
    if devices.simulated:
        return f"the physical {dtype} peak of {devices.physical}, shared by {devices.count} simulated devices"
    if devices.kind == "CPU":
        return f"the physical {dtype} peak of {devices.physical}"
    return f"{devices.count} x the {dtype} peak of one {devices.kind}"


def _utilisation(result: dict, hardware: dict, devices: Devices, precision: str, run: tracking.Recorder,
                 spec: Spec, hosts: int = 1) -> dict:
    """Achieved GFLOP/s and MFU (simulated devices share one processor: against one peak; a cluster's workers on
    `hosts` machines: against each machine's, the global rate being theirs together). A run above the peak
    probes it again (`hardware["peak_gflops"]` updated); still above, MFU is left out and the `mfu.missing` tag says
    why, rather than logging a ratio above 1."""
    if spec.rate_key not in result or "flops_per_example" not in hardware:
        return {}
    examples = result[spec.rate_key] / spec.units_per_example  # per second
    achieved = examples * hardware["flops_per_example"] / 1e9
    out = {"achieved_gflops": achieved}
    physical = (1 if devices.simulated or devices.kind == "CPU" else devices.count) * hosts
    if "peak_gflops" in hardware and achieved > hardware["peak_gflops"] * physical:
        log.warning("achieved %.0f GFLOP/s, above the peak of %.0f: the peak was measured low", achieved,
                    hardware["peak_gflops"] * physical)
        peak = _peak(devices, precision, refresh=True)
        hardware.pop("peak_gflops")
        if peak is not None:
            hardware["peak_gflops"] = peak
    if "peak_gflops" not in hardware:
        return out
    value = flops.mfu(examples, hardware["flops_per_example"], hardware["peak_gflops"], physical)
    if value <= 1:
        return {**out, "mfu": value}
    why = (f"achieved {achieved:.0f} GFLOP/s is above the re-probed peak of {hardware['peak_gflops'] * physical:.0f}: "
           "the model's FLOP count is more than the multiplications done (e.g. Winograd convolutions)")
    log.warning("MFU left out: %s", why)
    run.tags({"mfu.missing": why})
    return out


def run(cfg: DictConfig) -> dict:
    """Run one experiment from `cfg` (composed by Hydra) and return its final metrics, its `run_id`, `unit` (what the
    throughput counts: images, tokens, examples) and `task` (what its test figures are: runner/tasks.py). Raises
    ConfigError, before anything is built or logged, for an invalid config (a checkpoint folder it cannot write)."""
    started = time.perf_counter()
    folder = OutputFolder.current()
    redact_logs()
    if folder.log_file:
        redact_files(folder.path)
    try:
        plan = validate(cfg)
    except ConfigError as e:
        if tracking.is_sweep_child():
            tracking.record_invalid(cfg, e, tracking.parent_run_id())  # a sweep checks its jobs first
        raise
    if plan.train.checkpoint_every and (problem := unwritable(Path(plan.train.checkpoint_dir))):
        raise ConfigError(
            f"train.checkpoint_dir={plan.train.checkpoint_dir} cannot hold checkpoints: {problem}; choose a writable "
            "folder, or train.checkpoint_every=0 for none"
        )
    uri = tracking.resolve_uri(plan.cfg.mlflow.tracking_uri)
    chief = plan.cluster is None or plan.cluster.is_chief  # on a multi-worker job only the chief logs to MLflow
    kept = folder if folder.log_file else None  # a journal file only in a job's own folder
    if kept:
        kept.watch_log()
    with (tracking.tracked(uri, plan, kept) if chief else contextlib.nullcontext(tracking.NoRun())) as mlrun:
        try:
            result = _train(plan, mlrun, started)
        finally:  # the checkpoint folder's claim (in _train) ends with the run, however the run ends
            if plan.train.checkpoint_every:
                checkpoints.release(checkpoints.directory(plan.train.checkpoint_dir, plan.config_hash))
        # train/test loss and accuracy were recorded by the loop at their steps; add the run's summary figures.
        summary = {k: v for k, v in result.items() if k not in ("train_loss", "test_loss", "test_accuracy")}
        mlrun.metrics(summary, int(result["steps"]))
        if folder.log_file:
            for handler in logging.getLogger().handlers:
                handler.flush()
            mlrun.file(folder.log_file)
    return {**result, "run_id": mlrun.run_id, "experiment_id": mlrun.experiment_id, "tracking_uri": uri,
            "unit": plan.spec.unit, "task": plan.spec.target}
