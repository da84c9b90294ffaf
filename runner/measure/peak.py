"""The machine's measured dense-matmul peak: what MFU divides by.

`probe_peak` takes the best achieved GFLOP/s of chains of dense matmuls over a few matrix sizes, cached per machine,
so MFU says how far a model is from the fastest matmul on the same device. Other processes only lower the figure,
which would inflate every MFU against it: a probe during which they used more than BUSY of the CPUs is tried once
more and, still disturbed, not trusted; a re-probe keeps the higher figure.
"""

from __future__ import annotations

import hashlib
import logging
import math
import os
import platform
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from runner.paths import cache_dir as runner_cache_dir, read_cache, write_cache
from runner.runtime.devices import BF16_ISA, cpuinfo, nvidia_gpu_count

log = logging.getLogger(__name__)

DTYPES = ("float32", "float16", "bfloat16")
CACHE_FILE = "peak.json"
SIZES = (1024, 2048, 3072)  # square matrix sides swept: the best of them is the peak
BUSY = 0.25  # share of the CPUs other processes may use during a probe before its figure is not trusted
RETRY_AFTER = 2.0  # seconds to wait before probing a disturbed measurement once more
PROBE_SECONDS = 10  # about how long a probe takes, TensorFlow's start in its fresh process included


@dataclass(frozen=True)
class Peak:
    """A measured dense-matmul peak."""

    gflops: float  # best achieved GFLOP/s of the matmul chain
    dtype: str
    device: str  # what it was measured on (`describe`)
    key: str  # its cache key
    cached: bool  # read from the cache rather than measured by this call
    size: int = 0  # the matrix side that gave it (0: not recorded)
    others: float = 0.0  # the share of the CPUs other processes used while it was measured
    measured: str = ""  # when (local time, ISO 8601)

    def __str__(self) -> str:
        return (f"{self.dtype} matmul peak on {self.device}: {self.gflops:,.0f} GFLOP/s at {self.size}x{self.size}, "
                f"other processes at {self.others:.0%} of the CPUs, measured {self.measured}"
                + (" (cached)" if self.cached else ""))


def _cpu_description() -> str:
    """CPU model, a digest of its instruction-set flags (one model name covers hosts with and without AVX-512) and the
    cores this process may use (affinity: a container's share, which is what TF uses)."""
    name = cpuinfo().get("model name") or platform.processor() or platform.machine()
    flags = hashlib.sha256(" ".join(sorted(cpuinfo().get("flags", "").split())).encode()).hexdigest()[:8]
    return f"{name} (flags {flags}, {len(_cpus())} cores)"


def _cpu_supports(dtype: str) -> bool:
    """fp32 always; bf16/fp16 only with native instructions, which oneDNN uses (else they are emulated, slower)."""
    flags = set(cpuinfo().get("flags", "").split())
    native = {"bfloat16": set(BF16_ISA), "float16": {"avx512_fp16", "amx_fp16"}}
    return dtype == "float32" or bool(native[dtype] & flags)


def describe(device_name: str, dtype: str = "float32") -> tuple[str, bool]:
    """(the device as cache keys name it, whether `dtype` matmuls run natively on it, else emulated and no faster
    than float32, so not worth probing): a CPU by model, flags and cores; a GPU by the name and compute capability of
    the physical GPU behind `device_name` (GPU 0 for simulated ones)."""
    if "GPU" not in device_name.upper():
        return _cpu_description(), _cpu_supports(dtype)
    import tensorflow as tf

    gpus = tf.config.list_physical_devices("GPU")
    if not gpus:
        raise ValueError(f"{device_name} is a GPU but TensorFlow sees none")
    index = int(device_name.rsplit(":", 1)[-1])
    details = tf.config.experimental.get_device_details(gpus[index if index < len(gpus) else 0])
    cc = tuple(details.get("compute_capability") or (0, 0))
    desc = f"{details.get('device_name', 'GPU')} (cc {cc[0]}.{cc[1]})"
    # fp16 is fast from Volta (7.0) on, and on P100 (6.0); other Pascals run it at 1/64 rate. bf16 needs Ampere.
    fast = {"float32": True, "float16": cc >= (7, 0) or cc == (6, 0), "bfloat16": cc >= (8, 0)}
    return desc, fast[dtype]


