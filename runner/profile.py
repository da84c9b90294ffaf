"""Where a training step's time goes: trace one compiled call with TensorFlow's profiler and sum it by op kind.

`train.profile=true` traces the first timed call (it is then left out of the timing) into `<run dir>/profile`
(TensorBoard's profile plugin reads it) and logs `profile.md`: the CPU time of each op kind per step, beside the
step's wall time. On a machine whose devices share the same cores, the total CPU time per step over the cores is
the bound: a strategy can only be as fast as the work all its devices add up to.
"""

from __future__ import annotations

import collections
import contextlib
import re
from pathlib import Path
from typing import Iterator

# Op kinds folded into one row each (the rest keep their TensorFlow op type).
KINDS = {
    "matmul": ("MatMul", "_MklMatMul", "_FusedMatMul", "_MklFusedMatMul", "_MklNativeFusedMatMul", "_MklNativeMatMul",
               "BatchMatMulV2"),
    "convolution": ("Conv2D", "Conv2DBackpropFilter", "Conv2DBackpropInput", "_FusedConv2D", "_MklConv2D",
                    "_MklFusedConv2D", "_MklConv2DBackpropFilter", "_MklConv2DBackpropInput"),
    "optimizer update": ("ResourceApplyAdam", "ResourceApplyKerasMomentum", "AssignAddVariableOp",
                         "AssignSubVariableOp", "AssignVariableOp"),
    "cross-device reduce": ("CollectiveReduceV2", "NcclAllReduce", "_Send", "_Recv", "AddN"),
    "input": ("IteratorGetNext", "MultiDeviceIteratorGetNextFromShard", "GatherV2", "OptionalGetValue",
              "IteratorGetNextAsOptional", "OptionalHasValue"),
}
_KIND_OF = {op: kind for kind, ops in KINDS.items() for op in ops}
_OP_EVENT = re.compile(r"[^:\s]+:([A-Za-z_]\w*)")  # 'dense/MatMul:MatMul', not 'ExecutorState::Process'


@contextlib.contextmanager
def trace(logdir: Path) -> Iterator[None]:
    """Trace the host (and any GPU) while the block runs; writes `<logdir>/plugins/profile/<time>/*.xplane.pb`."""
    import tensorflow as tf

    tf.profiler.experimental.start(str(logdir))
    try:
        yield
    finally:
        tf.profiler.experimental.stop()


def op_seconds(logdir: Path) -> tuple[dict[str, float], dict[str, int]]:
    """CPU seconds and executions per op type over every thread of the newest trace under `logdir`.

    Op events are the ones TensorFlow names `<op name>:<op type>`; other events (executor bookkeeping, tf.data
    iterator spans that contain ops) are left out so nothing is counted twice.
    """
    from tensorflow.tsl.profiler.protobuf import xplane_pb2

    newest = max(Path(logdir).glob("plugins/profile/*/*.xplane.pb"), key=lambda p: p.stat().st_mtime)
    space = xplane_pb2.XSpace()
    space.ParseFromString(newest.read_bytes())
    seconds: dict[str, float] = collections.defaultdict(float)
    counts: dict[str, int] = collections.Counter()
    for plane in space.planes:
        names = {k: m.name for k, m in plane.event_metadata.items()}
        for line in plane.lines:
            for event in line.events:
                match = _OP_EVENT.fullmatch(names.get(event.metadata_id, ""))
                if match:
                    op_type = match.group(1)
                    seconds[op_type] += event.duration_ps * 1e-12
                    counts[op_type] += 1
    return dict(seconds), dict(counts)


def table(logdir: Path, steps: int, wall_seconds: float, cores: int) -> tuple[str, dict[str, float]]:
    """A markdown table of CPU ms per step by op kind, and the metrics to log (ms per step, ops per step).

    Args:
        logdir: where `trace` wrote.
        steps: steps the traced call ran.
        wall_seconds: the traced call's wall time.
        cores: host cores (the CPU time the devices can share per second of wall time).
    """
    seconds, counts = op_seconds(logdir)
    by_kind: dict[str, float] = collections.defaultdict(float)
    for op_type, s in seconds.items():
        by_kind[_KIND_OF.get(op_type, "other")] += s
    total = sum(by_kind.values())
    wall_ms, cpu_ms = 1e3 * wall_seconds / steps, 1e3 * total / steps
    lines = [
        f"wall {wall_ms:.2f} ms/step; op CPU time {cpu_ms:.2f} ms/step over {cores} cores "
        f"(busy {cpu_ms / (cores * wall_ms):.0%}); {sum(counts.values()) / steps:.0f} op executions/step",
        "",
        "| op kind | CPU ms/step | share |",
        "|---|---|---|",
    ]
    for kind, s in sorted(by_kind.items(), key=lambda kv: -kv[1]):
        lines.append(f"| {kind} | {1e3 * s / steps:.3f} | {s / total:.0%} |")
    top = sorted(seconds.items(), key=lambda kv: -kv[1])[:12]
    lines += ["", "| op type (top 12) | CPU ms/step | executions/step |", "|---|---|---|"]
    lines += [f"| {t} | {1e3 * s / steps:.3f} | {counts[t] / steps:.1f} |" for t, s in top]
    metrics = {"profile_wall_ms_per_step": wall_ms, "profile_cpu_ms_per_step": cpu_ms,
               "profile_ops_per_step": sum(counts.values()) / steps}
    metrics.update({f"profile_ms_{k.replace(' ', '_').replace('-', '_')}": 1e3 * s / steps for k, s in by_kind.items()})
    return "\n".join(lines), metrics
