"""`gpus=N` -> the devices a run trains on. Configured once per process, before anything else touches TensorFlow.

| gpus | machine has               | the run uses                                               |
|------|---------------------------|------------------------------------------------------------|
| 0    | anything                  | the host CPU alone (GPUs hidden)                           |
| N    | >= N GPUs                 | the first N real GPUs                                      |
| N    | 1..N-1 GPUs               | N logical GPUs carved out of GPU 0 (simulated)             |
| 1    | no GPU                    | the CPU (real, not simulated: it is the only device)       |
| N>1  | no GPU                    | N logical CPU devices carved out of the CPU (simulated)    |

TensorFlow fixes its device list when it initialises; a process that already has one can reuse it when it has
enough devices of the right kind, and otherwise fails with an error saying to run in a fresh process.
"""

from __future__ import annotations

import functools
import logging
import os
import platform
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from runner.errors import UserError
from runner.runtime.quiet import filtered_stderr

log = logging.getLogger(__name__)

# Packages Keras imports when installed, for features a run never uses (scikit-learn's wrappers, matplotlib's plots,
# IPython's notebook display): hidden while it imports, as they are a large part of a run's start.
_UNUSED_BY_KERAS = ("sklearn", "matplotlib", "IPython")

# Memory each simulated GPU gets when one GPU is split; the GPU must have N times this much.
SIMULATED_GPU_MEMORY_MB = 1024


class DeviceError(UserError):
    """The requested devices cannot be provided in this process."""


@dataclass(frozen=True)
class Devices:
    """The devices a run trains on."""

    names: tuple[str, ...]  # TensorFlow device names, e.g. ("/device:CPU:0", "/device:CPU:1")
    kind: str  # "CPU" or "GPU"
    simulated: bool  # logical devices sharing one physical processor
    physical: str  # what they run on, e.g. "1 CPU (2 cores)"

    @property
    def count(self) -> int:
        return len(self.names)

    def as_tags(self) -> dict[str, str]:
        """The record every result carries: what it ran on."""
        return {
            "devices.kind": self.kind,
            "devices.count": str(self.count),
            "devices.simulated": str(self.simulated).lower(),
            "devices.physical": self.physical,
            "devices.names": ",".join(self.names),
            "devices.host_cpu": host_cpu(),
        }


# Vector instruction sets that change what a CPU run measures, widest last.
_ISA_FLAGS = ("avx2", "avx512f", "avx512_bf16", "amx_bf16")


def parse_cpuinfo(text: str) -> dict[str, str]:
    """The fields of the first processor in the text of /proc/cpuinfo."""
    first = text.strip().split("\n\n")[0]
    return dict((k.strip(), v.strip()) for k, _, v in (line.partition(":") for line in first.splitlines()))


@functools.cache
def cpuinfo() -> dict[str, str]:
    """This machine's /proc/cpuinfo fields (first processor); {} where there is no such file (not Linux)."""
    try:
        return parse_cpuinfo(Path("/proc/cpuinfo").read_text())
    except OSError:
        return {}


def nvidia_gpu_count() -> int:
    """The NVIDIA GPUs this process may use, read without TensorFlow (for validation and `runner check`): the
    driver's device list, narrowed by CUDA_VISIBLE_DEVICES when it is set."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES", None)
    if visible is not None and visible.strip() in ("", "-1"):
        return 0
    folder = Path("/proc/driver/nvidia/gpus")
    found = len(list(folder.iterdir())) if folder.is_dir() else int(Path("/dev/nvidia0").exists())
    return min(found, len(visible.split(","))) if visible is not None else found


def memory_bytes() -> int:
    """The machine's physical memory (what a run's tensors and input buffers must fit in)."""
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def describe_cpuinfo(text: str) -> str:
    """'<model name> (family F model M), <ISA flags>' from the text of /proc/cpuinfo (its first processor)."""
    fields = parse_cpuinfo(text)
    flags = set(fields.get("flags", "").split())
    isa = ", ".join(f for f in _ISA_FLAGS if f in flags) or "no avx2"
    name, family, model = (fields.get(k, "?") for k in ("model name", "cpu family", "model"))
    return f"{name} (family {family} model {model}), {isa}"


@functools.cache
def host_cpu() -> str:
    """The host CPU's model and vector instruction sets, recorded with every result: two CPUs of the same name can
    measure very differently (bfloat16 is fast with AVX-512 BF16, slow on AVX2 alone)."""
    try:
        return describe_cpuinfo(Path("/proc/cpuinfo").read_text())
    except OSError:  # not Linux
        return platform.processor() or platform.machine()


def onednn() -> str:
    """'on' or 'off': whether this process's TensorFlow runs its oneDNN ops (call after importing TensorFlow; it turns
    them on by itself on CPUs with AVX512_VNNI, AVX512_BF16 or AMX). Recorded with every result: it changes op speed,
    rounding and how CPU tensors' memory is pooled (`runner/measure/malloc.py`)."""
    try:
        from tensorflow.python.util import _pywrap_util_port  # TensorFlow's own check; not in its public API

        return "on" if _pywrap_util_port.IsMklEnabled() else "off"
    except (ImportError, AttributeError):
        return "unknown"


