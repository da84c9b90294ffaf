"""The top-level config (gpus, train, mlflow, sweep) and `validate(cfg) -> Plan`, run before TensorFlow is imported.

Hydra composes the YAML files in `conf/`: one group per component kind, each option extending its component's options
dataclass (the Hydra schema `schema/<kind>/<name>`), plus this module's top level. Every problem is a `ConfigError`
whose message is one line naming the key, the bad value and what is allowed.
"""

from __future__ import annotations

import bisect
import dataclasses
import hashlib
import importlib.resources
import json
import math
import typing
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from hydra.core.config_store import ConfigStore
from omegaconf import DictConfig, OmegaConf

from runner.data_pipelines import DATASETS, PIPELINES, DataError, Spec
from runner.tasks import METRICS, TASKS
from runner.hardware import HARDWARE
from runner.models import MODELS
from runner.errors import ConfigError
from runner.registry import Registry, Rule, non_negative, positive, schema, typed_values
from runner.registry import fields as registry_fields
from runner.strategies import MAX_DEVICES, STRATEGIES

if TYPE_CHECKING:
    from runner.data_pipelines import Dataset, Pipeline
    from runner.models import Model
    from runner.runtime.cluster import Cluster
    from runner.strategies import StrategyOptions

# The configs: the package data `runner.conf` (the repository's conf/, mapped there by pyproject.toml), found the
# same way in a wheel, a `pip install .` and an editable install.
CONF_DIR = Path(str(importlib.resources.files("runner.conf")))
COMPONENTS: dict[str, Registry] = {"model": MODELS, "pipeline": PIPELINES, "strategy": STRATEGIES, "data": DATASETS,
                                   "hardware": HARDWARE}
PRESETS = ("experiment", "debug")  # groups that only set values of the others
GROUPS = (*COMPONENTS, *PRESETS)
OptimizerName = Literal["adam", "adamw", "sgd", "momentum", "rmsprop", "adagrad"]  # built by runner.optimizers.make
# Values an optimizer keeps per weight (slots: adam's m and v; momentum's velocity; rmsprop's mean square; adagrad's
# accumulator; sgd none), and the arrays an update touches per weight (read + written): weight and gradient read,
# weight written, each slot read and written (the floor and the cost models count them).
SLOTS = {"adam": 2, "adamw": 2, "momentum": 1, "rmsprop": 1, "adagrad": 1, "sgd": 0}
TOUCHED = {name: 3 + 2 * slots for name, slots in SLOTS.items()}
ROWS_ONLY = ("adagrad", "sgd")  # those whose update of an embedding table changes only its looked-up rows
MODEL_TARGET = -1.0  # train.target_accuracy: the model's own target accuracy


def table_optimizer(train: Any) -> str:
    """The optimizer that updates the embedding tables: train.table_optimizer, else train.optimizer."""
    return train["table_optimizer"] or train["optimizer"]


