"""`run(cfg) -> dict`: one experiment from a composed config to a finished MLflow run.

The flow reads top to bottom: validate (no TensorFlow yet) -> tracking run opened -> devices -> data -> strategy
(model and optimizer under its placement) -> pipeline feed -> training loop -> evaluation -> final metrics.
"""

from __future__ import annotations

import importlib
import logging
import time
from pathlib import Path

from omegaconf import DictConfig

from runner import sweep, tracking
from runner.config import ConfigError, validate

log = logging.getLogger(__name__)


def _hydra_log_file() -> Path | None:
    """The log file Hydra writes for this job, if running under @hydra.main."""
    from hydra.core.hydra_config import HydraConfig

    if not HydraConfig.initialized():
        return None
    hc = HydraConfig.get()
    return Path(hc.runtime.output_dir) / f"{hc.job.name}.log"


def _train(cfg: DictConfig, run: tracking.Run, started: float) -> dict:
    """Everything after the run is opened: devices, data, strategy, loop."""
    from runner import devices as devices_mod

    # The first TensorFlow import: nothing may touch TensorFlow before the devices are configured.
    devices = devices_mod.setup(cfg.gpus, cfg.train.intra_op_threads, cfg.train.inter_op_threads)
    run.tags(devices.as_tags())

    import tensorflow as tf

    from data_pipelines import common
    from runner import strategies, train

    arrays = common.load_arrays(cfg.data, cfg.train.seed)
    hardware = _hardware_figures(cfg, devices)  # before the strategy: the probe wants a quiet machine
    run.metrics(hardware, 0)
    strategy = strategies.build(cfg.strategy.name, devices, cfg)
    from runner.strategies.common import effective_learning_rate

    run.tags({"tensorflow.version": tf.__version__, "batch_scaling": cfg.train.batch_scaling,
              "devices.requested": str(cfg.gpus), "mfu.basis": _mfu_basis(devices), **strategy.describe()})
    run.metrics({"effective_learning_rate": effective_learning_rate(cfg.train)}, 0)
    pipeline = importlib.import_module(f"data_pipelines.{cfg.pipeline.name}")
    examples = common.examples(arrays.x_train, arrays.y_train)
    steps = train.total_steps(cfg.train, len(arrays.x_train))
    log.info(
        "training %s/%s on %d %s device(s)%s for %d steps, global batch %d (%d per tower, %s scaling)%s",
        cfg.model.name, cfg.model.variant, devices.count, devices.kind, " (simulated)" if devices.simulated else "",
        steps, cfg.train.global_batch_size, cfg.train.per_device_batch_size,
        cfg.train.batch_scaling, " on SYNTHETIC data" if arrays.synthetic else "",
    )
    eval_ds = common.eval_dataset(arrays.x_test, arrays.y_test)
    result = train.fit(
        strategy, lambda: strategy.batches(pipeline, examples, cfg.train.seed), eval_ds, cfg, steps, run.metrics
    )
    result["wall_seconds"] = time.perf_counter() - started
    result.update(_utilisation(result, hardware, devices))
    if "input_bound" in result:
        run.tags({"input_bound": str(bool(result["input_bound"])).lower()})
    return result


def _hardware_figures(cfg: DictConfig, devices) -> dict:
    """FLOPs of one training step per example (from the model itself) and the probed matmul peak, if enabled."""
    from runner import flops
    from runner.strategies.common import build_model

    figures = {"flops_per_example": flops.training_flops_per_example(build_model(cfg.model, cfg.train.seed))}
    if cfg.train.probe_peak:
        peak = flops.probe_peak(devices.names[0])
        if peak is not None:
            figures["peak_gflops"] = peak.gflops
    return figures


def _mfu_basis(devices) -> str:
    if devices.simulated:
        return f"the physical peak of {devices.physical}, shared by {devices.count} simulated devices"
    if devices.kind == "CPU":
        return f"the physical peak of {devices.physical}"
    return f"{devices.count} x the peak of one {devices.kind}"


def _utilisation(result: dict, hardware: dict, devices) -> dict:
    """Achieved GFLOP/s and MFU. Simulated devices share one physical processor, so MFU is against one peak."""
    if "images_per_sec" not in result:
        return {}
    achieved = result["images_per_sec"] * hardware["flops_per_example"] / 1e9
    out = {"achieved_gflops": achieved}
    if "peak_gflops" in hardware:
        from runner import flops

        physical = 1 if devices.simulated or devices.kind == "CPU" else devices.count
        out["mfu"] = flops.mfu(
            result["images_per_sec"], hardware["flops_per_example"], hardware["peak_gflops"], physical
        )
    return out


def run(cfg: DictConfig) -> dict:
    """Run one experiment.

    Args:
        cfg: a config composed by Hydra (from the CLI or the compose API).

    Returns:
        The final metrics (test_accuracy, images_per_sec, ...) plus `run_id`.

    Raises:
        ConfigError: the config is invalid (raised before anything is built or logged).
    """
    started = time.perf_counter()
    try:
        cfg = validate(cfg)
    except ConfigError as e:
        if sweep.is_child():
            tracking.record_invalid(cfg, e)
        raise
    uri = tracking.resolve_uri(cfg.mlflow.tracking_uri)
    with tracking.tracked(uri, cfg) as mlrun:
        result = _train(cfg, mlrun, started)
        # train/test loss and accuracy were recorded by the loop at their steps; add the run's summary figures.
        summary = {k: v for k, v in result.items() if k not in ("train_loss", "test_loss", "test_accuracy")}
        mlrun.metrics(summary, int(result["steps"]))
        log_file = _hydra_log_file()
        if log_file:
            for handler in logging.getLogger().handlers:
                handler.flush()
            mlrun.file(log_file)
    result["run_id"] = mlrun.run_id
    return result