# Instruction sets with bfloat16 arithmetic; without them a CPU converts to float32 and back around every op.
BF16_ISA = ("avx512_bf16", "amx_bf16")


def float16_kernels(precision: str) -> None:
    """oneDNN's kernels off for mixed_float16, before TensorFlow starts (unless TF_ENABLE_ONEDNN_OPTS is set): its
    float16 convolution gradients are orders of magnitude slower than float32's. Only CPU kernels change; a process
    whose TensorFlow already started keeps its kernels, and `precision_warning` says so."""
    if precision == "mixed_float16" and "tensorflow" not in sys.modules:
        os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "0")


def fuse_ops(precision: str, devices: Devices) -> None:
    """TensorFlow's op fusion (grappler's remapper: MatMul + BiasAdd + ReLU as one kernel) off for float16 on CPUs,
    where oneDNN's fused float16 kernel is far slower than the ops apart; on (its default) otherwise. Set at every
    run's start, as the setting is process-wide."""
    import tensorflow as tf

    tf.config.optimizer.set_experimental_options({"remapping": not (precision == "mixed_float16"
                                                                    and devices.kind == "CPU")})


def precision_warning(precision: str, devices: Devices, cpu: str) -> str | None:
    """A one-line warning when train.`precision` is likely slower than float32 on these devices (`cpu`: `host_cpu()`),
    else None: a CPU without bfloat16 instructions converts around every op, and float16 is for GPUs' tensor cores."""
    if precision == "mixed_float16" and devices.kind == "CPU":
        return (
            f"train.precision=mixed_float16 on CPU devices ({cpu}): float16 is for GPUs; this runs, slower than "
            "float32, to try a GPU config here; train.precision=float32 is the fast choice on a CPU"
            + ("; oneDNN is on (TensorFlow started before this run): its float16 convolution gradients are 100x "
               "slower, a fresh process runs without them" if onednn() == "on" else "")
        )
    if precision != "mixed_bfloat16" or devices.kind != "CPU" or any(isa in cpu for isa in BF16_ISA):
        return None
    return (
        f"train.precision=mixed_bfloat16 on a CPU without bfloat16 instructions ({cpu}): expect it slower than "
        "float32 (a CNN ran 10x slower on such a host); train.precision=float32 is the fast choice here"
    )


def _names(kind: str, n: int) -> tuple[str, ...]:
    return tuple(f"/device:{kind}:{i}" for i in range(n))


def _configure(tf, gpus: int) -> Devices:
    """Set visible/logical devices for `gpus`; must run before TensorFlow initialises its devices."""
    phys_gpus = tf.config.list_physical_devices("GPU")
    cpu_desc = f"1 CPU ({os.cpu_count()} cores)"
    if gpus == 0:
        tf.config.set_visible_devices([], "GPU")
    elif len(phys_gpus) >= gpus:
        tf.config.set_visible_devices(phys_gpus[:gpus], "GPU")
        for gpu in phys_gpus[:gpus]:  # take memory as needed, not all of it up front: parallel jobs can share a GPU
            tf.config.experimental.set_memory_growth(gpu, True)
        return Devices(_names("GPU", gpus), "GPU", False, f"{gpus} GPU")
    elif phys_gpus:
        tf.config.set_visible_devices(phys_gpus[:1], "GPU")
        logical = [tf.config.LogicalDeviceConfiguration(memory_limit=SIMULATED_GPU_MEMORY_MB)] * gpus
        tf.config.set_logical_device_configuration(phys_gpus[0], logical)
        return Devices(_names("GPU", gpus), "GPU", True, f"1 GPU of {len(phys_gpus)}")
    elif gpus > 1:
        cpu = tf.config.list_physical_devices("CPU")[0]
        tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * gpus)
        return Devices(_names("CPU", gpus), "CPU", True, cpu_desc)
    return Devices(_names("CPU", 1), "CPU", False, cpu_desc)