@dataclass
class TrainConf:
    """How a run trains and what it measures (`train.<key>=value`)."""

    batch_scaling: Literal["strong", "weak"] = "strong"  # strong: the global batch is fixed; weak: the per-device one
    global_batch_size: int = 128  # examples per step over all devices (strong); derived = per-device x towers (weak)
    per_device_batch_size: int | None = None  # examples per tower per step (weak); derived = global / towers (strong)
    lr_scaling: Literal["none", "linear", "sqrt"] = "none"  # the rule when the global batch changes (x global/ref)
    lr_reference_batch: int = 128  # the global batch `learning_rate` was tuned for
    lr_warmup_steps: int = 0  # linear warm-up to the effective rate over this many steps
    # after warm-up; cosine: down to min_learning_rate at the last step
    lr_schedule: Literal["constant", "cosine"] = "constant"
    min_learning_rate: float = 0.0  # lr_schedule=cosine: the rate at the last step (nanoGPT: learning_rate / 10)
    epochs: float | None = 5  # used when `steps` is null
    steps: int | None = None  # total optimizer steps; overrides epochs
    steps_per_call: int = 50  # steps per compiled tf.function call (fewer Python round trips)
    warmup_calls: int = 1  # compiled calls excluded from timing (tracing, first allocations)
    # momentum: SGD with momentum 0.9; adamw: Adam with decoupled weight decay; sgd and adagrad update an embedding
    # table's looked-up rows only (adam, adamw, momentum and rmsprop update every row of it every step)
    optimizer: OptimizerName = "adam"
    # The embedding tables' own optimizer (plain keras.layers.Embedding; TF Model Garden's ranking models: SGD for the
    # tables, Adam for the rest); null: train.optimizer for every weight
    table_optimizer: OptimizerName | None = None
    table_learning_rate: float | None = None  # table_optimizer's (the same batch rule, schedule); null: learning_rate
    beta2: float = 0.999  # adam, adamw: the second moment's decay (Keras' default; nanoGPT's recipe: 0.99)
    weight_decay: float = 0.0  # adamw: decoupled decay of the weights of 2 or more dimensions (not norms, biases)
    clip_norm: float | None = None  # scale the averaged gradients down to this global norm when above it (null: off)
    # adam(w), momentum: one TensorFlow kernel a variable; every optimizer's variables updated directly, outside
    # tf.distribute (false: Keras' own update)
    fused_optimizer: bool = True
    # BatchNormalization of 4-D channels-last inputs on TensorFlow's fused kernel, the same outputs (false: Keras' ops)
    fused_batch_norm: bool = True
    reuse_freed_memory: bool = True  # glibc: keep freed tensors in the heap (tf.data generator iterators switch it off)
    learning_rate: float = 1e-3  # before the batch rule (lr_scaling) and warm-up
    seed: int = 0  # initial weights, shuffling, dropout, synthetic data
    eval_every: int = 0  # evaluate on the full test set every N steps; 0 = only at the end
    # The test accuracy the run is timed to (time_to_accuracy_seconds); -1: the model's own on MNIST (mlp 0.98, cnn,
    # nin and lenet 0.99), none on other data; null: none.
    target_accuracy: float | None = -1.0
    # The test (validation) loss the run is timed to instead (time_to_loss_seconds): a language model's; null: none.
    target_loss: float | None = None
    # The test AUC the run is timed to instead (time_to_auc_seconds): a click model's (data with a binary label).
    target_auc: float | None = None
    # The test mean absolute error the run is timed to instead (time_to_mae_seconds): a regression's (float labels).
    target_mae: float | None = None
    check_every: int = 0  # steps between accuracy checks on the first check_examples test examples (0: ~20 per run)
    check_examples: int = 1000  # test examples of a check; one at or over the target is confirmed on the full set
    # XLA-compile each tower's forward and backward (the one-device baseline: its whole update); auto: the faster of the
    # two, timed once for the model, batch and device (cached; the run's jit_compile_reason tag says which and why)
    jit_compile: Literal["auto", True, False] = "auto"
    # float32 | mixed_bfloat16 (bfloat16 compute, float32 variables and loss; float32's range) | mixed_float16
    # (float16 compute with dynamic loss scaling: GPUs' tensor cores from V100 and T4 on)
    precision: Literal["float32", "mixed_bfloat16", "mixed_float16"] = "float32"
    loss_scale: float = 32768.0  # mixed_float16: the starting loss scale; halved on a non-finite gradient (skipped)
    loss_scale_period: int = 2000  # mixed_float16: finite steps in a row after which the loss scale doubles
    measure_input: bool = True  # after training, time the input pipeline alone and flag input-bound runs
    probe_peak: bool = True  # measure the device's matmul peak once per machine (cached) to log MFU
    # after training, time a lower bound of the step (runner/measure/floor.py): step_time_over_floor
    probe_floor: bool = False
    predict: bool = True  # after training, log the cost model's prediction for this combination (runner/predict/)
    profile: bool = False  # trace the first timed call with TensorFlow's profiler; log op time (spans) per op kind
    intra_op_threads: int = -1  # threads per op; -1 auto: cores / devices on simulated CPU devices, else TF's default
    inter_op_threads: int = 0  # ops run at once; 0: TensorFlow's default (one per core)
    checkpoint_every: int = 1000  # save model, optimizer and step every N steps; a restart of the config resumes
    checkpoint_dir: str = "checkpoints"  # under the launch dir, one folder per config hash; deleted when finished

    RULES: ClassVar[dict[str, Rule]] = {
        "global_batch_size": (positive, "a positive integer"),
        "per_device_batch_size": (positive, "a positive integer or null"),
        "lr_reference_batch": (positive, "a positive integer"),
        "lr_warmup_steps": (non_negative, "0 or a positive number of steps"),
        "intra_op_threads": (lambda v: v >= -1, "-1 (auto), 0 (TensorFlow's default) or a positive integer"),
        "inter_op_threads": (non_negative, "0 (TensorFlow's default) or a positive integer"),
        "epochs": (lambda v: v is None or 0 < v < math.inf, "a positive finite number or null"),
        "seed": (lambda v: 0 <= v < 2**32, f"an integer from 0 to {2**32 - 1} (TensorFlow's seed range)"),
        "steps": (positive, "a positive integer or null"),
        "steps_per_call": (positive, "a positive integer"),
        "warmup_calls": (non_negative, "0 or a positive integer"),
        "learning_rate": (lambda v: 0 < v < math.inf, "a positive finite number"),
        "table_learning_rate": (lambda v: v is None or 0 < v < math.inf, "a positive finite number or null"),
        "min_learning_rate": (lambda v: 0 <= v < math.inf, "0 or a positive finite number"),
        "beta2": (lambda v: 0 < v < 1, "a number between 0 and 1"),
        "weight_decay": (lambda v: 0 <= v < math.inf, "0 or a positive finite number"),
        "clip_norm": (lambda v: v is None or 0 < v < math.inf, "a positive finite number or null"),
        "eval_every": (non_negative, "0 (end only) or a positive number of steps"),
        "checkpoint_every": (non_negative, "0 (no checkpoints) or a positive number of steps"),
        "target_accuracy": (lambda v: v is None or v == MODEL_TARGET or 0 < v <= 1,
                            f"a test accuracy in (0, 1], {MODEL_TARGET:g} (the model's own) or null (none)"),
        "target_loss": (lambda v: v is None or 0 < v < math.inf, "a positive finite test loss or null (none)"),
        "target_auc": (lambda v: v is None or 0.5 < v <= 1, "a test AUC in (0.5, 1] or null (none)"),
        "target_mae": (lambda v: v is None or 0 < v < math.inf, "a positive finite test MAE or null (none)"),
        "check_every": (non_negative, "0 (about 20 checks per run) or a positive number of steps"),
        "check_examples": (positive, "a positive number of test examples"),
        "loss_scale": (lambda v: 1 <= v < math.inf, "a finite number from 1 (2**15 is Keras' start)"),
        "loss_scale_period": (positive, "a positive number of steps"),
    }


