"""Strategies `replicated` and `parameter_server`: in-graph towers with explicitly averaged gradients.

One compiled step runs N towers, tower i on device i, each computing the gradient of its own mini-batch; the
gradients are averaged explicitly and applied, as tf_cnn_benchmarks' `variable_update` modes did. `replicated` keeps
a model and optimizer per device, every copy applying the same mean; `parameter_server` one copy on
`strategy.ps_device`, read by every tower (Keras' old multi_gpu_model). `hybrid` (hybrid.py) runs these towers too.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from runner.lazy import tf
from runner.strategies import (NO_ROWS, STRATEGIES, Exchange, Rows, StrategyBase, Traffic, Training,
                               ring, rows_to_every_copy, rows_to_owners)
from runner.strategies.common import (
    Built, average_moving_state, copies_of_moving_state, deal, placed_copies, share, stateless_passes, tables,
    tower_step, update,
)

if TYPE_CHECKING:
    from runner.runtime.devices import Devices


def tower_gradients(model: Any, x: tf.Tensor, y: tf.Tensor, device: str, scale: Any, training: Training,
                    passes: Any = None) -> tuple[tf.Tensor, list[tf.Tensor]]:
    """Forward and backward of one tower on `device`: (mean loss, gradients for the loss times `scale`'s factor)
    (common.tower_step; `passes`: the towers' one traced forward and backward)."""
    with tf.device(device):
        return tower_step(model, training.spec.task, tf.reduce_mean, scale, training.jit_compile, passes)(x, y)


def mean_of(grads: list[Any]) -> Any:
    """The mean of N gradients of one variable: dense ones added, sparse ones (tf.IndexedSlices: an embedding table's
    rows) kept sparse, their rows concatenated and divided by N."""
    if not isinstance(grads[0], tf.IndexedSlices):
        return tf.add_n(grads) / len(grads)
    values = tf.concat([g.values for g in grads], 0) / len(grads)  # (N n, d)
    return tf.IndexedSlices(values, tf.concat([g.indices for g in grads], 0), grads[0].dense_shape)


@dataclass
class TowersOptions(StrategyBase):
    """The options the in-graph tower strategies share: their step applies the loss scale, and each tower's copy
    keeps its own batch statistics."""

    loss_scaling: ClassVar[bool] = True
    batch_norm: ClassVar[str] = ("batch statistics per tower (G/N examples); each copy's moving statistics set to "
                                 "their mean over the copies after every step")


@STRATEGIES.register
@dataclass
class Replicated(TowersOptions):
    """A full copy of the variables on every device, each updated with the averaged gradient."""

    name: str = "replicated"
    tf_cnn: ClassVar[dict[str, tuple[str, ...]]] = {"--variable_update=replicated": ()}

    def build(self, devices: Devices, training: Training) -> Towers:
        return Towers(list(devices.names), training)

    def exchange(self, devices: int, nodes: int, weight_bytes: float) -> Exchange:
        """Each variable's gradients summed on one device (`average`: the variables dealt over the devices) and the
        mean copied back to every copy: as many bytes per device as a ring; every device updates its copy."""
        return Exchange(link_bytes=ring(devices, weight_bytes), device_sums=1.0)

    def traffic(self, devices: int, weight_bytes: int, variables: int, rows: Rows = NO_ROWS) -> Traffic:
        """`average`: each variable's N gradients summed (read N, write 1) and divided (read 1, write 1) on one
        device, the N - 1 others' gradients sent there and the mean sent back to N - 1 copies; N updates. A table's
        rows: concatenated on one device (`mean_of`), every copy applies them all."""
        n, w = devices, weight_bytes
        return Traffic(update_copies=n, update_devices=n, reduce_bytes=(n + 3) * w,
                       reduce_devices=min(n, max(variables, 1)), moved_bytes=2 * (n - 1) * w,
                       messages=2 * (n - 1) * variables,
                       ops=2 * variables + n * variables) + rows_to_every_copy(n, rows)


@STRATEGIES.register
@dataclass
class ParameterServer(TowersOptions):
    """One copy of the variables on `ps_device`, read by every tower (Keras' multi_gpu_model layout)."""

    name: str = "parameter_server"
    tf_cnn: ClassVar[dict[str, tuple[str, ...]]] = {
        "--variable_update=parameter_server --local_parameter_device=cpu": ("strategy.ps_device=cpu",)}
    ps_device: Literal["cpu", "first_device"] = "cpu"  # the host CPU | the first training device
    # Embedding tables: on ps_device with the rest | spread: each on one training device, dealt by size (as hybrid)
    tables: Literal["ps_device", "spread"] = "ps_device"
    batch_norm: ClassVar[str] = ("batch statistics per tower (G/N examples); every tower updates the one copy's moving "
                                 "statistics in turn (N updates of the moving averages a step)")

    def table_copies(self, devices: int) -> tuple[float, float]:
        return 1, 1  # one copy, read by every tower

    def build(self, devices: Devices, training: Training) -> Towers:
        home = "/device:CPU:0" if self.ps_device == "cpu" else devices.names[0]
        return Towers(list(devices.names), training, ps_device=home, spread_tables=self.tables == "spread")

    def exchange(self, devices: int, nodes: int, weight_bytes: float) -> Exchange:
        """Every tower sends its gradients to the one copy and reads the weights from it: through the host link
        (ps_device=cpu; the host sums N gradients and updates), or the first device's links, which carry the N - 1
        other towers' traffic (it sums and updates)."""
        n, w = devices, weight_bytes
        if self.ps_device == "cpu":
            return Exchange(host_bytes=w, device_update=0.0, host_update=1.0, host_sums=n)
        return Exchange(link_bytes=(n - 1) * w, device_sums=n)

    def traffic(self, devices: int, weight_bytes: int, variables: int, rows: Rows = NO_ROWS) -> Traffic:
        """Every tower's gradients go to the one copy (N sent), are summed and divided there, one update; every
        tower reads the weights from it (N sent back). A table's rows: to and from the one copy, or, with
        strategy.tables=spread, the table's own device (hybrid's)."""
        n, w = devices, weight_bytes
        return Traffic(update_copies=1, reduce_bytes=(n + 3) * w, moved_bytes=2 * n * w, messages=2 * n * variables,
                       ops=3 * variables) + rows_to_owners(n, rows, spread=self.tables == "spread")


class Towers(Built):
    """N in-graph towers, tower i on devices[i]; a model copy with its optimizer on every device (tower i uses its
    own), or one copy on `ps_device` that every tower reads. `spread_tables`: each embedding table once, on one of
    the devices (dealt by size), in place of every copy's own; with a copy per device (hybrid) only the table's
    owner updates it."""

    def __init__(self, devices: list[str], training: Training, ps_device: str | None = None,
                 spread_tables: bool = False):
        self.devices = self.tower_devices = devices
        self.training, self.spread = training, spread_tables
        self.replicated = ps_device is None
        self.homes = devices if ps_device is None else [ps_device]
        self.models = placed_copies(training.model_fn, training.seed, self.homes)
        self.table_owner: dict[int, int] = {}  # hybrid: a table's index among the trainable variables -> its owner
        if spread_tables:
            self.owners = deal([math.prod(t.shape) for t in tables(self.models[0])], len(devices))
            self.shared = share(self.models, self.owners, devices)
            if self.replicated:  # N copies share each table: its owner's optimizer alone updates it
                position = {id(t): k for k, t in enumerate(self.shared)}
                self.table_owner = {i: self.owners[position[id(v)]]
                                    for i, v in enumerate(self.models[0].trainable_variables) if id(v) in position}
        self.optimizers = []
        for j, (home, model) in enumerate(zip(self.homes, self.models)):
            with tf.device(home):
                self.optimizers.append(training.optimizer_fn(self._mine(j, model.trainable_variables), tables(model)))
        self._share(self.models[0], self.devices[0], self.homes[0])

    def step(self, batches: Any):
        # one traced forward and backward for every tower (`common.stateless_passes`); a model with embedding tables
        # keeps one per tower: a stateless call would read a table whole, where each lookup reads its rows
        model, training = self.models[0], self.training
        passes = None if tables(model) else stateless_passes(model, training.spec.task, tf.reduce_mean,
                                                             training.jit_compile)

        def step() -> tf.Tensor:
            losses, grads = [], []
            for i, (x, y) in enumerate(batches.next()):  # x: (G/N, H, W, C) for tower i
                model = self.models[i if self.replicated else 0]
                loss, g = tower_gradients(model, x, y, self.devices[i], self.loss_scale, self.training, passes)
                losses.append(loss)
                grads.append(g)
            mean_grads = self._average(grads)  # a non-finite tower gradient makes its mean non-finite
            if len(self.models) > 1:  # each copy's moving statistics set to the copies' mean
                average_moving_state(self.models, self.homes)
            update(self.loss_scale, mean_grads, self.training.clip_norm, self._apply)
            return tf.add_n(losses) / len(losses)

        return step

    def _average(self, per_tower: list[list[tf.Tensor]]) -> list[tf.Tensor]:
        """Mean over towers of each variable's gradient (`mean_of`), variable j reduced on device j mod N; hybrid's
        tables on their owners (the one device that applies each), beside their state."""
        out = []
        for j, grads in enumerate(zip(*per_tower)):
            with tf.device(self.devices[self.table_owner.get(j, j % len(self.devices))]):
                out.append(mean_of(list(grads)))
        return out

    def _mine(self, j: int, items: list[Any]) -> list[Any]:
        """What copy j updates of a per-variable list: all of it but the shared tables another device owns."""
        return [x for i, x in enumerate(items) if self.table_owner.get(i, j) == j]

    def _apply(self, mean_grads: list[tf.Tensor]) -> None:
        """Every copy's optimizer applies the mean gradients to what it updates (`_mine`) on its own device."""
        for j, (home, model, optimizer) in enumerate(zip(self.homes, self.models, self.optimizers)):
            with tf.device(home):
                optimizer.apply_gradients(zip(self._mine(j, mean_grads), self._mine(j, model.trainable_variables)))

    def _kept(self) -> dict[str, Any]:
        return {**{f"model{i}": m.variables for i, m in enumerate(self.models)},
                **{f"optimizer{i}": o for i, o in enumerate(self.optimizers)}}

    def weights(self) -> list:  # the first copy's: the copies are identical
        return self.models[0].trainable_variables

    def variable_devices(self) -> dict[str, str]:
        return {f"{c}/{v.path}": v.value.device for c, m in enumerate(self.models) for v in m.trainable_variables}

    def moving_statistics(self) -> list[list[Any]]:
        return copies_of_moving_state(self.models)

    def describe(self) -> dict[str, str]:
        if self.replicated and self.spread:
            held = ", ".join(f"{d}: {self.owners.count(j)}" for j, d in enumerate(self.devices))
            return {"placement": f"each embedding table once (tables per device: {held}); the other weights copied on "
                                 f"{', '.join(self.devices)}"}
        if self.replicated:
            return {"placement": f"one copy per device on {', '.join(self.devices)}; towers on each"}
        homes = sorted({t.value.device.rsplit("device:", 1)[-1] for t in tables(self.models[0])})
        where = f"; embedding tables on {', '.join(homes)}" if len(homes) > 1 else ""
        return {"placement": f"variables on {self.homes[0]}{where}; towers on {', '.join(self.devices)}"}
