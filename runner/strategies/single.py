"""Strategy `single`: one device, no tf.distribute. The reference the other strategies are compared with."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from runner.lazy import lazy
from runner.strategies import NO_ROWS, STRATEGIES, Exchange, Rows, Strategy, StrategyBase, Traffic, Training, loss_scale
from runner.strategies.common import (
    clip, copies_of_moving_state, drain_loop, make_evaluate, maybe_jit, per_example_loss, steps_loop, tables,
)

if TYPE_CHECKING:
    import tensorflow as tf

    from runner.runtime.devices import Devices
else:
    tf = lazy("tensorflow")


@STRATEGIES.register
@dataclass
class Single(StrategyBase):
    """One device: gpus=0 runs on the host CPU, gpus=1 on the first device."""

    name: str = "single"

    min_gpus: ClassVar[int] = 0
    max_gpus: ClassVar[int | None] = 1
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
        return Traffic(update_copies=1, update_devices=1, reduce_bytes=0, reduce_devices=1, moved_bytes=0, messages=0,
                       ops=variables + 2 * rows.tables, rows_applied=rows.tower_bytes)


class SingleDevice(Strategy):
    """Model, optimizer and every op on one device."""

    def __init__(self, device: str, training: Training):
        self.device, self.training = device, training
        with tf.device(self.device):
            self.model = training.model_fn(training.seed)
            self.optimizer = training.optimizer_fn(self.model.trainable_variables, tables(self.model))
        self.loss_scale = loss_scale.make(training.loss_scaling, device)
        self.evaluate = make_evaluate(self.model, self.device, training.spec)

    def batches(self, pipeline: Any, examples: Any, seed: int) -> Any:
        """The pipeline's feed for one tower on this device."""
        return pipeline.towers(examples, self.training.global_batch, [self.device], seed)

    def train_loop(self, batches: Any):
        """fn(n) -> mean loss of n optimizer steps, compiled."""
        model, optimizer, scale, clip_norm = self.model, self.optimizer, self.loss_scale, self.training.clip_norm
        variables = model.trainable_variables

        def update(x: tf.Tensor, y: tf.Tensor) -> tf.Tensor:
            with tf.GradientTape() as tape:
                loss = tf.reduce_mean(per_example_loss(model, x, y, training=True)[0])
                scaled = scale.scaled(loss)  # recorded on the tape
            grads = tape.gradient(scaled, variables)
            scale.apply_if_finite(
                lambda: loss_scale.all_finite(grads),
                lambda: optimizer.apply_gradients(zip(clip(scale.unscale(grads), clip_norm), variables)),
            )
            return loss

        update = maybe_jit(update, self.training.jit_compile)

        def step() -> tf.Tensor:
            ((x, y),) = batches.next()  # (G, H, W, C), (G,)
            with tf.device(self.device):
                return update(x, y)

        return steps_loop(step, self.loss_scale.patience)

    def input_loop(self, batches: Any):
        """fn(n) pulling n steps of input only, to time the pipeline alone."""
        return drain_loop(batches.next)

    def checkpoint_objects(self) -> dict[str, Any]:
        """What a checkpoint saves: the model's variables (dropout seed states included) and its optimizer."""
        return {"model": self.model.variables, "optimizer": self.optimizer, **loss_scale.checkpointed(self.loss_scale)}

    def weights(self) -> list:
        """The trained weights (what the final digest covers)."""
        return self.model.trainable_variables

    def variable_devices(self) -> dict[str, str]:
        """Every trainable variable's path and the device it lives on."""
        return {v.path: v.value.device for v in self.model.trainable_variables}

    def describe(self) -> dict[str, str]:
        """Where the variables live (for tags and placement tests)."""
        return {"placement": f"all variables and ops on {self.device}"}

    def moving_statistics(self) -> list[list[Any]]:
        """The one copy's moving-state variables."""
        return copies_of_moving_state([self.model])