@dataclass
class MlflowConf:
    """Where runs are logged (`mlflow.<key>=value`)."""

    tracking_uri: str | None = None  # null: $MLFLOW_TRACKING_URI, else sqlite:///<launch dir>/mlflow.db
    experiment: str = "runner"  # the MLflow experiment (debug=smoke and the presets set their own)
    system_metrics_interval: float = 10.0  # seconds between MLflow's system-metrics samples (CPU, memory, GPU); 0: off
    # at the run's end, seconds to keep trying a store that cannot be written (a server restarting) before the error
    # line names the run's journal and `runner replay`
    final_wait: float = 30.0

    RULES: ClassVar[dict[str, Rule]] = {
        "experiment": (lambda v: bool(v.strip()) and v == v.strip() and "/" not in v,
                       "a non-empty name without leading or trailing spaces or '/'"),
        "system_metrics_interval": (non_negative, "0 (off) or a positive number of seconds"),
        "final_wait": (lambda v: 0 <= v < math.inf, "0 (one try) or a finite number of seconds"),
    }


@dataclass
class SweepConf:
    """Multirun (`-m`) settings."""

    resume: bool = False  # skip combinations that already have a FINISHED run of the same config
    # Runs of each combination, in interleaved rounds (every combination once, then again), so that the verdict
    # can tell a margin from the noise between runs; `-m` only.
    repeats: int = 1
    round: int = 0  # set by the sweep for each job (0 to repeats - 1); part of the config hash from round 1 on
    only_top: int = 0  # run only the K combinations `runner predict` ranks fastest (0: all); the rest are listed

    RULES: ClassVar[dict[str, Rule]] = {
        "repeats": (positive, "a positive number of runs per combination"),
        "round": (non_negative, "0 or a positive round number (the sweep sets it from sweep.repeats)"),
        "only_top": (non_negative, "0 (every combination) or a positive number of predicted-fastest combinations"),
    }


