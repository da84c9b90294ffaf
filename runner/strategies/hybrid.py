"""Strategy `hybrid`: DLRM's own scheme: the embedding tables split across the devices, the rest data-parallel.

Each embedding table (`common.tables`) exists once, on one device, dealt by size (`common.deal`); everything else has a
copy per device, as under `replicated`. A tower's lookups run on each table's device: ids go there and rows come
back, DLRM's all-to-all of rows (Naumov et al. 2019, section 4.2). Backward, the table's device concatenates the
towers' row gradients and applies them once, with its optimizer's state for the table beside it. So N devices hold
N times the tables one can. With one device it is `replicated`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

from runner.strategies import NO_ROWS, STRATEGIES, Exchange, Rows, Traffic, Training, rows_to_owners
from runner.strategies.replicated import Replicated, Towers, TowersOptions

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

    def build(self, devices: Devices, training: Training) -> Towers:
        return Towers(list(devices.names), training, spread_tables=True)
