"""Strategy `hybrid`: DLRM's own scheme: the embedding tables split across the devices, the rest data-parallel.

Each embedding table (`common.tables`) exists once, on one device, dealt by size (`deal`); everything else has a
copy per device, as under `replicated`. A tower's lookups run on each table's device: ids go there and rows come
back, DLRM's all-to-all of rows (Naumov et al. 2019, section 4.2). Backward, the table's device concatenates the
towers' row gradients and applies them once, with its optimizer's state for the table beside it. So N devices hold
N times the tables one can. With one device it is `replicated`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from runner.lazy import tf
from runner.strategies import NO_ROWS, STRATEGIES, Exchange, Rows, Traffic, Training, rows_to_owners
from runner.strategies.common import deal, placed_copies, share, tables
from runner.strategies.replicated import Replicated, Towers, TowersOptions, average, mean_of

if TYPE_CHECKING:
    from runner.runtime.devices import Devices


@STRATEGIES.register
@dataclass
class Hybrid(TowersOptions):
    """Embedding tables one per device (dealt by size), the other weights replicated: DLRM's scheme."""

    name: str = "hybrid"
    no_jit: ClassVar[str] = ("its towers look rows up in tables held on other devices, inside their forward pass, and "
                             "an XLA cluster runs on one device")

    def table_copies(self, devices: int) -> tuple[float, float]:
        return 1, 1  # each table once, on its device

    def exchange(self, devices: int, nodes: int, weight_bytes: float) -> Exchange:
        """The dense weights as `replicated`'s (the tables' rows are not priced on spec sheets)."""
        return Replicated().exchange(devices, nodes, weight_bytes)

    def traffic(self, devices: int, weight_bytes: int, variables: int, rows: Rows = NO_ROWS) -> Traffic:
        """The dense weights as `replicated`'s; each table's rows to and from its owner."""
        return Replicated().traffic(devices, weight_bytes, variables) + rows_to_owners(devices, rows)

    def build(self, devices: Devices, training: Training) -> HybridTowers:
        return HybridTowers(list(devices.names), training)


class HybridTowers(Towers):
    """Towers with a model copy per device whose tables are one shared variable each, on its owner's device."""

    def __init__(self, devices: list[str], training: Training):
        self.devices, self.training, self.replicated, self.homes = devices, training, True, devices
        self.models = placed_copies(training.model_fn, training.seed, devices)
        first = tables(self.models[0])
        self.owners = deal([math.prod(t.shape) for t in first], len(devices))
        self.shared = share(self.models, self.owners, devices)
        position = {id(t): k for k, t in enumerate(self.shared)}
        # variable index -> its table's owner (the index among the model's trainable variables, the same in each copy)
        self.table_owner = {i: self.owners[position[id(v)]] for i, v in enumerate(self.models[0].trainable_variables)
                            if id(v) in position}
        self.optimizers = []
        for j, (device, model) in enumerate(zip(devices, self.models)):
            with tf.device(device):
                self.optimizers.append(training.optimizer_fn(self._mine(j, model.trainable_variables),
                                                                  tables(model)))
        self._share(self.models[0], devices[0])

    def _mine(self, j: int, items: list[Any]) -> list[Any]:
        """What device j updates of a per-variable list: its copy's dense weights and the tables it owns."""
        return [x for i, x in enumerate(items) if self.table_owner.get(i, j) == j]

    def _average(self, grads: list[list[tf.Tensor]]) -> list[tf.Tensor]:
        """Dense weights' gradients averaged as `replicated` does; each table's rows gathered on its owner."""
        out = average(grads, self.devices)
        for i, owner in self.table_owner.items():
            with tf.device(self.devices[owner]):
                out[i] = mean_of([g[i] for g in grads])
        return out

    def _apply(self, mean_grads: list[tf.Tensor]) -> None:
        """Device j applies the mean gradients to its copy's dense weights and the tables it owns."""
        for j, (device, model, optimizer) in enumerate(zip(self.devices, self.models, self.optimizers)):
            with tf.device(device):
                optimizer.apply_gradients(zip(self._mine(j, mean_grads), self._mine(j, model.trainable_variables)))

    def describe(self) -> dict[str, str]:
        held = ", ".join(f"{d}: {self.owners.count(j)}" for j, d in enumerate(self.devices))
        return {"placement": f"each embedding table once (tables per device: {held}); the other weights copied on "
                             f"{', '.join(self.devices)}"}