def _benchmark(device_name: str, dtype: str, size: int, seconds: float) -> float:
    """Best GFLOP/s of a matmul chain on `device_name`: warm-up excluded, about `seconds` of timed repeats."""
    import tensorflow as tf

    @tf.function
    def chain(x, w, k):  # k dependent matmuls y <- y @ w; k is a tensor, so one trace serves every k
        y = x
        for _ in tf.range(k):  # each matmul needs the previous one: no overlap, each uses every core
            y = tf.matmul(y, w)
        return tf.cast(y[0, 0], tf.float32)  # fetching a scalar waits for the chain without copying y back

    with tf.device(device_name):
        x = tf.cast(tf.random.normal((size, size), seed=1), dtype)
        # N(0, 1/n) entries keep |y| about constant along the chain: no overflow in fp16, no denormals.
        w = tf.cast(tf.random.normal((size, size), seed=2) / math.sqrt(size), dtype)

        def timed(k: int) -> float:
            start = time.perf_counter()
            float(chain(x, w, tf.constant(k)))
            return time.perf_counter() - start

        timed(1)  # warm-up: tracing, kernel selection, first allocations
        # Calls of ~1/5 of the budget: long enough that dispatch is noise, short enough for 5 repeats.
        k = max(1, min(10_000, round(seconds / 5 / max(timed(1), 1e-6))))
        best, spent = math.inf, 0.0
        while spent < seconds or math.isinf(best):
            dt = timed(k)
            best, spent = min(best, dt), spent + dt
    return k * 2.0 * size**3 / best / 1e9


def _cpus() -> set[int]:
    """The CPUs this process may run on (a container's share)."""
    return os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else set(range(os.cpu_count() or 1))


def _busy_seconds(cpus: set[int]) -> float:
    """CPU-seconds the CPUs `cpus` have spent busy since boot, all processes together (0 without /proc/stat)."""
    ticks = 0
    try:
        for line in Path("/proc/stat").read_text().splitlines():
            name, *fields = line.split()
            if name[:3] == "cpu" and name[3:].isdigit() and int(name[3:]) in cpus:
                values = [int(f) for f in fields[:8]]  # user nice system idle iowait irq softirq steal
                ticks += sum(values) - values[3] - values[4]  # steal counts: a VM neighbour took the core
    except (OSError, ValueError):
        return 0.0
    return ticks / os.sysconf("SC_CLK_TCK")


def timed_with_others_share(run: Callable[[], float]) -> tuple[float, float]:
    """(run(), share of the CPUs' time other processes used meanwhile): above ~0.25 the probe was disturbed."""
    cpus = _cpus()
    busy, own, wall = _busy_seconds(cpus), time.process_time(), time.perf_counter()
    result = run()
    busy, own, wall = _busy_seconds(cpus) - busy, time.process_time() - own, time.perf_counter() - wall
    if not busy:  # no /proc/stat: unknown, reported as undisturbed
        return result, 0.0
    return result, min(1.0, max(0.0, (busy - own) / (wall * len(cpus))))


def _measure(device_name: str, dtype: str, size: int, seconds: float) -> tuple[float, float]:
    """(GFLOP/s, share of the CPUs other processes used meanwhile; 0 for GPUs, which they do not slow)."""
    if "GPU" in device_name.upper():
        return _benchmark(device_name, dtype, size, seconds), 0.0
    return timed_with_others_share(lambda: _benchmark(device_name, dtype, size, seconds))


def _sweep(device_name: str, dtype: str, sizes: tuple[int, ...], seconds: float) -> tuple[float, int, float]:
    """(best GFLOP/s over `sizes`, the size that gave it, the largest share of the CPUs others used meanwhile)."""
    results = [(*_measure(device_name, dtype, size, seconds), size) for size in sizes]
    gflops, _, size = max(results)
    return gflops, size, max(others for _, others, _ in results)


def _cache_path(cache_dir: Path | None = None) -> Path:
    return (cache_dir or runner_cache_dir()) / CACHE_FILE


def _announce(dtype: str, path: Path, refresh: bool) -> None:
    """Say, before a probe starts, what it measures, where its figure is kept and about how long it takes."""
    log.info("measuring this machine's %s matmul peak %s for MFU (cached in %s): ~%d s", dtype,
             "again" if refresh else "once", path, PROBE_SECONDS)


def cache_key(device: str, dtype: str = "float32", sizes: tuple[int, ...] = SIZES) -> str:
    """A peak's entry in the cache: the device (CPU: model, flags digest, cores), dtype and the sizes swept."""
    return f"{device}|{dtype}|{','.join(map(str, sizes))}"


