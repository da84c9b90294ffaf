"""A combination's predicted step time, as a sum of named terms (seconds per step), each from the calibrations
(runner/predict/calibrate.py) and the strategy's own `traffic` (runner/strategies/, counted from its code):

- `towers`: the passes of the N towers at once, as calibrated;
- `update`: the optimizer's memory traffic (TOUCHED) times the strategy's update copies at the cold update's
  throughput, plus the embedding tables' rows it applies at the sparse update's, where the optimizer changes only
  looked-up rows (else the tables count as dense weights);
- `reduce`: the strategy's arithmetic bytes at the warm update's throughput, its copies at the copy throughput, its
  cross-device bytes at the send bandwidth and one send latency per message;
- `ops`: the strategy's small ops beyond the towers at the executor's fixed cost per op;
- `input`: the pipeline alone feeding every tower for one step, as calibrated.

Whether N devices at once go N times as fast or share one memory and its cores is measured, not assumed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from runner.config import ROWS_ONLY, TOUCHED, table_optimizer
from runner.models import label
from runner.strategies import Rows

TERMS = ("towers", "update", "reduce", "ops", "input")


@dataclass(frozen=True)
class Prediction:
    """A combination's predicted step: its terms (seconds per step) and what follows from them."""

    combination: str
    global_batch: int
    terms: dict[str, float]
    unit: str = "images"  # what the rate counts (data_pipelines.Spec.unit)
    units_per_example: int = 1  # a language model's tokens per sequence
    one_device_step: float | None = None  # a spec sheet's: the step of one device at the same per-device batch
    devices: int = 1  # the devices the global batch is spread over

    @property
    def step_seconds(self) -> float:
        return sum(self.terms.values())

    @property
    def rate(self) -> float:
        """Predicted `unit`/s: images/s, or tokens/s, examples/s."""
        return self.global_batch * self.units_per_example / self.step_seconds

    @property
    def efficiency(self) -> float | None:
        """Scaling efficiency: the rate over `devices` times one device's at the same per-device batch, which is one
        device's step over this one (None: not predicted)."""
        return self.one_device_step / self.step_seconds if self.one_device_step else None

    @property
    def dominant(self) -> str:
        """The largest term, with its share of the step."""
        name = max(self.terms, key=self.terms.get)
        return f"{name} {self.terms[name] / self.step_seconds:.0%}"

    def metrics(self) -> dict[str, float]:
        """What a run logs: the predicted rate (`predicted_<unit>_per_sec`) and each term in ms per step."""
        return {f"predicted_{self.unit}_per_sec": self.rate, "predicted_step_ms": 1e3 * self.step_seconds,
                **{f"predicted_{name}_ms": 1e3 * value for name, value in self.terms.items()}}


def combination(plan: Any) -> str:
    """`model/variant strategy/pipeline xN`, as the report names a row."""
    return f"{label(plan.model)} {plan.strategy.name}/{plan.pipeline.name} x{plan.gpus}"


def predict(plan: Any, machine: dict[str, Any], towers: dict[str, Any], feed: dict[str, Any]) -> Prediction:
    """The predicted step of `plan` from its calibration entries; ConfigError when the strategy has no cost model."""
    n = plan.local_towers
    weight_bytes, variables = int(towers["weight_bytes"]), int(towers["variables"])
    rows = Rows(float(towers.get("row_bytes", 0)), int(towers.get("tables", 0)))
    traffic = plan.strategy.traffic(n, weight_bytes, variables, rows)

    def rate(term: str, devices: int) -> float:  # bytes/s of the term's arithmetic on one device, or on all at once
        return float(towers[f"{term}_bytes_per_s_{'one' if devices == 1 else 'all'}"])

    tables_by = table_optimizer(plan.train)
    if rows.tables and tables_by in ROWS_ONLY:  # the tables' looked-up rows only
        rows_update, table_bytes = traffic.rows_applied / rate("rows", traffic.rows_devices), 0
    else:  # Adam's or momentum's slots move every row: each copy's update is dense over the whole table
        rows_update, table_bytes = 0.0, int(towers.get("table_bytes", 0))
    touched = TOUCHED[plan.train.optimizer] * weight_bytes + TOUCHED[tables_by] * table_bytes
    update_bytes = traffic.update_copies * touched
    sends = traffic.moved_bytes / float(machine["send_bytes_per_s"]) + traffic.messages * machine["send_latency_s"]
    terms = {
        "towers": float(towers["seconds"]),
        "update": update_bytes / rate("update", traffic.update_devices) + rows_update,
        "reduce": traffic.reduce_bytes / rate("reduce", traffic.reduce_devices)
        + traffic.copy_bytes / float(towers["copy_bytes_per_s_all"]) + sends,
        "ops": traffic.ops * float(machine["op_seconds"]),
        "input": float(feed["seconds"]),
    }
    return Prediction(combination(plan), plan.train.global_batch_size, terms, plan.spec.unit,
                      plan.spec.units_per_example)