def _reuse(tf, gpus: int) -> Devices:
    """TensorFlow is already initialised: use its devices if there are enough of the right kind."""
    kind = "GPU" if gpus and tf.config.list_logical_devices("GPU") else "CPU"
    have = len(tf.config.list_logical_devices(kind))
    need = max(gpus, 1)
    if have < need:
        raise DeviceError(
            f"gpus={gpus} needs {need} {kind} devices but TensorFlow is already initialised in this process with "
            f"{have}; run in a fresh process"
        )
    physical = len(tf.config.list_physical_devices(kind))
    desc = f"1 CPU ({os.cpu_count()} cores)" if kind == "CPU" else f"{physical} GPU"
    return Devices(_names(kind, need), kind, need > 1 and have > physical, desc)


def import_tensorflow() -> Any:
    """Import TensorFlow and Keras without the optional packages Keras would load for features a run never uses:
    meanwhile importing them raises ImportError (a None entry in sys.modules), as Keras expects when they are absent."""
    hidden = [name for name in _UNUSED_BY_KERAS if name not in sys.modules]
    sys.modules.update(dict.fromkeys(hidden))
    try:
        import keras  # noqa: F401  (TensorFlow imports Keras too; both here, inside the block)
        import tensorflow as tf
    finally:
        for name in hidden:
            if sys.modules.get(name, "") is None:
                del sys.modules[name]
    return tf


def setup(gpus: int, intra: int = -1, inter: int = 0) -> Devices:
    """Configure TensorFlow's devices for `gpus` (0: the host CPU alone) and its thread pools (`intra`: threads per
    op, -1 auto; `inter`: ops at once, 0 TensorFlow's default), and describe them (a warning when simulated); a
    DeviceError when this process cannot provide them."""
    with filtered_stderr():  # TensorFlow's start-up lines, filtered to those that matter
        tf = import_tensorflow()
        try:
            devices = _configure(tf, gpus)
        except RuntimeError:  # "... cannot be modified after being initialized"
            devices = _reuse(tf, gpus)
    if intra == -1:  # auto: on N simulated CPU devices cores / N (their towers run at once on the same cores, and N
        # ops of 2 threads each on 2 cores only fight); otherwise TensorFlow's default (0)
        intra = max(1, (os.cpu_count() or 1) // devices.count) if devices.simulated and devices.kind == "CPU" else 0
    if intra > (cores := os.cpu_count() or 1):
        log.warning("train.intra_op_threads=%d is more threads per op than this machine's %d cores: they take turns "
                    "on them, and the rate measures the wait; -1 (auto) or at most %d", intra, cores, cores)
    try:
        tf.config.threading.set_intra_op_parallelism_threads(intra)
        tf.config.threading.set_inter_op_parallelism_threads(inter)
    except RuntimeError:  # TensorFlow already initialised in this process (in-process tests): keep its pools
        log.info("thread pools already fixed in this process; train.*_op_threads not applied")
    else:
        log.info("threads: intra-op %s, inter-op %s (0 = TensorFlow's default)", intra, inter)
    if devices.simulated:
        log.warning(
            "simulated devices: %d logical %s devices on %s; they share one physical processor",
            devices.count, devices.kind, devices.physical,
        )
    elif gpus > 0 and devices.kind == "CPU":
        log.warning("no GPU found: training on the CPU")
    log.info("devices: %s (%s, simulated=%s)", ", ".join(devices.names), devices.kind, devices.simulated)
    return devices
