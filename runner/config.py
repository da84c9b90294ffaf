"""The config schema and `validate(cfg)`: every allowed value lives here, checked before TensorFlow is imported.

Hydra composes the YAML files in `conf/`; `validate` then checks the composed config against the dataclasses
below (types, unknown keys) and against the ranges and choices in `_RULES` and `allowed_choices`. Every problem is
raised as a `ConfigError` whose message is one line naming the key, the bad value and what is allowed.
"""

from __future__ import annotations

import math
import pkgutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

CONF_DIR = Path(__file__).resolve().parent.parent / "conf"
GROUPS = ("model", "pipeline", "strategy", "data", "experiment", "debug")
OPTIMIZERS = ("adam", "sgd", "momentum", "rmsprop")
CROSS_DEVICE_OPS = ("auto", "tensorflow", "nccl", "hierarchical_copy", "reduce_to_one_device")
MAX_DEVICES = 16
MODEL_PARALLEL_SPLITS = ("auto", "width", "stages", "two_tower")
COMMUNICATIONS = ("auto", "ring", "nccl")
# mixed_float16 is not offered: float16 needs loss scaling in every strategy's step; bfloat16 has float32's range.
PRECISIONS = ("float32", "mixed_bfloat16")


class ConfigError(ValueError):
    """A config value is wrong; the message is one line naming the key, the value and what is allowed."""


@dataclass
class ModelConf:
    name: str = "mlp"
    variant: str = "default"


@dataclass
class PipelineConf:
    name: str = "split"
    shuffle_buffer: int = 10000
    prefetch: int = -1
    map_parallelism: int = -1
    private_threads: int = 0
    device_buffer: int = 2


@dataclass
class StrategyConf:
    name: str = "single"
    cross_device_ops: str = "auto"
    input: str = "towers"  # strategy=mirrored: towers (the pipeline's own feed) | distribute (tf.distribute's API)
    ps_device: str = "cpu"
    split: str = "auto"  # strategy=model_parallel: auto | width | stages | two_tower
    workers: list[str] = field(default_factory=list)  # strategy=multi_worker: host:port of every worker
    task_index: int = 0  # strategy=multi_worker: this process's index in `workers`
    communication: str = "auto"  # strategy=multi_worker: collective implementation


@dataclass
class DataConf:
    name: str = "mnist"
    path: Optional[str] = None
    cache_dir: Optional[str] = None
    train_limit: Optional[int] = None
    test_limit: Optional[int] = None
    allow_download: bool = True
    allow_npm: bool = True


@dataclass
class TrainConf:
    batch_scaling: str = "strong"
    global_batch_size: int = 128
    per_device_batch_size: Optional[int] = None
    lr_scaling: str = "none"
    lr_reference_batch: int = 128
    lr_warmup_steps: int = 0
    epochs: Optional[float] = 5
    steps: Optional[int] = None
    steps_per_call: int = 50
    warmup_calls: int = 1
    optimizer: str = "adam"
    fused_optimizer: bool = True
    reuse_freed_memory: bool = True
    learning_rate: float = 1e-3
    seed: int = 0
    eval_every: int = 0
    jit_compile: bool = False
    precision: str = "float32"
    measure_input: bool = True
    probe_peak: bool = True
    profile: bool = False
    intra_op_threads: int = -1
    inter_op_threads: int = 0
    checkpoint_every: int = 1000
    checkpoint_dir: str = "checkpoints"


@dataclass
class MlflowConf:
    tracking_uri: Optional[str] = None
    experiment: str = "runner"


@dataclass
class SweepConf:
    resume: bool = False


@dataclass
class Config:
    model: ModelConf = field(default_factory=ModelConf)
    pipeline: PipelineConf = field(default_factory=PipelineConf)
    strategy: StrategyConf = field(default_factory=StrategyConf)
    data: DataConf = field(default_factory=DataConf)
    train: TrainConf = field(default_factory=TrainConf)
    mlflow: MlflowConf = field(default_factory=MlflowConf)
    sweep: SweepConf = field(default_factory=SweepConf)
    gpus: int = 1


def group_options(group: str) -> list[str]:
    """The options of a config group: the YAML files in `conf/<group>/`."""
    return sorted(p.stem for p in (CONF_DIR / group).glob("*.yaml"))