@dataclass
class Config:
    """The top level; the component groups are typed by their own options classes."""

    model: Any = None
    pipeline: Any = None
    strategy: Any = None
    data: Any = None
    hardware: Any = None  # what `runner predict` prices (a spec sheet); runs train on this machine (`this`)
    train: TrainConf = field(default_factory=TrainConf)
    mlflow: MlflowConf = field(default_factory=MlflowConf)
    sweep: SweepConf = field(default_factory=SweepConf)
    # Devices to train on. 0 = the host CPU alone; N >= 1 = N real GPUs when the machine has them, otherwise N
    # simulated (logical) devices carved out of one GPU or the CPU (logged and recorded as simulated). With a named
    # hardware (runner predict): its devices, over as many nodes as they fill.
    gpus: int = 1

    RULES: ClassVar[dict[str, Rule]] = {  # the most: the hardware's (this machine: MAX_DEVICES)
        "gpus": (lambda v: v is not None, f"an integer from 0 to {MAX_DEVICES}"),  # the range: hardware.check_devices
    }


ConfigStore.instance().store(name="schema", node=schema(Config))  # conf/config.yaml extends it
for _registry in COMPONENTS.values():
    _registry.discover()  # each built-in component stores its own schema


@dataclass(frozen=True)
class Plan:
    """A validated config and what follows from it, computed once."""

    cfg: DictConfig  # the resolved config, read-only, every option filled in: what is logged and hashed
    model: Model
    pipeline: Pipeline
    strategy: StrategyOptions
    data: Dataset
    spec: Spec  # the data's examples (input shape, dtype, classes): what the model is built for
    cluster: Cluster | None  # the processes of a multi-worker job, else None
    config_hash: str  # what the run computes (tracking, sweep and checkpoint settings excluded): the resume key
    hardware: Any = None  # runner.hardware's This or a SpecSheet

    @property
    def train(self) -> Any:
        return self.cfg.train

    @property
    def gpus(self) -> int:
        return int(self.cfg.gpus)

    @property
    def local_towers(self) -> int:
        """Towers in this process: one per device for a data-parallel strategy, else one."""
        return self.strategy.towers(self.gpus)


HYDRA_GROUPS = ("hydra/launcher", "hydra/sweeper")  # Hydra's own groups a user picks on the command line


def group_options(group: str, extra_dirs: tuple[Path, ...] = ()) -> list[str]:
    """The options of a config group: the YAML files in `conf/<group>/` and in `<dir>/<group>/` of each extra config
    directory (`--config-dir`, `hydra.searchpath`); for Hydra's own groups, also those its plugins register."""
    names = {p.stem for folder in (CONF_DIR, *extra_dirs) for p in (folder / group).glob("*.yaml")}
    if group in HYDRA_GROUPS:
        from hydra.core.plugins import Plugins

        Plugins.instance()  # registers the installed plugins' configs
        names |= {n.removesuffix(".yaml") for n in ConfigStore.instance().list(group)}
    return sorted(names)


