"""`settings`: each speed setting users expect, its values side by side as ratios to the group's default."""

from __future__ import annotations

import argparse

from runner.bench.jobs import NO_TIMED_STEPS, Sweep, emit, run_job, save, stamp, sweep
from runner.bench.peers import runner_overrides
from runner.report.table import markdown, markdown_row
from runner.strategies import baseline, doing, name_of


def _values(option: str, default: str, *others: str) -> list[tuple[str, list[str]]]:
    """(label, overrides) rows of one option: its default first, then the others."""
    return [(f"{option}={default} (default)", []), *[(f"{option}={v}", [f"{option}={v}"]) for v in others]]


_MLP = ["model=mlp", "model.variant=default", "train.steps=600", "train.steps_per_call=50"]
_CNN = ["model=cnn", "model.variant=default", "train.steps=120", "train.steps_per_call=10"]
_RESNET20 = runner_overrides(towers=1, batch=64, steps=200, xla="auto")  # the peers bench's job, one device
_MLP_TINY = ["model=mlp", "model.variant=tiny", "train.steps=300", "train.steps_per_call=25"]
_LENET = ["model=lenet", "train.steps=120", "train.steps_per_call=10"]
_NIN = ["model=nin", "model.variant=default", "train.steps=60", "train.steps_per_call=5"]
_GPT = ["model=gpt", "data=shakespeare", "train.steps=300", "train.steps_per_call=25"]
_DLRM = ["model=dlrm", "data=clicks", "train.steps=200", "train.steps_per_call=20"]
# train.jit_compile's rows: auto's row says what it chose (its run's `xla` tag), beside both fixed settings
_XLA = _values("train.jit_compile", "auto", "false", "true")
_FUSED = _values("train.fused_optimizer", "true", "false")
_PRECISION = _values("train.precision", "float32", "mixed_bfloat16")
_MALLOC = _values("train.reuse_freed_memory", "true", "false")
_INPUT = _values("strategy.input", "towers", "distribute")
# The strategies of the groups below by what they do (tf_cnn_benchmarks' modes): towers written by the runner, each
# variable summed on one device; tf.distribute's all-reduce (the one with `input` and `cross_device_ops` options)
_TOWERS = doing("--variable_update=replicated")
_ALL_REDUCE = doing("--variable_update=replicated --all_reduce_spec=nccl")
_TOWERS_NAME, _ALL_REDUCE_NAME = name_of(_TOWERS), name_of(_ALL_REDUCE)
_BASE_NAME = baseline()  # the one-device groups run the default strategy
# TensorFlow's generator datasets (behind tf.distribute's per-device input iterators) are what set the malloc trap.
_DISTRIBUTE = [*_ALL_REDUCE, "gpus=2", "strategy.input=distribute"]
# group -> (what, where, the group's job, [(value, its overrides)]); the first value is the default.
SPEED_SETTINGS = {
    "calls": ("steps per compiled call", f"mlp/default, {_BASE_NAME}", _MLP,
              _values("train.steps_per_call", "50", "10", "1")),
    "fused": ("fused optimizer update", f"mlp/default, {_TOWERS_NAME} x4", [*_MLP, *_TOWERS, "gpus=4"], _FUSED),
    "fused1": ("fused optimizer update", f"mlp/default, {_BASE_NAME}", _MLP, _FUSED),
    "xla": ("XLA compilation", f"mlp/default, {_BASE_NAME}", _MLP, _XLA),
    "xla_cnn": ("XLA compilation", f"cnn/default, {_BASE_NAME}", _CNN, _XLA),
    "xla_towers": ("XLA compilation", f"cnn/default, {_TOWERS_NAME} x2", [*_CNN, *_TOWERS, "gpus=2"], _XLA),
    "xla_lenet": ("XLA compilation", f"lenet, {_BASE_NAME}", _LENET, _XLA),
    "xla_nin": ("XLA compilation", f"nin/default, {_BASE_NAME}", _NIN, _XLA),
    "xla_resnet": ("XLA compilation", f"a user's ResNet-20, {_BASE_NAME}", _RESNET20, _XLA),
    "xla_gpt": ("XLA compilation", f"gpt/default (nanoGPT's CPU recipe), {_BASE_NAME}", _GPT, _XLA),
    "xla_dlrm": ("XLA compilation", f"dlrm/default, {_BASE_NAME}", _DLRM, _XLA),
    "fused_bn": ("fused batch norm", f"a user's ResNet-20, {_BASE_NAME}", _RESNET20,
                 _values("train.fused_batch_norm", "true", "false")),
    "precision": ("mixed precision", f"mlp/default, {_BASE_NAME}", _MLP, _PRECISION),
    "precision_cnn": ("mixed precision", f"cnn/default, {_BASE_NAME}", _CNN, _PRECISION),
    "threads": ("host threads", f"mlp/default, {_TOWERS_NAME} x2", [*_MLP, *_TOWERS, "gpus=2"], [
        ("train.intra_op_threads=-1 (default: cores / devices)", []),
        ("train.intra_op_threads=0 (TensorFlow's default)", ["train.intra_op_threads=0"]),
        ("train.intra_op_threads=2", ["train.intra_op_threads=2"]),
        ("train.inter_op_threads=1", ["train.inter_op_threads=1"]),
        ("train.inter_op_threads=4", ["train.inter_op_threads=4"])]),
    "threads1": ("host threads", f"mlp/tiny, {_BASE_NAME}", _MLP_TINY, [
        ("train.intra_op_threads=-1 (default: TensorFlow's own on one device)", []),
        ("train.intra_op_threads=1", ["train.intra_op_threads=1"])]),
    "malloc": ("freed memory kept for reuse", f"mlp/default, {_ALL_REDUCE_NAME} x2, tf.distribute input",
               [*_MLP, *_DISTRIBUTE], _MALLOC),
    "malloc_cnn": ("freed memory kept for reuse", f"cnn/default, {_ALL_REDUCE_NAME} x2, tf.distribute input",
                   [*_CNN, *_DISTRIBUTE], _MALLOC),
    "input": (f"{_ALL_REDUCE_NAME}'s input", f"mlp/tiny, {_ALL_REDUCE_NAME} x2", [*_MLP_TINY, *_ALL_REDUCE, "gpus=2"],
              _INPUT),
    "input4": (f"{_ALL_REDUCE_NAME}'s input", f"mlp/default, {_ALL_REDUCE_NAME} x4", [*_MLP, *_ALL_REDUCE, "gpus=4"],
               _INPUT),
    "reduce": ("cross-device reduction", f"mlp/default, {_ALL_REDUCE_NAME} x4", [*_MLP, *_ALL_REDUCE, "gpus=4"], [
        ("strategy.cross_device_ops=auto (default: reduce_to_one_device on CPUs)", []),
        ("strategy.cross_device_ops=tensorflow (collective ring)", ["strategy.cross_device_ops=tensorflow"]),
        ("strategy.cross_device_ops=hierarchical_copy", ["strategy.cross_device_ops=hierarchical_copy"])]),
}


