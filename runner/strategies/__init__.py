"""Parallelism strategies: where the model's variables live and how one training step runs on the devices.

A strategy has two sides, both in its module:

- its **options** (contract `StrategyOptions`): a dataclass registered with `STRATEGIES`, read by config validation
  before TensorFlow starts: which device counts it takes, how many towers (model replicas fed separate batches) it
  runs, its own cross-key checks, and `build()`;
- the **built strategy** (contract `Strategy`): the model and optimizer placed on the devices, and the compiled
  entry points the training loop calls.

Strategies receive what they use (`Training`), never the whole config, so a test can build one from plain values.
Modules refer to TensorFlow through `runner.lazy`, so importing them for their options loads nothing.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any, Callable, ClassVar, Protocol, runtime_checkable

from runner.data_pipelines import MNIST, Spec
from runner.errors import ConfigError
from runner.registry import Registry

if TYPE_CHECKING:
    import keras
    import tensorflow as tf

    from runner.data_pipelines import Pipeline
    from runner.data_pipelines.common import Examples
    from runner.models import Model
    from runner.runtime.cluster import Cluster
    from runner.runtime.devices import Devices
    from runner.strategies.loss_scale import LossScale, LossScaling, NoLossScale

MAX_DEVICES = 16

# fn(n) -> (mean loss of the steps run, steps run): n steps in one compiled call, stopping at a non-finite loss.
Loop = Callable[["tf.Tensor"], tuple["tf.Tensor", "tf.Tensor"]]


@dataclass(frozen=True)
class Training:
    """What a strategy builds and trains, as plain values."""

    model: Model
    model_fn: Callable[[int], keras.Model]  # seed -> the model with its initial weights (every copy starts the same)
    # (variables, embedding tables) -> the configured optimizer for the variables, slots built (common.build_optimizer)
    optimizer_fn: Callable[[list, list], Any]
    seed: int
    global_batch: int  # examples per step over all towers
    jit_compile: bool = False  # XLA-compile each tower's forward and backward (train.jit_compile, resolved)
    cluster: Cluster | None = None
    loss_scaling: LossScaling | None = None  # dynamic loss scaling (train.precision=mixed_float16), or None
    spec: Spec = MNIST  # the data's examples the model is built for
    clip_norm: float | None = None  # the averaged gradients' global norm is scaled down to this (common.clip)
    weight_decay: float = 0.0  # adamw's decay: what sharded_update applies to its slices itself
    tables_rows_only: bool = False  # the tables' optimizer changes only the rows looked up (config.ROWS_ONLY)


@runtime_checkable
class Strategy(Protocol):
    """A built strategy: what the training loop, checkpoints and tags use."""

    evaluate: Callable[[Any], dict[str, float]]  # test dataset -> {"loss", "accuracy"[, "auc"]} (common.make_evaluate)
    loss_scale: LossScale | NoLossScale  # the step's shared loss scale (mixed_float16), or the no-op

    def batches(self, pipeline: Pipeline, examples: Examples, seed: int) -> Any:
        """The pipeline's feed, made for this strategy's towers."""

    def train_loop(self, batches: Any) -> Loop:
        """The compiled training call: n synchronous optimizer steps over all towers."""

    def input_loop(self, batches: Any) -> Loop:
        """The same call pulling input only, to time the pipeline alone and to fast-forward a resumed feed."""

    def checkpoint_objects(self) -> dict[str, Any]:
        """Name -> trackable (models, optimizers) that a checkpoint saves and restores."""

    def weights(self) -> list:
        """The trained weights (what the final digest covers)."""

    def variable_devices(self) -> dict[str, str]:
        """Every variable (copy) and the device it lives on."""

    def describe(self) -> dict[str, str]:
        """Tags saying where the variables live."""

    def moving_statistics(self) -> list[list[Any]]:
        """Each moving-state variable (batch normalization's) as one numpy array per copy of the model kept."""

    def check_same_start(self, step: int, config_hash: str = "") -> None:
        """Raise unless every process of the job resumes from `step` and was given the config of `config_hash` (one
        process: nothing to do)."""
        return None


@dataclass(frozen=True)
class Traffic:
    """What a strategy's step does beyond its towers' forward and backward passes, in counts a reader can check by
    hand (runner/predict/ prices them); bytes and counts per step, summed over the devices unless said."""

    update_copies: float = 0.0  # full optimizer updates (replicated: N; sharded: N updates of 1/N each, so 1)
    update_devices: int = 1  # the devices those updates run on at once (replicated, sharded: N; parameter server: 1)
    reduce_bytes: float = 0.0  # read plus written by the arithmetic combining the towers' gradients (+, /)
    reduce_devices: int = 1  # the devices that arithmetic runs on at once
    # Read plus written by copies that cut gradients into slices and put updated weights together, on every device
    # at once (priced apart from the update); most strategies cut and assemble nothing.
    copy_bytes: float = 0.0
    moved_bytes: float = 0.0  # sent from one device to another
    messages: int = 0  # cross-device transfers (each pays a latency, whatever its size)
    ops: int = 0  # ops beyond the towers' passes, each paying the executor's fixed cost
    # Bytes of embedding-table gradient rows (`Rows`) that sparse updates apply (each copy of a table that applies N
    # towers' rows counts N towers' bytes); a model without embedding tables applies none.
    rows_applied: float = 0.0
    rows_devices: int = 1  # the devices those sparse updates run on at once

    def __add__(self, other: Traffic) -> Traffic:
        """Two parts of one step's work (the dense weights', the tables' rows): the counts added; of the devices
        each part's arithmetic runs on at once, the larger."""
        def combined(name: str) -> Any:
            return (max if name.endswith("_devices") else operator.add)(getattr(self, name), getattr(other, name))

        return Traffic(**{f.name: combined(f.name) for f in fields(self)})


@dataclass(frozen=True)
class Rows:
    """A model's embedding tables (`common.tables`) in one step, as a strategy's traffic counts them: their sparse
    gradients, `tower_bytes` (float32, b x lookups x d x 4, a row per lookup) per tower over the `tables` tables."""

    tower_bytes: float = 0.0
    tables: int = 0


NO_ROWS = Rows()  # a model without embedding tables
NOTHING = Traffic()


# What the strategies do with the tables' rows, counted as `Traffic` (N devices, R = rows.tower_bytes, T tables).
# A sparse update (runner/optimizers.py) first sums repeated rows (unique, segment sum), then applies: 3 ops a table.


def rows_to_every_copy(n: int, rows: Rows) -> Traffic:
    """A table copy per device (mirrored, replicated): each table's N towers' rows concatenated and divided on one
    device (copy 2 N R, arithmetic 2 N R), the N - 1 others' rows sent there and the N R rows sent to the N - 1
    other copies; every copy applies all N R rows."""
    r, t = rows.tower_bytes, rows.tables
    if not t:
        return NOTHING
    return Traffic(reduce_bytes=2 * n * r, copy_bytes=2 * n * r, moved_bytes=(n - 1) * r + (n - 1) * n * r,
                   messages=2 * (n - 1) * t, ops=t * (2 + 3 * n), rows_applied=n * n * r, rows_devices=n)


def rows_to_owners(n: int, rows: Rows, spread: bool = True) -> Traffic:
    """Each table once: on one of the N devices (`spread`: hybrid; parameter_server with strategy.tables=spread), a
    tower's rows of the tables on other devices, (N - 1) / N of them, coming from there and their gradients going
    back (2 (N - 1) R over the towers); else on the parameter device (parameter_server), every tower's rows coming
    from there and going back (2 N R). The owners concatenate and divide their tables' N R rows and apply them, at
    once."""
    r, t = rows.tower_bytes, rows.tables
    if not t:
        return NOTHING
    away, owners = (n - 1, n) if spread else (n, 1)
    return Traffic(reduce_bytes=2 * n * r, reduce_devices=owners, copy_bytes=2 * n * r, moved_bytes=2 * away * r,
                   messages=2 * away * t, ops=t * 5, rows_applied=n * r, rows_devices=owners)


@dataclass(frozen=True)
class Exchange:
    """What a strategy's step moves over a named hardware's links and where it applies its update, per device (the
    network: per node); runner/predict/spec_sheet.py prices it. W is the dense weights' bytes, N the devices of a node.

    Attributes:
        link_bytes: bytes the busiest device sends to other devices of its node per step (as many arrive): a ring
            all-reduce's 2 (N - 1) / N W, a parameter device's (N - 1) W.
        host_bytes: bytes one device sends to the host per step (as many come back): a parameter server on the CPU.
        network_bytes: bytes one node sends to the others per step (as many arrive).
        device_update: full optimizer updates the busiest device applies per step (replicated: 1; sharded: 1 / N).
        device_sums: gradient copies (W bytes each) the busiest device reads to sum them, beyond the update.
        host_update: full updates the host applies per step, and host_sums the gradient copies it sums first.
        messages: transfers one after another on the step's path, each paying a network latency.
    """

    link_bytes: float = 0.0
    host_bytes: float = 0.0
    network_bytes: float = 0.0
    device_update: float = 1.0
    device_sums: float = 0.0
    host_update: float = 0.0
    host_sums: float = 0.0
    messages: int = 0


def ring(devices: int, weight_bytes: float) -> float:
    """Bytes each of `devices` sends in a ring all-reduce of `weight_bytes`: 2 (N - 1) / N W."""
    return 2 * (devices - 1) / devices * weight_bytes


@runtime_checkable
class StrategyOptions(Protocol):
    """A strategy's options, checked before TensorFlow starts (`StrategyBase` gives every member a default)."""

    name: str
    data_parallel: bool  # one tower per device (else one tower, the model split across the devices)
    multi_process: bool  # one process per worker (a cluster), not one process
    loss_scaling: bool  # its step applies `Training.loss_scaling` (validation refuses mixed_float16 without it)

    def towers(self, gpus: int) -> int:
        """Towers (model replicas fed separate batches) on `gpus` devices of this process."""

    def cluster(self) -> Cluster | None:
        """The processes training together (multi-worker), or None for a single process. Raises ConfigError."""

    def check(self, gpus: int, model: Model, jit_compile: bool) -> None:
        """Raise ConfigError (one line) when this strategy cannot run with these devices, model or settings."""

    def check_task(self, spec: Spec) -> None:
        """Raise ConfigError (one line) when this strategy cannot train a model for `spec`'s examples."""

    def table_copies(self, devices: int) -> tuple[float, float]:
        """Copies of the embedding tables' weights and of their optimizer state on `devices` devices, summed."""

    def jit_refusal(self) -> str:
        """Why train.jit_compile cannot XLA-compile its step with these options ("": it can)."""

    def build(self, devices: Devices, training: Training) -> Strategy:
        """The strategy over `devices`, its model and optimizer built under its placement."""

    def peer_wait(self) -> float | None:
        """Seconds `build` may wait for the job's other processes to start (multi-process), or None: no peers."""

    def describe_batch_norm(self) -> str:
        """What it does with batch normalization's batch and moving statistics (the run's `batch_norm` tag)."""

    def exchange(self, devices: int, nodes: int, weight_bytes: float) -> Exchange:
        """What its step moves over a named hardware's links (`devices` on each of `nodes` nodes). Raises
        ConfigError when the spec-sheet cost model does not cover it."""

    def traffic(self, devices: int, weight_bytes: int, variables: int, rows: Rows = NO_ROWS) -> Traffic:
        """Its step's work beyond the towers for dense weights of `weight_bytes` in `variables` variables and
        tables' `rows`. Raises ConfigError when the cost model does not cover it."""


@dataclass
class StrategyBase:
    """What the built-in strategies share: a device range, data or model parallelism, the common checks."""

    name: str = ""

    min_gpus: ClassVar[int] = 1
    max_gpus: ClassVar[int | None] = None
    # The reference every other strategy is compared with (its losses, its rate at one device): one registered
    # strategy has it (`baseline()`)
    baseline: ClassVar[bool] = False
    data_parallel: ClassVar[bool] = True
    multi_process: ClassVar[bool] = False
    no_jit: ClassVar[str] = ""  # `jit_refusal`'s answer ("": XLA compiles each tower's forward and backward)
    loss_scaling: ClassVar[bool] = False
    # What it does with batch normalization (and any non-trainable state a layer updates while training): the
    # `batch_norm` tag of a run whose model has such state, and docs/your-model-your-data.md.
    batch_norm: ClassVar[str] = "batch statistics of the global batch; one copy of the moving statistics"
    # tf_cnn_benchmarks' flags -> the option overrides that make this strategy do the same (`doing`)
    tf_cnn: ClassVar[dict[str, tuple[str, ...]]] = {}
    # The strategy whose step this one runs with the weight update sharded: the bench judges it against that one
    unsharded: ClassVar[type | None] = None

    def describe_batch_norm(self) -> str:
        return self.batch_norm

    def towers(self, gpus: int) -> int:
        return max(gpus, 1) if self.data_parallel else 1

    def cluster(self) -> Cluster | None:
        return None

    def peer_wait(self) -> float | None:
        return None

    def check_task(self, spec: Spec) -> None:
        return None  # data parallelism takes any task: each tower runs the whole model

    def table_copies(self, devices: int) -> tuple[float, float]:
        n = self.towers(devices)
        return n, n

    def traffic(self, devices: int, weight_bytes: int, variables: int, rows: Rows = NO_ROWS) -> Traffic:
        raise ConfigError(f"strategy={self.name} has no cost model (runner/predict/ covers the data-parallel "
                          f"strategies of one process: {', '.join(predictable())})")

    def exchange(self, devices: int, nodes: int, weight_bytes: float) -> Exchange:
        raise ConfigError(f"strategy={self.name} has no spec-sheet cost model (runner/predict/spec_sheet.py covers: "
                          f"{', '.join(on_spec_sheets())})")

    @classmethod
    def takes(cls, gpus: int) -> bool:
        """Whether this strategy runs on `gpus` devices."""
        return cls.min_gpus <= gpus <= (cls.max_gpus if cls.max_gpus is not None else gpus)  # hardware: the most

    def check(self, gpus: int, model: Model, jit_compile: bool) -> None:
        if not self.takes(gpus):
            valid = [s for s in STRATEGIES.names() if STRATEGIES.get(s).takes(gpus)]
            most = self.max_gpus
            shown = f"from {self.min_gpus} to {most}" if most is not None else f"{self.min_gpus} or more"
            raise ConfigError(f"strategy={self.name} needs gpus {shown}, got gpus={gpus}; "
                              f"strategies valid with gpus={gpus}: {', '.join(valid)}")
        if jit_compile is True and self.jit_refusal():
            supported = [s for s in STRATEGIES.names() if not STRATEGIES.get(s).no_jit]
            raise ConfigError(f"train.jit_compile=true cannot compile strategy={self.name}'s step "
                              f"({self.jit_refusal()}); strategies it compiles: {', '.join(supported)}; or "
                              "train.jit_compile=false")

    def jit_refusal(self) -> str:
        return self.no_jit


STRATEGIES = Registry("strategy", __name__)


def baseline() -> str:
    """The registered strategy the others are compared with (`StrategyBase.baseline`: single)."""
    return next(n for n in STRATEGIES.names() if _role(n, "baseline"))


def data_parallel() -> list[str]:
    """The registered strategies of one process that run a tower per device (the bench's and check's grid)."""
    return [n for n in STRATEGIES.names() if _role(n, "data_parallel") and not _role(n, "multi_process")
            and not _role(n, "baseline")]


def tf_cnn_modes() -> dict[str, list[str]]:
    """tf_cnn_benchmarks' modes (its flags), each with the overrides of the registered strategy that does the same
    (`StrategyBase.tf_cnn`), so that no other module spells a strategy's name."""
    return {flags: [f"strategy={name}", *extra] for name in STRATEGIES.names()
            for flags, extra in getattr(STRATEGIES.get(name), "tf_cnn", {}).items()}


def doing(flags: str) -> list[str]:
    """The overrides of the strategy doing what tf_cnn_benchmarks does with `flags`."""
    return tf_cnn_modes()[flags]


def name_of(overrides: list[str]) -> str:
    """The strategy that `overrides` (from `doing`) choose."""
    return overrides[0].removeprefix("strategy=")


def sharding(name: str) -> str:
    """The strategy whose step `name` runs with its weight update sharded ('' for any other)."""
    unsharded = getattr(STRATEGIES.get(name), "unsharded", None)
    return unsharded.name if unsharded else ""


def with_role(role: str) -> list[str]:
    """The registered strategies with a role (`multi_process`, ...), for lines that tell a user which to choose."""
    return [n for n in STRATEGIES.names() if _role(n, role)]


def splitting() -> list[str]:
    """The registered strategies that split one model over the devices instead of copying it."""
    return [n for n in STRATEGIES.names() if not _role(n, "data_parallel") and not _role(n, "baseline")]


def _role(name: str, role: str) -> bool:
    return bool(getattr(STRATEGIES.get(name), role, False))


def predictable() -> list[str]:
    """The registered strategies the cost model covers: those that define their own `traffic`."""
    return [n for n in STRATEGIES.names() if _covers(n, "traffic")]


def on_spec_sheets() -> list[str]:
    """The registered strategies the spec-sheet cost model covers: those that define their own `exchange`."""
    return [n for n in STRATEGIES.names() if _covers(n, "exchange")]


def _covers(name: str, method: str) -> bool:
    """Whether strategy `name` defines its own `method` (a cost model's count of its step)."""
    return getattr(STRATEGIES.get(name), method) is not getattr(StrategyBase, method)
