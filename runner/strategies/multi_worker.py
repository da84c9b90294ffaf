"""Strategy `multi_worker`: tf.distribute.MultiWorkerMirroredStrategy across processes, the runner's own loop.

`mirrored`'s replica step, feeds and evaluation over every worker's devices, gradients all-reduced across workers
by collective ops, each worker's input sharded. The strategy must exist before TensorFlow's runtime starts (the
experiment builds it right after the devices); its constructor waits until every worker in TF_CONFIG is up.
"""

from __future__ import annotations

import logging
import os
import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from runner.runtime import cluster, is_sweep_child, watchdog
from runner.runtime.devices import DeviceError, nvidia_gpu_count
from runner.errors import ConfigError, UserError, one_line
from runner.lazy import tf
from runner.registry import Rule
from runner.strategies import STRATEGIES, Exchange, StrategyBase, Training, ring
from runner.strategies.mirrored import Replicas, SyncBatchNorm

if TYPE_CHECKING:
    from runner.runtime.devices import Devices

log = logging.getLogger(__name__)


@STRATEGIES.register
@dataclass
class MultiWorker(SyncBatchNorm, StrategyBase):
    """Several processes (usually machines) training one model in sync; worker 0 (the chief) logs to MLflow.

    Start one process per worker with the same config, or leave `workers` empty and export TF_CONFIG (what cluster
    launchers set). The global batch is split over workers x devices.
    """

    name: str = "multi_worker"
    tf_cnn: ClassVar[dict[str, tuple[str, ...]]] = {"--variable_update=distributed_replicated": ()}
    workers: list[str] = field(default_factory=list)  # host:port of every worker, the same list on each; [] = TF_CONFIG
    task_index: int = 0  # this process's index in `workers`
    communication: Literal["auto", "ring", "nccl"] = "auto"  # how the workers' gradients are all-reduced
    peer_timeout: float = 300.0  # seconds to wait for every worker to start before giving up
    # Batch normalization's batch statistics over every worker's examples (Keras' synchronized=True)
    sync_batch_norm: bool = False

    RULES: ClassVar[dict[str, Rule]] = {"peer_timeout": (lambda v: v > 0, "a positive number of seconds")}

    multi_process: ClassVar[bool] = True
    loss_scaling: ClassVar[bool] = True

    def cluster(self) -> cluster.Cluster:
        """The cluster from `workers`/`task_index`, else from TF_CONFIG. Raises ConfigError if neither is usable, or
        if this worker's port is taken on this machine (checked before TensorFlow starts its server)."""
        spec = cluster.from_options(self.workers, self.task_index, self.name)
        cluster.check_own_port(spec)
        return spec

    def peer_wait(self) -> float:
        return self.peer_timeout

    def check(self, gpus: int, model: Any, jit_compile: bool) -> None:
        super().check(gpus, model, jit_compile)
        if self.communication == "nccl" and not nvidia_gpu_count():
            raise ConfigError("strategy.communication=nccl needs NVIDIA GPUs and this machine shows none; "
                              "choose auto or ring")

    def exchange(self, devices: int, nodes: int, weight_bytes: float) -> Exchange:
        """Every device's copy updated after an all-reduce over all nodes' devices: within a node over its links, and
        between the nodes a ring of the nodes (2 (K - 1) / K W per node each way; TensorFlow's collectives, or a
        parameter server per node holding 1 / K of the weights, move as much), one message per ring step."""
        return Exchange(link_bytes=ring(devices, weight_bytes) if devices > 1 else 0.0, device_sums=1.0,
                        network_bytes=ring(nodes, weight_bytes) if nodes > 1 else 0.0, messages=2 * (nodes - 1))

    def build(self, devices: Devices, training: Training) -> WorkerReplicas:
        if devices.kind == "CPU" and devices.count > 1:
            # MultiWorkerMirroredStrategy places one replica on a worker's CPU whatever logical devices exist.
            raise DeviceError(
                f"strategy=multi_worker trains on one CPU per worker, got gpus={devices.count} on a machine without "
                "GPUs; use gpus=1 and add workers instead"
            )
        spec = training.cluster
        os.environ[cluster.ENV] = spec.tf_config()  # TensorFlow reads the cluster only from TF_CONFIG
        log.warning(exposure(spec))
        log.log(*waiting(spec, self.peer_timeout, "strategy.workers" if self.workers else cluster.ENV))
        implementation = getattr(tf.distribute.experimental.CommunicationImplementation, self.communication.upper())
        options = tf.distribute.experimental.CommunicationOptions(implementation=implementation)
        strategy = tf.distribute.MultiWorkerMirroredStrategy(communication_options=options)
        log.info("cluster up: %d replicas in sync", strategy.num_replicas_in_sync)
        # Only tf.distribute's input API gives each worker its share of the data.
        return WorkerReplicas(strategy, devices, training, input_api=True, sync_batch_norm=self.sync_batch_norm)


def waiting(spec: cluster.Cluster, seconds: float, source: str) -> tuple[int, str]:
    """The (level, line) logged as a worker starts waiting for its peers: whom, how long, that each must be started;
    a warning in a sweep job, whose peers the sweep never starts."""
    others = [a for kind, addresses in spec.tasks.items() for i, a in enumerate(addresses)
              if (kind, i) != (spec.task_type, spec.task_index)]
    line = (f"joining {spec.count} workers as {spec.name}: waiting up to {seconds:g} s (strategy.peer_timeout) for "
            f"{', '.join(others)}; every worker of {source} must be started")
    if is_sweep_child():
        return logging.WARNING, line + watchdog.IN_A_SWEEP
    return logging.INFO, line


