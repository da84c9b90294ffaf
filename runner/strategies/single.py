"""Strategy `single`: one device, no tf.distribute. The reference the other strategies are compared with."""

from __future__ import annotations

from typing import Any

import tensorflow as tf

from runner.strategies.common import (
    build_model,
    build_optimizer,
    drain_loop,
    make_evaluate,
    maybe_jit,
    per_example_loss,
    steps_loop,
)


class Strategy:
    """Model, optimizer and every op on `devices.names[0]`."""

    def __init__(self, devices: Any, cfg: Any):
        self.device = devices.names[0]
        self.cfg = cfg
        with tf.device(self.device):
            self.model = build_model(cfg.model, cfg.train.seed)
            self.optimizer = build_optimizer(cfg.train, self.model.trainable_variables)
        self.evaluate = make_evaluate(self.model, self.device)

    def batches(self, pipeline: Any, ds: Any, seed: int) -> Any:
        """The pipeline's feed for one tower on this device."""
        return pipeline.towers(ds, self.cfg.train.global_batch_size, [self.device], self.cfg.pipeline, seed)

    def train_loop(self, batches: Any):
        """fn(n) -> mean loss of n optimizer steps, compiled."""
        model, optimizer = self.model, self.optimizer

        def update(x: tf.Tensor, y: tf.Tensor) -> tf.Tensor:
            with tf.GradientTape() as tape:
                loss = tf.reduce_mean(per_example_loss(model, x, y, training=True)[0])
            grads = tape.gradient(loss, model.trainable_variables)
            optimizer.apply_gradients(zip(grads, model.trainable_variables))
            return loss

        update = maybe_jit(update, self.cfg.train.jit_compile)

        def step() -> tf.Tensor:
            ((x, y),) = batches.next()  # (G, 28, 28, 1), (G,)
            with tf.device(self.device):
                return update(x, y)

        return steps_loop(step)

    def input_loop(self, batches: Any):
        """fn(n) pulling n steps of input only, to time the pipeline alone."""
        return drain_loop(batches.next)

    def checkpoint_objects(self) -> dict[str, Any]:
        """What a checkpoint saves: the model's variables (dropout seed states included) and its optimizer."""
        return {"model": self.model.variables, "optimizer": self.optimizer}

    def weights(self) -> list:
        """The trained weights (what the final digest covers)."""
        return self.model.trainable_variables

    def variable_devices(self) -> dict[str, str]:
        """Every trainable variable's path and the device it lives on."""
        return {v.path: v.value.device for v in self.model.trainable_variables}

    def describe(self) -> dict[str, str]:
        """Where the variables live (for tags and placement tests)."""
        return {"placement": f"all variables and ops on {self.device}"}