def allowed(key: str) -> str | None:
    """What a top-level key allows (`gpus`, `train.seed`, ...), from its Literal choices or its rule."""
    cls, *path = [Config, *key.split(".")]
    for name in path[:-1]:
        cls = registry_fields(cls).get(name)
        if not dataclasses.is_dataclass(cls):
            return None
    if rule := getattr(cls, "RULES", {}).get(path[-1]):
        return rule[1]
    choices = typing.get_args(registry_fields(cls).get(path[-1]))  # () where it has none
    return f"one of: {', '.join(map(str, choices))}" if choices and all(isinstance(c, str) for c in choices) else None


# What changes nothing a run computes: where it is logged, swept and predicted, where and how often it saves, which
# worker of its cluster a process is and where the workers are (every worker of a job finds the chief's checkpoints,
# and a requeued job on other nodes resumes); as prefixes of dotted keys (a group's, with its dot: every key in it),
# one or two levels deep
UNCOMPUTED = ("mlflow.", "sweep.", "hardware.", "train.checkpoint_every", "train.checkpoint_dir", "strategy.workers",
              "strategy.task_index")
# What repeats of the same work may differ in: the seed, a worker's place in its cluster
REPEATS = ("train.seed", "strategy.workers", "strategy.task_index")


def config_hash(cfg: DictConfig) -> str:
    """A stable hash of what a run computes: the resolved config without what is `UNCOMPUTED`."""
    data = OmegaConf.to_container(cfg, resolve=True)
    repeat = data.get("sweep", {}).get("round", 0)
    for key in UNCOMPUTED:
        group, _, name = key.rstrip(".").partition(".")
        if name:
            data.get(group, {}).pop(name, None)
        else:
            data.pop(group, None)
    if repeat:  # a repeat is a run of its own (checkpoints, resume), round 0 the same config as a single run
        data["round"] = repeat
    return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()[:16]


def _resolve_batch(train: dict[str, Any], towers: int, where: str) -> None:
    """Fill in the batch size the scaling mode derives: strong fixes the global batch, weak the per-device one."""
    derived = train["global_batch_size"] // towers
    if train["batch_scaling"] == "strong" and train["per_device_batch_size"] not in (None, derived):
        raise ConfigError(
            f"train.per_device_batch_size={train['per_device_batch_size']} is derived under strong scaling "
            f"(train.global_batch_size={train['global_batch_size']} over {towers} towers); set "
            "train.global_batch_size instead, or train.batch_scaling=weak to fix the per-device batch"
        )
    if train["batch_scaling"] == "weak":
        if train["per_device_batch_size"] is None:
            raise ConfigError("train.batch_scaling=weak needs train.per_device_batch_size (a positive integer)")
        train["global_batch_size"] = train["per_device_batch_size"] * towers
        return
    if train["global_batch_size"] % towers:
        raise ConfigError(
            f"train.global_batch_size={train['global_batch_size']} is not divisible by the {towers} towers "
            f"of {where} (strong scaling); use a multiple of {towers}"
        )
    train["per_device_batch_size"] = train["global_batch_size"] // towers


