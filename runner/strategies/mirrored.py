"""Strategy `mirrored`: tf.distribute.MirroredStrategy, trained by the runner's own compiled loop.

Each replica computes gradients on its share of the global batch (its loss divided by the global batch size); the
runner all-reduces (sums) them across replicas, clips the sum where `train.clip_norm` says, and the Keras optimizer
applies it on every replica.

Input (`strategy.input`): `towers`, the default and the cheaper, feeds replica i from tower i of the pipeline's own
feed, made inside the compiled loop; `distribute` goes through tf.distribute's input API (`multi_worker` always
does). The same examples reach the same replica either way.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Iterator, Literal

from runner.runtime.devices import nvidia_gpu_count
from runner.errors import ConfigError
from runner.lazy import tf
from runner.strategies import (NO_ROWS, STRATEGIES, Exchange, Rows, StrategyBase, Traffic, Training,
                               loss_scale, ring)
from runner.strategies.common import (
    Built, clip, moving_state, steps_loop, synchronize_batch_norm, tables, touch, tower_step,
)
from runner.strategies.replicated import Replicated

if TYPE_CHECKING:
    from runner.runtime.devices import Devices

CrossDeviceOps = Literal["auto", "tensorflow", "nccl", "hierarchical_copy", "reduce_to_one_device"]
_CROSS_DEVICE_OPS = {
    "auto": lambda: None,  # TensorFlow's choice, except on CPUs (see `Mirrored.distribution`)
    "tensorflow": lambda: None,  # TensorFlow's choice: collective all-reduce on CPUs, NCCL on GPUs
    "nccl": lambda: tf.distribute.NcclAllReduce(),
    "hierarchical_copy": lambda: tf.distribute.HierarchicalCopyAllReduce(),
    "reduce_to_one_device": lambda: tf.distribute.ReductionToOneDevice(),
}


class SyncBatchNorm:
    """The batch normalization option of the tf.distribute strategies (mirrored, multi_worker): statistics per
    replica with moving statistics averaged after every step, or over the global batch (`sync_batch_norm`: an
    all-reduce inside the forward pass, which an XLA cluster cannot hold)."""

    sync_batch_norm: bool

    def describe_batch_norm(self) -> str:
        if self.sync_batch_norm:
            return ("batch statistics of the global batch (strategy.sync_batch_norm=true: one all-reduce per layer "
                    "and step), so every replica keeps the same moving statistics")
        return ("batch statistics per replica (G/N examples); moving statistics all-reduced to their mean over the "
                "replicas after every step")

    def jit_refusal(self) -> str:
        if self.sync_batch_norm:
            return ("strategy.sync_batch_norm=true all-reduces the batch statistics inside the forward pass, which an "
                    "XLA cluster cannot hold; strategy.sync_batch_norm=false keeps them per replica")
        return super().jit_refusal()  # type: ignore[misc]


@STRATEGIES.register
@dataclass
class Mirrored(SyncBatchNorm, StrategyBase):
    """tf.distribute.MirroredStrategy over the selected devices, trained by the runner's own compiled loop."""

    name: str = "mirrored"
    tf_cnn: ClassVar[dict[str, tuple[str, ...]]] = {"--variable_update=replicated --all_reduce_spec=nccl": ()}
    # auto: reduce_to_one_device on CPUs, TensorFlow's choice elsewhere | tensorflow (collective ring on CPUs, NCCL on
    # GPUs) | nccl | hierarchical_copy | reduce_to_one_device
    cross_device_ops: CrossDeviceOps = "auto"
    input: Literal["towers", "distribute"] = "towers"  # the pipeline's own feed, per replica | tf.distribute's API
    # Batch normalization's batch statistics over the global batch (Keras' synchronized=True) instead of per replica
    sync_batch_norm: bool = False
    loss_scaling: ClassVar[bool] = True

    def check(self, gpus: int, model: Any, jit_compile: bool) -> None:
        super().check(gpus, model, jit_compile)
        if self.cross_device_ops == "nccl" and not nvidia_gpu_count():
            raise ConfigError(
                "strategy.cross_device_ops=nccl needs NVIDIA GPUs and this machine shows none; choose auto, "
                "tensorflow, hierarchical_copy or reduce_to_one_device"
            )

    def build(self, devices: Devices, training: Training) -> Replicas:
        return Replicas(self.distribution(devices), devices, training, input_api=self.input == "distribute",
                        sync_batch_norm=self.sync_batch_norm)

    def exchange(self, devices: int, nodes: int, weight_bytes: float) -> Exchange:
        """On GPUs tf.distribute all-reduces with NCCL (a ring: `ring`) and every device updates its copy."""
        return Exchange(link_bytes=ring(devices, weight_bytes), device_sums=ring(devices, 1.0))

    def traffic(self, devices: int, weight_bytes: int, variables: int, rows: Rows = NO_ROWS) -> Traffic:
        """`replicated`'s counts (each gradient reduced on one device, as reduce_to_one_device does on CPUs, an
        update of every copy, a table's rows gathered on one device), every gradient reduced on the same device."""
        return dataclasses.replace(Replicated().traffic(devices, weight_bytes, variables, rows), reduce_devices=1)

    def distribution(self, devices: Devices) -> tf.distribute.Strategy:
        """The tf.distribute strategy: MirroredStrategy over this process's devices."""
        choice = self.cross_device_ops
        if choice == "auto" and devices.kind == "CPU":
            # TensorFlow's collective ring on CPU devices sharing the same cores waits far longer than one sum takes
            choice = "reduce_to_one_device"
        return tf.distribute.MirroredStrategy(list(devices.names), cross_device_ops=_CROSS_DEVICE_OPS[choice]())


