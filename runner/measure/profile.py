"""Where a training step's time goes: trace one compiled call with TensorFlow's profiler and sum it by op kind.

`train.profile=true` traces the first timed call (then left out of the timing) into `<run dir>/profile` (for
TensorBoard) and logs `profile.md`: the op time of each op kind per step beside the step's wall time. On devices that
share the same cores, the op time of all devices over the cores is a floor for the step time.
"""

from __future__ import annotations

import collections
import re
from pathlib import Path
from typing import Any, Iterator

# Op kinds folded into one row each (the rest keep their TensorFlow op type), by TensorFlow's op names: oneDNN's
# kernels (`_MklNativeConv2D`, `_MklFusedMatMul`) and grappler's fused ones (`_FusedConv2D`) count as their op's kind.
KINDS = {
    "matmul": ("MatMul", "FusedMatMul", "BatchMatMulV2", "BatchMatMulV3"),
    "convolution": ("Conv2D", "FusedConv2D", "Conv2DBackpropFilter", "Conv2DBackpropInput",
                    "DepthwiseConv2dNative", "DepthwiseConv2dNativeBackpropFilter",
                    "DepthwiseConv2dNativeBackpropInput"),
    "batch norm": ("FusedBatchNormV3", "FusedBatchNormEx", "FusedBatchNormGradV3", "FusedBatchNormGradEx"),
    "optimizer update": ("ResourceApplyAdam", "ResourceApplyKerasMomentum", "ResourceApplyGradientDescent",
                         "AssignAddVariableOp", "AssignSubVariableOp", "AssignVariableOp"),
    "cross-device reduce": ("CollectiveReduceV2", "NcclAllReduce", "Send", "Recv", "AddN"),
    "input": ("IteratorGetNext", "MultiDeviceIteratorGetNextFromShard", "GatherV2", "OptionalGetValue",
              "IteratorGetNextAsOptional", "OptionalHasValue"),
}
_KIND_OF = {op: kind for kind, ops in KINDS.items() for op in ops}
_KERNEL_PREFIX = re.compile(r"^_(MklNative|Mkl)?")  # '_MklNativeConv2D', '_MklFusedMatMul', '_FusedConv2D', '_Send'


def kind_of(op_type: str) -> str:
    """The KINDS row an op type counts in, or 'other'."""
    return _KIND_OF.get(_KERNEL_PREFIX.sub("", op_type), "other")


_OP_EVENT = re.compile(r"[^:\s]+:([A-Za-z_]\w*)")  # 'dense/MatMul:MatMul', not 'ExecutorState::Process'


def _self_times(events: Any, names: dict[int, str]) -> Iterator[tuple[str, float]]:
    """(op type, seconds) for the op events of one thread, each minus the op events nested inside it (a function
    call, a synchronous tf.data map inside IteratorGetNext), which would otherwise count twice."""
    ops = sorted(
        (e.offset_ps, e.duration_ps, m.group(1))
        for e in events
        if (m := _OP_EVENT.fullmatch(names.get(e.metadata_id, "")))
    )
    stack: list[list] = []  # open ops: [end, op type, own picoseconds]
    for start, duration, op_type in ops:
        while stack and stack[-1][0] <= start:
            _, done_type, own = stack.pop()
            yield done_type, own * 1e-12
        if stack:
            stack[-1][2] -= duration
        stack.append([start + duration, op_type, duration])
    for _, done_type, own in stack:
        yield done_type, own * 1e-12


def op_seconds(logdir: Path) -> tuple[dict[str, float], dict[str, int]]:
    """Op time (seconds) and executions per op type over the host threads of the newest trace under `logdir`: the
    events TensorFlow names `<op name>:<op type>`, each its span on its thread (an op waiting counts while it
    waits); GPU kernels' own time is in the device planes, which this leaves out."""
    from tensorflow.tsl.profiler.protobuf import xplane_pb2

    traces = list(Path(logdir).glob("plugins/profile/*/*.xplane.pb"))
    if not traces:
        raise FileNotFoundError(f"no profiler trace under {logdir}")
    space = xplane_pb2.XSpace()
    space.ParseFromString(max(traces, key=lambda p: p.stat().st_mtime).read_bytes())
    seconds: dict[str, float] = collections.defaultdict(float)
    counts: dict[str, int] = collections.Counter()
    for plane in space.planes:
        if plane.name != "/host:CPU":
            continue
        names = {k: m.name for k, m in plane.event_metadata.items()}
        for line in plane.lines:
            for op_type, own in _self_times(line.events, names):
                seconds[op_type] += own
                counts[op_type] += 1
    return dict(seconds), dict(counts)


def table(logdir: Path, steps: int, wall_seconds: float, cores: int) -> tuple[str, dict[str, float]]:
    """A markdown table of op time per step by op kind, and the `profile_*` metrics to log, for the traced call
    of `steps` steps and `wall_seconds` under `logdir`, on `cores` host cores."""
    seconds, counts = op_seconds(logdir)
    by_kind: dict[str, float] = collections.defaultdict(float)
    for op_type, s in seconds.items():
        by_kind[kind_of(op_type)] += s
    total = sum(by_kind.values())
    wall_ms, op_ms = 1e3 * wall_seconds / steps, 1e3 * total / steps
    lines = [
        f"wall {wall_ms:.2f} ms/step; op time {op_ms:.2f} ms/step = {op_ms / wall_ms:.2f} x wall on {cores} cores; "
        f"{sum(counts.values()) / steps:.0f} op executions/step",
        "",
        "| op kind | op ms/step | share |",
        "|---|---|---|",
    ]
    for kind, s in sorted(by_kind.items(), key=lambda kv: -kv[1]):
        lines.append(f"| {kind} | {1e3 * s / steps:.3f} | {s / total:.0%} |")
    top = sorted(seconds.items(), key=lambda kv: -kv[1])[:12]
    lines += ["", "| op type (top 12) | op ms/step | executions/step |", "|---|---|---|"]
    lines += [f"| {t} | {1e3 * s / steps:.3f} | {counts[t] / steps:.1f} |" for t, s in top]
    metrics = {"profile_wall_ms_per_step": wall_ms, "profile_op_ms_per_step": op_ms,
               "profile_ops_per_step": sum(counts.values()) / steps}
    metrics.update({f"profile_ms_{k.replace(' ', '_').replace('-', '_')}": 1e3 * s / steps for k, s in by_kind.items()})
    return "\n".join(lines), metrics