def _modules(package: str) -> list[str]:
    """Public module names of a package, found without importing them (so without importing TensorFlow)."""
    path = Path(__file__).resolve().parent.parent / package
    return sorted(m.name for m in pkgutil.iter_modules([str(path)]) if not m.name.startswith("_"))


def model_variants(model: str) -> list[str]:
    """Variant names of a model module (its VARIANTS table; the module imports no TensorFlow at top level)."""
    import importlib

    return sorted(importlib.import_module(f"models.{model}").VARIANTS)


def allowed_choices() -> dict[str, list[str]]:
    """The allowed values of every name-like key; the single source the errors and the README quote."""
    from runner.strategies import STRATEGIES

    pipelines = [p for p in group_options("pipeline") if p in _modules("data_pipelines")]
    return {
        "model.name": _modules("models"),
        "pipeline.name": pipelines,
        "strategy.name": sorted(STRATEGIES),
        "strategy.cross_device_ops": list(CROSS_DEVICE_OPS),
        "strategy.input": ["towers", "distribute"],
        "strategy.ps_device": ["cpu", "first_device"],
        "strategy.split": list(MODEL_PARALLEL_SPLITS),
        "strategy.communication": list(COMMUNICATIONS),
        "data.name": ["mnist", "synthetic"],
        "train.optimizer": list(OPTIMIZERS),
        "train.batch_scaling": ["strong", "weak"],
        "train.lr_scaling": ["none", "linear", "sqrt"],
        "train.precision": list(PRECISIONS),
    }


def _positive(v: Any) -> bool:
    return v is None or v > 0


def _non_negative(v: Any) -> bool:
    return v is None or v >= 0


# key -> (check, what is allowed): range rules for numbers.
_RULES: dict[str, tuple[Callable[[Any], bool], str]] = {
    "gpus": (lambda v: 0 <= v <= MAX_DEVICES, f"an integer from 0 to {MAX_DEVICES}"),
    "train.global_batch_size": (_positive, "a positive integer"),
    "train.per_device_batch_size": (_positive, "a positive integer or null"),
    "train.lr_reference_batch": (_positive, "a positive integer"),
    "train.lr_warmup_steps": (_non_negative, "0 or a positive number of steps"),
    "train.intra_op_threads": (lambda v: v >= -1, "-1 (auto), 0 (TensorFlow's default) or a positive integer"),
    "train.inter_op_threads": (_non_negative, "0 (TensorFlow's default) or a positive integer"),
    "train.epochs": (_positive, "a positive number or null"),
    "train.steps": (_positive, "a positive integer or null"),
    "train.steps_per_call": (_positive, "a positive integer"),
    "train.warmup_calls": (_non_negative, "0 or a positive integer"),
    "train.learning_rate": (lambda v: 0 < v < math.inf, "a positive finite number"),
    "train.eval_every": (_non_negative, "0 (end only) or a positive number of steps"),
    "train.checkpoint_every": (_non_negative, "0 (no checkpoints) or a positive number of steps"),
    "pipeline.shuffle_buffer": (_non_negative, "0 (no shuffle) or a positive integer"),
    "pipeline.prefetch": (lambda v: v >= -1, "-1 (AUTOTUNE), 0 or a positive integer"),
    "pipeline.map_parallelism": (lambda v: v == -1 or v > 0, "-1 (AUTOTUNE) or a positive integer"),
    "pipeline.private_threads": (_non_negative, "0 (shared pool) or a positive integer"),
    "pipeline.device_buffer": (_positive, "a positive number of batches"),
    "data.train_limit": (_positive, "a positive integer or null"),
    "data.test_limit": (_positive, "a positive integer or null"),
}


def _typed(cfg: DictConfig) -> DictConfig:
    """Merge cfg onto the schema: wrong types and unknown keys become one-line ConfigErrors."""
    schema = OmegaConf.structured(Config)
    try:
        return OmegaConf.merge(schema, cfg)
    except OmegaConfBaseException as e:
        key = getattr(e, "full_key", None) or "config"
        msg = str(getattr(e, "msg", e)).splitlines()[0]
        raise ConfigError(f"{key}: {msg}") from None


def _check_rules(cfg: DictConfig) -> None:
    for key, (ok, allowed) in _RULES.items():
        value = OmegaConf.select(cfg, key)
        if not ok(value):
            raise ConfigError(f"{key}={value!r} is not allowed; expected {allowed}")


