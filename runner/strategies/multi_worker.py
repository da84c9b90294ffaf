"""Strategy `multi_worker`: tf.distribute.MultiWorkerMirroredStrategy across processes, the runner's own loop.

The same replica step, feeds and evaluation as `mirrored` (this class only swaps the tf.distribute strategy):
variables mirrored on every worker's devices, gradients all-reduced across workers by collective ops, each
worker's input pipeline sharded so the workers see disjoint examples. Keras `fit` is not used: under this strategy
it is broken in Keras 3 (keras-team/keras#20585).

The strategy must exist before TensorFlow's runtime starts ("Collective ops must be configured at program
startup"), so the experiment builds it right after configuring the devices; its constructor waits until every
worker in TF_CONFIG is up.
"""

from __future__ import annotations

import logging

import tensorflow as tf

from runner import cluster
from runner.devices import DeviceError
from runner.strategies import mirrored

log = logging.getLogger(__name__)

_IMPLEMENTATIONS = {
    "auto": tf.distribute.experimental.CommunicationImplementation.AUTO,
    "ring": tf.distribute.experimental.CommunicationImplementation.RING,
    "nccl": tf.distribute.experimental.CommunicationImplementation.NCCL,
}


class Strategy(mirrored.Strategy):
    """One replica per device on every worker; the global batch is split over workers x devices."""

    input_api_only = True  # whatever `strategy.input` says

    def distribution(self) -> tf.distribute.Strategy:
        """MultiWorkerMirroredStrategy for the cluster in the config or TF_CONFIG (waits for every worker)."""
        if self.devices.kind == "CPU" and self.devices.count > 1:
            # MultiWorkerMirroredStrategy places one replica on a worker's CPU whatever logical devices exist.
            raise DeviceError(
                f"strategy=multi_worker trains on one CPU per worker, got gpus={self.cfg.gpus} on a machine without "
                "GPUs; use gpus=1 and add workers instead"
            )
        spec = cluster.from_config(self.cfg)
        cluster.export(spec)
        log.info("joining %d workers as %s (waits for all of them)", spec.count, spec.name)
        options = tf.distribute.experimental.CommunicationOptions(
            implementation=_IMPLEMENTATIONS[self.cfg.strategy.communication]
        )
        strategy = tf.distribute.MultiWorkerMirroredStrategy(communication_options=options)
        log.info("cluster up: %d replicas in sync", strategy.num_replicas_in_sync)
        return strategy

    def check_same_start(self, step: int) -> None:
        """Every worker must resume from the same step, or the collectives would pair different steps.

        Workers read the chief's checkpoint folder, so it has to be on a filesystem they all see. The test is
        n * sum(s^2) == sum(s)^2 over the workers' steps s, which holds exactly when they are all equal.
        """
        local = self.strategy.run(lambda: tf.constant([step, step * step], tf.float64))
        total, squares = self.strategy.reduce(tf.distribute.ReduceOp.SUM, local, axis=None).numpy()
        n = self.strategy.num_replicas_in_sync
        if n * squares != total * total:
            raise DeviceError(
                f"the workers would resume from different steps (this one: {step}); train.checkpoint_dir must be "
                "on a filesystem every worker sees"
            )

    def describe(self) -> dict[str, str]:
        """Where the variables live, and the cluster (for tags)."""
        spec = cluster.from_config(self.cfg)
        return {
            "placement": f"mirrored on every worker's {', '.join(self.devices.names)}",
            "devices.workers": str(spec.count),
            "cluster.task": spec.name,
        }