def speed_settings(args: argparse.Namespace) -> int:
    """One table: each setting's values side by side, the job's rate (its own unit) as a ratio to the group's
    default."""
    out: list[str] = []
    emit(out, [f"# benchmark settings: each job a fresh process; {stamp()}", "",
               *markdown(["setting", "model, strategy", "value", "rate ± stderr", "x default", "test metric"])])
    failed = False
    with sweep(args.tracking_uri, "bench_settings") as bench:
        for group in args.groups:
            failed = _group(group, args, bench, out) or failed
    save(out, args.out)
    return 1 if failed else 0


def _group(group: str, args: argparse.Namespace, bench: Sweep, out: list[str]) -> bool:
    """One group's rows: each value, then the default again (its second round: the verdict's noise); True if a job
    failed."""
    what, where, job, values = SPEED_SETTINGS[group]
    base, failed = None, False  # the default's rate (the group's first row); None if that job failed
    for i, (label, extra) in enumerate([*values, (f"{values[0][0]}, again", values[0][1])]):
        steps = [f"train.steps={args.steps}"] if args.steps else []
        m = run_job([*job, *extra, *steps, "train.checkpoint_every=0", f"data.test_limit={args.test_limit}"],
                    bench, round=int(i == len(values)))
        if "error" in m or "rate" not in m:
            failed = True
            emit(out, [markdown_row([what, where, f"`{label}`", f"failed: {m.get('error', NO_TIMED_STEPS)[:80]}", "",
                                     ""])])
            continue
        base = m["rate"] if i == 0 else base
        rate = f"{m['rate']:,.0f} ± {m['rate_stderr']:,.0f} {m['unit']}/s"
        ratio = f"{m['rate'] / base:.2f}" if base else "-"
        chose = f" -> {m['xla']}" if "train.jit_compile=auto" in label else ""  # what auto decided, measured
        metric = m["score_metric"]  # its task's: accuracy, a click model's AUC, a regression's MAE
        emit(out, [markdown_row([what, where, f"`{label}`{chose}", rate, ratio,
                                 f"{metric} {m.get(f'test_{metric}', float('nan')):.4f}"])])
    return failed


def settings_steps(args: argparse.Namespace) -> list[tuple[str, int, int]]:
    """With --steps: each row of the chosen groups as (its label, the steps, its steps per call), every one to time
    >= 20 steps in >= 2 calls."""
    todo = []
    for group in args.groups if args.steps else []:
        _, _, job, values = SPEED_SETTINGS[group]
        for label, extra in values:
            per_call = int([o for o in [*job, *extra] if o.startswith("train.steps_per_call=")][-1].split("=")[1])
            todo.append((f"`{label}`", args.steps, per_call))
    return todo