def probe_peak(
    device_name: str = "/device:CPU:0", dtype: str = "float32", sizes: tuple[int, ...] = SIZES, seconds: float = 0.5,
    cache_dir: Path | None = None, refresh: bool = False,
) -> Peak | None:
    """The device's best dense-matmul GFLOP/s over the square matrices of `sizes`, each timed for about `seconds`,
    measured once per machine and then read from the cache (`refresh`: measured again, the higher figure kept). None
    if `dtype` has no native support on the device, or if other processes used more than BUSY of the CPUs during
    two probes in a row (a warning says so; nothing is cached). ValueError: unknown dtype, or no GPU for a GPU."""
    if dtype not in DTYPES:
        raise ValueError(f"dtype={dtype!r}; use one of {DTYPES}")
    device, supported = describe(device_name, dtype)
    if not supported:
        log.info("no native %s on %s: peak not probed", dtype, device)
        return None
    key = cache_key(device, dtype, sizes)
    path = _cache_path(cache_dir)
    entry = read_cache(path).get(key)
    old = float(entry.get("gflops", 0)) if isinstance(entry, dict) else 0.0
    if old > 0 and not refresh:
        return Peak(old, dtype, device, key, True, int(entry.get("size", 0)), float(entry.get("others_cpu_share", 0)),
                    str(entry.get("measured", "")))
    _announce(dtype, path, refresh)
    gflops, size, others = _sweep(device_name, dtype, sizes, seconds)
    if others > BUSY:  # disturbed: the figure is low, and MFU against it too high
        time.sleep(RETRY_AFTER)
        gflops, size, others = _sweep(device_name, dtype, sizes, seconds)
    if others > BUSY:
        log.warning("peak not measured: other processes used %.0f%% of the CPUs during two probes (%.0f GFLOP/s "
                    "at best); MFU is left out. Re-probe on an idle machine: runner check --reprobe",
                    100 * others, gflops)
        return None
    if gflops > old:
        entry = {"gflops": gflops, "size": size, "measured": time.strftime("%Y-%m-%dT%H:%M:%S"), "seconds": seconds,
                 "others_cpu_share": round(others, 2)}
        write_cache(path, {key: entry})
    log.info("peak %s on %s: %.0f GFLOP/s (cached in %s)", dtype, device, max(gflops, old), path)
    return Peak(max(gflops, old), dtype, device, key, False, int(entry.get("size", 0)),
                float(entry.get("others_cpu_share", 0)), str(entry.get("measured", "")))


def cached_cpu_peak(cache_dir: Path | None = None, dtype: str = "float32") -> float | None:
    """The host CPU's cached `dtype` peak (default sizes), read without TensorFlow; None when not cached."""
    entry = read_cache(_cache_path(cache_dir)).get(cache_key(_cpu_description(), dtype))
    return float(entry["gflops"]) if isinstance(entry, dict) and entry.get("gflops") else None


def cpu_peak(dtype: str = "float32", refresh: bool = False) -> float | None:
    """The host CPU's `dtype` peak, probed in a fresh process first when it is not cached (or `refresh`): a run's
    own thread pools may be cut, and a probe there would cache a fraction of the CPU. None without native `dtype`,
    or where the probe gave no figure (a busy machine)."""
    if not _cpu_supports(dtype):
        return None
    if refresh or cached_cpu_peak(dtype=dtype) is None:
        _announce(dtype, _cache_path(), refresh)  # the probe's own line is in its process's output, unseen
        code = f"from runner.measure.peak import probe_peak; probe_peak(dtype={dtype!r}, refresh={refresh})"
        probe = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=False)
        if cached_cpu_peak(dtype=dtype) is None:  # its reason was in its output, unseen: every run probed again
            said = [line.split(" - ", 1)[-1] for line in probe.stderr.splitlines() if "peak not measured" in line]
            log.warning("%s; until a probe is cached, every run probes again (~%d s; train.probe_peak=false: none)",
                        said[-1] if said else f"peak not measured: the probe gave no figure (exit {probe.returncode})",
                        PROBE_SECONDS)
    return cached_cpu_peak(dtype=dtype)


def probe_before_jobs() -> None:
    """Before a sweep's jobs start, on a machine whose runs train on the CPU: probe its peak unless it is cached,
    while the machine is still idle (jobs side by side would see each other as load and never trust a probe)."""
    if nvidia_gpu_count() or cached_cpu_peak() is not None:
        return
    cpu_peak()  # which says so