def _check_choices(cfg: DictConfig) -> None:
    for key, allowed in allowed_choices().items():
        value = OmegaConf.select(cfg, key)
        if value not in allowed:
            raise ConfigError(f"{key}={value!r} is not allowed; choose one of: {', '.join(allowed)}")
    variants = model_variants(cfg.model.name)
    if cfg.model.variant not in variants:
        raise ConfigError(
            f"model.variant={cfg.model.variant!r} is not a variant of model {cfg.model.name!r}; "
            f"choose one of: {', '.join(variants)}"
        )


def towers(cfg: DictConfig) -> int:
    """How many towers (model replicas fed separate batches) the config's strategy runs, over all its workers."""
    from runner import cluster
    from runner.strategies import STRATEGIES

    workers = cluster.from_config(cfg)
    return STRATEGIES[cfg.strategy.name].towers(max(cfg.gpus, 1)) * (workers.count if workers else 1)


def _resolve_batch(cfg: DictConfig) -> None:
    """Fill in the batch size the scaling mode derives: strong fixes the global batch, weak the per-device one."""
    train, n = cfg.train, towers(cfg)
    if train.batch_scaling == "weak":
        if train.per_device_batch_size is None:
            raise ConfigError("train.batch_scaling=weak needs train.per_device_batch_size (a positive integer)")
        train.global_batch_size = train.per_device_batch_size * n
        return
    if train.global_batch_size % n:
        raise ConfigError(
            f"train.global_batch_size={train.global_batch_size} is not divisible by the {n} towers "
            f"of strategy={cfg.strategy.name} gpus={cfg.gpus} (strong scaling); use a multiple of {n}"
        )
    train.per_device_batch_size = train.global_batch_size // n


def _check_combination(cfg: DictConfig) -> None:
    """Cross-key rules: what one key allows depends on another."""
    from runner.strategies import STRATEGIES

    STRATEGIES[cfg.strategy.name].check(cfg)
    _resolve_batch(cfg)
    if cfg.train.jit_compile and cfg.strategy.name != "single":
        raise ConfigError(
            f"train.jit_compile=true is supported by strategy=single only, not strategy={cfg.strategy.name}"
        )
    _check_model_parallel(cfg)


def _check_model_parallel(cfg: DictConfig) -> None:
    """strategy=model_parallel: the split must suit the model and the number of devices."""
    import importlib

    if cfg.strategy.name != "model_parallel":
        return
    split, model, variant = cfg.strategy.split, cfg.model.name, cfg.model.variant
    if split == "auto":  # the rule of runner.strategies.model_parallel.resolve_split, kept here without TensorFlow
        split = "width" if model == "mlp" else "stages"
    named = split if split == cfg.strategy.split else f"auto (= {split} for model={model})"
    if split == "width" and model != "mlp":
        raise ConfigError(
            f"strategy.split=width is not allowed with model={model}: width splits Dense layers and only mlp is all "
            f"Dense; with model={model} choose one of: auto, stages, two_tower"
        )
    layers = importlib.import_module(f"models.{model}").weighted_layers(variant)
    if split == "stages" and cfg.gpus > layers:
        others = "width, two_tower" if model == "mlp" else "two_tower"
        raise ConfigError(
            f"strategy.split={named} with gpus={cfg.gpus} needs at least {cfg.gpus} layers with weights, "
            f"model={model} variant={variant} has {layers}; use gpus from 2 to {layers}, or strategy.split: {others}"
        )


def validate(cfg: DictConfig) -> DictConfig:
    """Check a composed config and return it typed (schema defaults filled in).

    Args:
        cfg: the config Hydra composed.

    Returns:
        The config merged onto the schema, read-only.

    Raises:
        ConfigError: one line naming the first bad key, its value and what is allowed.
    """
    typed = _typed(cfg)
    _check_rules(typed)
    _check_choices(typed)
    _check_combination(typed)
    OmegaConf.set_readonly(typed, True)
    return typed


def validated_or_none(cfg: DictConfig) -> DictConfig | None:
    """`validate(cfg)`, or None when the config is invalid (the caller lets the run itself report why)."""
    try:
        return validate(cfg)
    except ConfigError:
        return None