def compose(overrides: list[str]) -> DictConfig:
    """The project's config composed through Hydra's compose API, as @hydra.main would (a user's config folders come
    as `hydra.searchpath=[file://...]`): for `runner check` and the tests, which compose outside a Hydra run."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return hydra_compose(config_name="config", overrides=list(overrides))


def validate(cfg: DictConfig, priced: bool = False) -> Plan:
    """Check a composed config and return its plan (the resolved, read-only config, the component objects and the
    derived facts); a ConfigError names the first bad key, its value and what is allowed. A plan to train is on this
    machine: a spec sheet's hardware only with `priced` (runner predict)."""
    container = OmegaConf.to_container(cfg, resolve=True)  # gpus, train, mlflow and sweep typed and checked
    values = {**typed_values(Config, {k: v for k, v in container.items() if k not in COMPONENTS}, ""),
              **{k: container.get(k) for k in COMPONENTS}}  # the component nodes as they were composed
    parts = {kind: registry.options(values[kind] or {}) for kind, registry in COMPONENTS.items()}
    strategy, gpus, hardware = parts["strategy"], values["gpus"], parts["hardware"]
    if not (priced or hardware.measured):  # else a CPU run would be recorded as on the spec sheet's devices
        raise ConfigError(f"hardware={hardware.name} is a spec sheet that `runner predict` prices; a run trains on "
                          f"this machine: drop hardware={hardware.name}, or predict with `runner predict "
                          f"hardware={hardware.name} ...`")
    hardware.check_devices(gpus, strategy.multi_process)
    strategy.check(gpus, parts["model"], values["train"]["jit_compile"])
    # float16 trains only where the strategy's step scales the loss (small gradients would round to zero)
    if values["train"]["precision"] == "mixed_float16" and not strategy.loss_scaling:
        raise ConfigError(f"train.precision=mixed_float16 needs loss scaling in the step and strategy="
                          f"{strategy.name} does not apply it (StrategyBase.loss_scaling); use train.precision=float32 "
                          "or mixed_bfloat16")
    _check_optimizer(values["train"])
    # A named hardware's nodes are its cluster: `gpus` counts the devices of all of them
    cluster = strategy.cluster() if hardware.measured else None
    towers = strategy.towers(gpus) * (cluster.count if cluster else 1)
    _resolve_batch(values["train"], towers, f"strategy={strategy.name} gpus={gpus}")
    try:  # first: data that cannot say what it is cannot say how much of it there is
        spec = parts["data"].spec()
    except DataError as e:  # a missing path, an unprepared dataset
        raise ConfigError(str(e)) from None
    if not isinstance(spec, Spec):  # a user's dataset: every later check and the model's build read a Spec
        raise ConfigError(f"data={parts['data'].name}: spec() returned a {type(spec).__name__}, not a "
                          "runner.data_pipelines.Spec (e.g. Spec(shape=(28, 28, 1), classes=10))")
    parts["pipeline"].check(towers, parts["data"].train_examples())
    parts["model"].check(spec)
    strategy.check_task(spec)
    _resolve_target(values["train"], parts, spec)
    if hardware.measured:  # a spec sheet's memory is checked per device by the prediction (runner/predict/)
        _check_tables(values["train"], parts["model"], spec, strategy, gpus)
        _check_memory(values["train"], parts["model"], parts["data"], spec, towers)
    resolved = OmegaConf.create({**values, **{kind: _as_node(part, values[kind]) for kind, part in parts.items()}})
    OmegaConf.set_readonly(resolved, True)
    return Plan(resolved, parts["model"], parts["pipeline"], strategy, parts["data"], spec, cluster,
                config_hash(resolved), hardware)


def _resolve_target(train: dict, parts: dict, spec: Spec) -> None:
    """One target, train.target_<metric>, of a metric the data's task has (runner/tasks.py: its loss and metrics);
    train.target_accuracy=-1 is the model's own, which is an MNIST accuracy (null elsewhere, or beside another)."""
    given = [f"target_{m}" for m in METRICS if train.get(f"target_{m}") not in (None, MODEL_TARGET)]
    if len(given) > 1:
        raise ConfigError(f"train.{given[0]}={train[given[0]]} and train.{given[1]}={train[given[1]]} are two "
                          "targets; a run is timed to one: set the other to null")
    allowed = [f"train.target_{m.name}" for m in spec.task.targets]
    if given and (metric := given[0].removeprefix("target_")) not in [m.name for m in spec.task.targets]:
        owners = [f"{t.labels_dtype} labels ({t.said.format(classes='N')})" for t in TASKS.values()
                  if metric in [m.name for m in t.targets] and not t.per_position]
        raise ConfigError(f"train.{given[0]}={train[given[0]]}: data={parts['data'].name} gives {spec}, whose runs "
                          f"are timed to {' or '.join(allowed)}" + (f"; {metric} is timed on data with "
                                                                    f"{' or '.join(owners)}" if owners else ""))
    if given:
        train["target_accuracy"] = train["target_accuracy"] if given[0] == "target_accuracy" else None
    elif train["target_accuracy"] == MODEL_TARGET:
        own = parts["model"].target_accuracy
        train["target_accuracy"] = own if parts["data"].name == "mnist" else None


