"""System metrics of a run (CPU, memory, disk, network; GPUs with nvidia-ml-py) through MLflow's own monitor, with
at least one sample however short the run."""

from __future__ import annotations

import logging
from typing import Any

from runner.errors import one_line

log = logging.getLogger(__name__)


def start(run_id: str, uri: str, interval: float) -> Any:
    """A started monitor sampling every `interval` seconds in its own thread, or None if it cannot run here. MLflow's
    publishes a sample only after a full interval; this one's `finish()` publishes one at the end if it had none."""
    try:
        from mlflow.system_metrics.system_metrics_monitor import SystemMetricsMonitor

        class AtLeastOneSample(SystemMetricsMonitor):
            published = 0

            def publish_metrics(self, metrics: dict) -> None:
                super().publish_metrics(metrics)
                self.published += 1

            def finish(self) -> None:
                super().finish()  # stops the sampling thread and flushes what it published
                if self.published:
                    return
                try:  # the run was shorter than the interval: one sample, taken now
                    self.collect_metrics()
                    self.publish_metrics(self.aggregate_metrics())
                    self.mlflow_logger.flush()
                except Exception as e:  # noqa: BLE001 - a store gone at the end: the run's own writes say so
                    log.warning("no system-metrics sample (%s)", one_line(e))

        logging.getLogger("mlflow.system_metrics").setLevel(logging.WARNING)  # its start/stop INFO lines
        monitor = AtLeastOneSample(run_id, sampling_interval=interval, samples_before_logging=1, tracking_uri=uri)
        monitor.start()
        return monitor
    except Exception as e:  # noqa: BLE001 - a run does not need it
        log.warning("no system metrics (%s: %s)", type(e).__name__, e)
        return None
