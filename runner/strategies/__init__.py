"""Strategy factory. The registry below imports no TensorFlow, so config validation can use it before TF loads.

A strategy owns variable placement and gives the training loop two compiled entry points:
`train_loop(batches) -> fn(n)` running n optimizer steps per call, and `evaluate(dataset) -> (loss, accuracy)`.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from omegaconf import DictConfig


@dataclass(frozen=True)
class Spec:
    """What config validation needs to know about a strategy, without building it."""

    module: str
    min_gpus: int
    max_gpus: int | None
    data_parallel: bool
    summary: str

    def towers(self, gpus: int) -> int:
        """Number of towers (model replicas fed separate batches) on `gpus` devices."""
        return max(gpus, 1) if self.data_parallel else 1

    def check(self, cfg: DictConfig) -> None:
        """Raise ConfigError if `gpus` is outside what this strategy can use."""
        from runner.config import ConfigError

        too_few = cfg.gpus < self.min_gpus
        too_many = self.max_gpus is not None and cfg.gpus > self.max_gpus
        if too_few or too_many:
            top = self.max_gpus if self.max_gpus is not None else "any"
            valid = [n for n, s in STRATEGIES.items() if s.min_gpus <= cfg.gpus <= (s.max_gpus or cfg.gpus)]
            raise ConfigError(
                f"strategy={cfg.strategy.name} needs gpus from {self.min_gpus} to {top}, got gpus={cfg.gpus}; "
                f"strategies valid with gpus={cfg.gpus}: {', '.join(valid)}"
            )


STRATEGIES: dict[str, Spec] = {
    "single": Spec("single", 0, 1, False, "one device, no tf.distribute (gpus=0: host CPU, gpus=1: first device)"),
    "mirrored": Spec("mirrored", 1, None, True, "tf.distribute.MirroredStrategy over all selected devices"),
    "replicated": Spec("replicated", 1, None, True, "in-graph towers, a variable copy per device, averaged grads"),
    "parameter_server": Spec("replicated", 1, None, True, "in-graph towers reading one variable copy (ps_device)"),
    "multi_worker": Spec(
        "multi_worker", 1, None, True,
        "tf.distribute.MultiWorkerMirroredStrategy over processes/machines (TF_CONFIG or strategy.workers)",
    ),
    "model_parallel": Spec(
        "model_parallel", 2, None, False,
        "one model split over the devices, one batch per step (strategy.split: width | stages | two_tower)",
    ),
}


def build(name: str, devices: Any, cfg: DictConfig) -> Any:
    """Create the strategy `name` over `devices`.

    Args:
        name: a key of STRATEGIES.
        devices: the runner.devices.Devices the run trains on.
        cfg: the validated config (model, optimizer and training settings).

    Returns:
        The strategy object, with its model and optimizer built under its placement.

    Raises:
        ValueError: `name` is not a known strategy.
    """
    if name not in STRATEGIES:
        raise ValueError(f"unknown strategy {name!r}; choose one of: {', '.join(sorted(STRATEGIES))}")
    module = importlib.import_module(f"runner.strategies.{STRATEGIES[name].module}")
    return module.Strategy(devices, cfg)