def _check_optimizer(train: dict[str, Any]) -> None:
    """Settings that only one optimizer or schedule reads are refused elsewhere, not silently ignored."""
    if train["weight_decay"] and "adamw" not in (train["optimizer"], train["table_optimizer"]):
        raise ConfigError(f"train.weight_decay={train['weight_decay']} applies to train.optimizer=adamw only, "
                          f"not {train['optimizer']}; set train.optimizer=adamw or train.weight_decay=0")
    if train["table_learning_rate"] is not None and train["table_optimizer"] is None:
        raise ConfigError(f"train.table_learning_rate={train['table_learning_rate']} is the rate of "
                          "train.table_optimizer, which is null (the tables share train.optimizer and its "
                          "train.learning_rate); set train.table_optimizer (e.g. sgd) or "
                          "train.table_learning_rate=null")
    if train["lr_schedule"] == "cosine" and not train["steps"]:
        raise ConfigError("train.lr_schedule=cosine decays to train.min_learning_rate at the last step: it needs "
                          "train.steps (not train.epochs)")
    if train["min_learning_rate"] > train["learning_rate"]:
        raise ConfigError(f"train.min_learning_rate={train['min_learning_rate']} is above train.learning_rate="
                          f"{train['learning_rate']}; use a value from 0 to it")


def memory_estimate(train: dict[str, Any], model: Any, spec: Spec, towers: int) -> tuple[int, int]:
    """Bytes a config needs at least: (input batches, activations). The input pipeline holds a few global batches
    (the one being made, the prefetched, the step's); each tower keeps its batch's layer outputs for the backward
    pass and computes as many gradients (x2). Weights are left out; a model that cannot say its activations counts
    as none (the estimate is a floor, meant to refuse the impossible, not to fit tightly)."""
    inputs = 3 * train["global_batch_size"] * spec.input_bytes
    per_example = model.activations_per_example(spec) or 0
    return inputs, 2 * towers * train["per_device_batch_size"] * per_example * 4


def _check_tables(train: dict[str, Any], model: Any, spec: Spec, strategy: Any, gpus: int) -> None:
    """Refuse embedding tables that do not fit: their weights and optimizer state, times the copies the strategy
    keeps (on simulated devices every copy is in this host's memory), in one line with each strategy's need."""
    from runner.runtime.devices import memory_bytes

    table = model.table_bytes(spec)
    if not table:
        return
    slots, gb = SLOTS[table_optimizer(train)], 1 << 30

    def need(s: Any) -> float:
        weights, state = s.table_copies(gpus)
        return table * (weights + slots * state)

    available = memory_bytes()
    if need(strategy) <= available:
        return
    # every strategy that could train this task on these devices, and what it would need
    needs = {n: need(STRATEGIES.get(n)()) for n in STRATEGIES.names()
             if STRATEGIES.get(n).takes(gpus) and not refuses(STRATEGIES.get(n)().check_task, spec)}
    fitting = [n for n, bytes_ in needs.items() if bytes_ <= available]
    each = ", ".join(f"{n} {bytes_ / gb:,.1f}" for n, bytes_ in needs.items())
    raise ConfigError(
        f"model={model.name}'s embedding tables are {table / gb:,.1f} GiB ({table:,} bytes) and train."
        f"{'table_' if train['table_optimizer'] else ''}optimizer={table_optimizer(train)} keeps {slots} slot(s) per "
        f"weight: strategy={strategy.name} gpus={gpus} needs "
        f"{need(strategy) / gb:,.1f} GiB, this machine has {available / gb:,.1f} GiB (GiB at gpus={gpus}: {each}); "
        + (f"use strategy={' or '.join(fitting)}" if fitting else "use smaller tables (data.tables, "
           "data.vocabulary_sizes) or a cluster")
    )


def refuses(check: Callable[[Spec], None], spec: Spec) -> bool:
    """Whether a component's `check` (a strategy's check_task, a model's check) refuses `spec`."""
    try:
        check(spec)
    except ConfigError:
        return True
    return False


