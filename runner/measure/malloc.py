"""Keep freed tensor memory in the heap: undo the malloc setting TensorFlow's generator datasets leave behind.

TensorFlow's GeneratorDatasetOp (tf.distribute's per-device input iterators, `strategy.input=distribute`, are built
on it; so is `prefetch_to_device` onto a GPU) calls glibc's `mallopt(M_TRIM_THRESHOLD, 128 KiB)` when its iterator
starts; the log says "Memory patch applied: M_TRIM_THRESHOLD=128 kb was set". Setting any threshold switches off
glibc's dynamic mmap threshold, which then stays at 128 KiB for the whole process: every tensor over 128 KiB is
mapped fresh, page-faulted in (zeroed by the kernel) and unmapped again when freed. Measured on the default MLP,
mirrored on 2 simulated CPU devices: 24 mmap/munmap pairs and 7.4-7.7 ms of kernel time per step; after `reuse()`
none, and 1.5x the images/s (`python -m runner.bench settings --groups malloc`; BENCHMARKS.md).

This happens only where TensorFlow's CPU tensors come from malloc, i.e. with its oneDNN ops off (its default on
CPUs without AVX512_VNNI/AVX512_BF16/AMX, such as AVX2-only ones). With oneDNN on, TensorFlow's own allocator pools
large tensors and the threshold changes nothing (0.08 page faults per MiB tensor against 76 with oneDNN off);
`reuse()` is then harmless. The run's `tensorflow.onednn` tag says which case it was.
"""

from __future__ import annotations

import ctypes
import functools

# glibc's mallopt parameters (malloc.h).
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3
# Allocations up to this size come from the heap: glibc's own ceiling for its dynamic threshold on 64-bit.
MMAP_THRESHOLD = 32 << 20
# Free memory the heap keeps before returning any: twice the mmap threshold, as glibc's dynamic rule sets it.
TRIM_THRESHOLD = 2 * MMAP_THRESHOLD


@functools.cache
def _mallopt():
    """glibc's mallopt, or None (another C library: nothing to undo)."""
    try:
        libc = ctypes.CDLL(None)
        libc.gnu_get_libc_version  # noqa: B018 - raises AttributeError unless this is glibc
        return libc.mallopt
    except (OSError, AttributeError):
        return None


def reuse() -> bool:
    """Serve allocations up to 32 MiB from the heap and keep up to 64 MiB of freed memory for reuse.

    Cheap (two C calls); called after every compiled call, since any new generator-based iterator sets the
    128 KiB threshold again when it starts.

    Returns:
        Whether the thresholds were set (False without glibc).
    """
    mallopt = _mallopt()
    if mallopt is None:
        return False
    return bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD))
