"""Strategy `single`: one device, no tf.distribute. The reference the other strategies are compared with."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from runner.lazy import tf
from runner.strategies import NO_ROWS, STRATEGIES, Exchange, Rows, StrategyBase, Traffic, Training
from runner.strategies import common
from runner.strategies.common import Built, copies_of_moving_state, tables

if TYPE_CHECKING:
    from runner.runtime.devices import Devices


@STRATEGIES.register
@dataclass
class Single(StrategyBase):
    """One device: gpus=0 runs on the host CPU, gpus=1 on the first device."""

    name: str = "single"

    min_gpus: ClassVar[int] = 0
    max_gpus: ClassVar[int | None] = 1
    baseline: ClassVar[bool] = True
    data_parallel: ClassVar[bool] = False
    loss_scaling: ClassVar[bool] = True

    def build(self, devices: Devices, training: Training) -> SingleDevice:
        return SingleDevice(devices.names[0], training)

    def exchange(self, devices: int, nodes: int, weight_bytes: float) -> Exchange:
        """One update on the one device; nothing moves."""
        return Exchange()

    def traffic(self, devices: int, weight_bytes: int, variables: int, rows: Rows = NO_ROWS) -> Traffic:
        """One update; nothing to combine or move. A table's rows: applied once (2 more ops than a dense update:
        the repeated rows summed first)."""
        return Traffic(update_copies=1, ops=variables + 2 * rows.tables, rows_applied=rows.tower_bytes)


class SingleDevice(Built):
    """Model, optimizer and every op on one device."""

    def __init__(self, device: str, training: Training):
        self.device, self.training, self.tower_devices = device, training, [device]
        with tf.device(self.device):
            self.model = training.model_fn(training.seed)
            self.optimizer = training.optimizer_fn(self.model.trainable_variables, tables(self.model))
        self._share(self.model, device)

    def step(self, batches: Any):
        """fn() -> the loss of one optimizer step; under train.jit_compile one XLA cluster, the update included."""
        optimizer, scale, variables = self.optimizer, self.loss_scale, self.model.trainable_variables
        # the stateful forward and backward (jit_compile=False here): under train.jit_compile `train` is the cluster
        forward_backward = common.tower_step(self.model, self.training.spec.task, tf.reduce_mean, scale, False)

        def train(x: tf.Tensor, y: tf.Tensor) -> tf.Tensor:
            loss, grads = forward_backward(x, y)
            common.update(scale, grads, self.training.clip_norm,
                          lambda clipped: optimizer.apply_gradients(zip(clipped, variables)))
            return loss

        train = tf.function(train, jit_compile=True) if self.training.jit_compile else train  # the fetch outside

        def step() -> tf.Tensor:
            ((x, y),) = batches.next()  # (G, H, W, C), (G,)
            with tf.device(self.device):
                return train(x, y)

        return step

    def variable_devices(self) -> dict[str, str]:
        return {v.path: v.value.device for v in self.model.trainable_variables}

    def describe(self) -> dict[str, str]:
        return {"placement": f"all variables and ops on {self.device}"}

    def moving_statistics(self) -> list[list[Any]]:
        return copies_of_moving_state([self.model])