def _check_memory(train: dict[str, Any], model: Any, data: Dataset, spec: Spec, towers: int) -> None:
    """Refuse a config whose data and batches cannot fit in this machine's memory (they would grow until it runs
    out)."""
    from runner.runtime.devices import memory_bytes

    held = data.in_memory_bytes()
    inputs, activations = memory_estimate(train, model, spec, towers)
    available, gb = memory_bytes(), 1 << 30
    if held > available:
        raise ConfigError(
            f"data={data.name} holds {held / gb:,.1f} GiB of {spec} in memory, this machine has "
            f"{available / gb:,.1f} GiB; lower data.train_limit and data.test_limit"
        )
    if held + inputs + activations <= available:
        return
    need = (f"train.global_batch_size={train['global_batch_size']} needs at least {(inputs + activations) / gb:,.1f} "
            f"GiB ({inputs / gb:,.1f} GiB of input batches, {activations / gb:,.1f} GiB of activations for model="
            f"{model.name}), this machine has {available / gb:,.1f} GiB")
    if not spec.token_ids:
        raise ConfigError(f"{need}; use a smaller batch")
    raise ConfigError(_sequence_advice(train, model, data, spec, towers, available - held, need))


def _sequence_advice(train: dict[str, Any], model: Any, data: Dataset, spec: Spec, towers: int, room: int,
                     need: str) -> str:
    """What to change when token sequences do not fit in `room` bytes: the batch, if one example per tower fits;
    else the sequence length (the context the model is built for: a GPT's position embedding and attention span),
    the longest that fits at this batch; or, where not even one token does, the vocabulary (a language model's
    logits for each id at every position), the largest that fits."""
    length, gb = spec.shape[0], 1 << 30

    def needed(spec_: Spec, per_device: int = train["per_device_batch_size"]) -> int:
        batch = {**train, "global_batch_size": per_device * towers, "per_device_batch_size": per_device}
        return sum(memory_estimate(batch, model, spec_, towers))

    longest = _largest(lambda n: needed(dataclasses.replace(spec, shape=(n,))) <= room, length)
    keyed = getattr(data, "sequence_length", None) == length  # the length is this key's value (not a file's rows)
    shorter = f"data.sequence_length={longest} or less" if keyed else f"sequences of {longest:,} tokens or fewer"
    if needed(spec, 1) <= room:
        return f"{need}; use a smaller batch" + (f" or {shorter} (what fits at this batch)" if longest else "")
    source = f"data.sequence_length={length}" if keyed else data.describe()
    said = (f"sequences of {length:,} token ids below {spec.vocabulary:,} ({source}), the context model="
            f"{model.name} is built for, need {needed(spec, 1) / gb:,.1f} GiB at one example per tower, this machine "
            f"has {room / gb:,.1f} GiB: no batch fits them")
    if longest:
        return f"{said}; use {shorter} (what fits at train.global_batch_size={train['global_batch_size']})"
    if spec.target != "next_token":
        return f"{said}, nor one token at this batch"
    widest = _largest(lambda v: needed(dataclasses.replace(spec, classes=v, vocabulary=v)) <= room, spec.vocabulary)
    return (f"{said}, nor one token at this batch: a vocabulary of {spec.vocabulary:,} ids is too large (logits for "
            f"each at every position); {widest:,} at the most fit at this length and batch: number the distinct ids 0 "
            "to n - 1, or use a smaller data.vocabulary_size")


def _largest(fits: Callable[[int], bool], high: int) -> int:
    """The largest n from 1 to `high` for which `fits(n)` (false for every n above one that is false), else 0: a
    binary search for the first n that does not fit."""
    return bisect.bisect_left(range(1, high + 1), True, key=lambda n: not fits(n))


def _as_node(part: Any, composed: Any) -> dict[str, Any]:
    """A component's options as config values (its own `as_config()` where it spells them otherwise than its
    fields); a user's component keeps its `_target_`."""
    node = part.as_config() if hasattr(part, "as_config") else dataclasses.asdict(part)
    if composed is not None and "_target_" in composed:
        node = {"_target_": composed["_target_"], **node}
    return node