def exposure(spec: cluster.Cluster) -> str:
    """The one-line warning every worker prints: TensorFlow's gRPC server binds 0.0.0.0:<port> whatever host the
    cluster names (grpc_server_lib.cc builds the listening address from the port alone; no option changes it), and
    serves unauthenticated requests, so anyone who reaches the port can run graphs in this process."""
    port = spec.tasks[spec.task_type][spec.task_index].rsplit(":", 1)[1]
    return (f"strategy=multi_worker: {spec.name}'s TensorFlow server listens on port {port} of every network "
            "interface (TensorFlow binds 0.0.0.0 whatever strategy.workers names) and accepts unauthenticated "
            "requests: run multi-worker jobs only on a trusted network or behind a firewall that admits the workers "
            "alone")


class PeerLost(UserError):
    """A task of the cluster stopped or cannot be reached while this one trains; one line naming it and what to do."""


# A task as TensorFlow names it (`/job:worker/replica:0/task:1`), not one of its devices (`.../task:1/device:CPU:0`).
TASK = re.compile(r"/job:(\w+)/replica:\d+/task:(\d+)(?![\d/])")
UNHEALTHY = "tasks are unhealthy"  # the coordination service's heartbeat check: "The following tasks are unhealthy ..."
# TensorFlow's errors when a peer's collective or server is gone; others only when their text says a collective
# was aborted by one.
LOST = ("UnavailableError", "AbortedError", "DeadlineExceededError")


def lost_peer(e: BaseException, spec: cluster.Cluster) -> PeerLost | None:
    """`e` (a TensorFlow error in a call of the training step) as one line naming the task(s) it reports lost, or None
    for an error that is not a lost peer's."""
    text = str(e)
    if type(e).__name__ not in LOST and "Collective ops is aborted" not in text and UNHEALTHY not in text:
        return None
    me = (spec.task_type, spec.task_index)
    named = dict.fromkeys(task for kind, index in TASK.findall(text) if (task := (kind, int(index))) != me)
    who = " and ".join(_task(spec, *task) for task in named) or "a peer"
    if UNHEALTHY in text:
        how = "TensorFlow reports it unhealthy: it stopped sending heartbeats"
    else:  # the op's own line ("Collective ops is aborted by: recvmsg:Connection reset by peer"), else the first
        line = next((line.strip() for line in text.splitlines() if "aborted by" in line), None)
        how = f"TensorFlow's {type(e).__name__}: {line or one_line(e, 150)}"
    return PeerLost(f"{spec.name} lost {who} of the cluster while training ({how}); a worker stopped, crashed or "
                    "cannot be reached: start every worker of the job again, and it resumes from its last checkpoint")


def _task(spec: cluster.Cluster, kind: str, index: int) -> str:
    """`worker1 (host:port)`: a task by the name the runner gives it, with its address when the cluster has it."""
    address = spec.tasks.get(kind, [])[index:index + 1]
    return f"{kind}{index} ({address[0]})" if address else f"{kind}{index}"


class WorkerReplicas(Replicas):
    """One replica per device on every worker; a call of its loops that loses a peer raises PeerLost."""

    def train_loop(self, batches: Any) -> Any:
        return self._naming_lost_peers(super().train_loop(batches))

    def input_loop(self, batches: Any) -> Any:
        return self._naming_lost_peers(super().input_loop(batches))

    def _naming_lost_peers(self, loop: Any) -> Any:
        spec = self.training.cluster

        def call(n: Any) -> Any:
            try:
                return loop(n)
            except tf.errors.OpError as e:
                lost = lost_peer(e, spec)
                if lost is None:
                    raise
                raise lost from e

        return call

    def check_same_start(self, step: int, config_hash: str = "") -> None:
        """Every worker must be given the same config and resume from the same step (n * sum(v^2) == sum(v)^2 over
        the workers' values v: all equal), or the collectives would pair different steps or tensors (a worker given
        other overrides failed mid-training with TensorFlow's 'Shape mismatch in the collective instance')."""
        fingerprint = int(config_hash[:4] or "0", 16)  # 16 bits: its squares' sums over 2**21 replicas exact in float64
        values = [step, step * step, fingerprint, fingerprint * fingerprint]
        local = self.strategy.run(lambda: tf.constant(values, tf.float64))
        sums = self.strategy.reduce(tf.distribute.ReduceOp.SUM, local, axis=None).numpy()
        total, squares, hashes, hash_squares = sums
        n = self.strategy.num_replicas_in_sync
        if n * hash_squares != hashes * hashes:
            raise DeviceError(
                f"the workers were started with different configs (this one's config_hash {config_hash}): start "
                "every worker with the same overrides, only strategy.task_index differing"
            )
        if n * squares != total * total:
            raise DeviceError(
                f"the workers would resume from different steps (this one: {step}); train.checkpoint_dir must be "
                "on a filesystem every worker sees"
            )

    def describe(self) -> dict[str, str]:
        spec = self.training.cluster
        return {
            "placement": f"mirrored on every worker's {', '.join(self.devices.names)}",
            "devices.workers": str(spec.count),
            "cluster.task": spec.name,
        }