def per_replica_feed(strategy: tf.distribute.Strategy, towers: Any) -> Iterator[tuple[Any, ...]]:
    """A pipeline's own tower feed as tf.distribute per-replica values: replica i (on the strategy's i-th device,
    where the pipeline put tower i's batch) trains on tower i's batch, made inside the compiled loop."""
    while True:
        pairs = towers.next()  # one (x (G/N, H, W, C), y (G/N,)) per device, in the strategy's order
        yield tuple(strategy.experimental_distribute_values_from_function(
            lambda ctx, k=k: pairs[ctx.replica_id_in_sync_group][k]) for k in (0, 1))


class Replicas(Built):
    """One model replica per device of a tf.distribute `strategy` (Mirrored, or MultiWorkerMirrored), variables
    mirrored, gradients all-reduced; fed through tf.distribute's input API when `input_api`, batch norm's statistics
    over all replicas when `sync_batch_norm` (else each replica's, the moving ones averaged after every step)."""

    def __init__(self, strategy: tf.distribute.Strategy, devices: Devices, training: Training, input_api: bool,
                 sync_batch_norm: bool = False):
        self.strategy, self.devices, self.training, self.input_api = strategy, devices, training, input_api
        self.sync_batch_norm = sync_batch_norm
        with self.strategy.scope():
            self.model = training.model_fn(training.seed)
            self.optimizer = training.optimizer_fn(self.model.trainable_variables, tables(self.model))
        # Keras sums the replicas' gradients inside apply_gradients, after clipping each replica's part; the runner
        # sums them before it clips, so Keras' sum (a private method: tests/test_strategies.py would see a rename) is
        # switched off.
        from runner import optimizers

        for optimizer in optimizers.each(self.optimizer):  # a PerPart's each part
            optimizer._all_reduce_sum_gradients = lambda grads_and_vars: grads_and_vars
        if sync_batch_norm:
            synchronize_batch_norm(self.model)
        # Outside the scope: one plain copy per process, read by every replica and changed in cross-replica context.
        self._share(self.model, devices.names[0])

    def batches(self, pipeline: Any, examples: Any, seed: int) -> Any:
        """The pipeline's feed: its own towers as per-replica values, or mapped onto tf.distribute's input API."""
        batch = self.training.global_batch
        if self.input_api:
            return pipeline.distribute(self.strategy, examples, batch, seed)
        return per_replica_feed(self.strategy, pipeline.towers(examples, batch, list(self.devices.names), seed))

    def step(self, batches: Any):
        """fn() -> the mean loss of one synchronous step over all replicas (tf.distribute's run and all-reduce)."""
        model, optimizer, global_batch = self.model, self.optimizer, self.training.global_batch
        variables, scale, strategy = model.trainable_variables, self.loss_scale, self.strategy
        clip_norm = self.training.clip_norm

        def average_loss(per_example: tf.Tensor) -> tf.Tensor:  # (G/replicas,) -> this replica's part of the mean
            return tf.nn.compute_average_loss(per_example, global_batch_size=global_batch)

        forward_backward = tower_step(model, self.training.spec.task, average_loss, scale, self.training.jit_compile)

        def replica_gradients(x: tf.Tensor, y: tf.Tensor) -> tuple[tf.Tensor, list[tf.Tensor]]:
            loss, grads = forward_backward(x, y)
            if not self.sync_batch_norm:  # each replica updated its own copy of the moving statistics
                average_over_replicas(moving_state(model))
            return loss, grads

        def replica_apply(grads: list[tf.Tensor]) -> None:  # unscaled, summed over the replicas, clipped, applied
            summed = all_reduce(tf.distribute.ReduceOp.SUM, scale.unscale(grads))
            optimizer.apply_gradients(zip(clip(summed, clip_norm), variables))

        def all_finite(grads: Any) -> tf.Tensor:
            """Whether every replica's gradients are finite (all processes' replicas, for multi_worker)."""
            bad = strategy.run(lambda g: tf.cast(tf.logical_not(loss_scale.all_finite(g)), tf.float32), args=(grads,))
            return strategy.reduce(tf.distribute.ReduceOp.SUM, bad, axis=None) == 0

        def step() -> tf.Tensor:
            loss, grads = strategy.run(replica_gradients, args=next(batches))
            # In cross-replica context, as Keras' LossScaleOptimizer does: the apply's all-reduce is a merge call,
            # which a tf.cond inside a replica cannot hold.
            scale.apply_if_finite(lambda: all_finite(grads), lambda: strategy.run(replica_apply, args=(grads,)))
            return strategy.reduce(tf.distribute.ReduceOp.SUM, loss, axis=None)

        return step

    def input_loop(self, batches: Any):
        def step() -> tf.Tensor:
            per_replica = self.strategy.run(touch, args=next(batches))
            return self.strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica, axis=None)

        return steps_loop(step)

    def variable_devices(self) -> dict[str, str]:
        copies = [(f"{r}/{v.path}", c) for v in self.model.trainable_variables for r, c in enumerate(v.value.values)]
        return {name: copy.device for name, copy in copies}

    def describe(self) -> dict[str, str]:
        return {"placement": f"mirrored on {', '.join(self.devices.names)}"}

    def moving_statistics(self) -> list[list[Any]]:
        return [[c.numpy() for c in v.value.values] for v in moving_state(self.model)]


def average_over_replicas(variables: list) -> None:
    """In replica context: set each replica's copy of `variables` to their mean over all replicas (one all-reduce)."""
    if variables:
        # plain tensors: MultiWorkerMirroredStrategy cannot all-reduce a variable's value as it is
        values = [tf.identity(v.value) for v in variables]
        means = all_reduce(tf.distribute.ReduceOp.MEAN, values)
        for variable, mean in zip(variables, means):
            variable.assign(mean)


def all_reduce(op: tf.distribute.ReduceOp, values: list) -> list:
    """In replica context: `values` reduced over all replicas, as ReplicaContext.all_reduce does (one merge call,
    one batch reduce) without its gradient wrapper, whose custom_gradient walks the graph back from the values to find
    their variables (gpt mirrored x4: 0.45 s of tracing); the runner never differentiates through an all-reduce."""

    def batch(strategy: tf.distribute.Strategy, *flat: Any) -> Any:
        return strategy.extended.batch_reduce_to(
            op, [(v, v.device if isinstance(v, tf.Tensor) else v) for v in flat])

    return list(tf.distribute.get_replica_context().merge_call(batch, args=tuple(values)))
