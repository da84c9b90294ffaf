"""Keep freed tensor memory in the heap: undo the malloc setting TensorFlow's generator datasets leave behind.

TensorFlow's GeneratorDatasetOp (under tf.distribute's per-device input iterators and `prefetch_to_device`) calls
glibc's `mallopt(M_TRIM_THRESHOLD, 128 KiB)` when its iterator starts. Setting any threshold switches off glibc's
dynamic mmap threshold for the whole process: every tensor over 128 KiB is then mapped fresh, page-faulted in and
unmapped again when freed, a large share of a small model's step (BENCHMARKS.md).

This matters only where TensorFlow's CPU tensors come from malloc, i.e. with its oneDNN ops off; with them on, its
own allocator pools large tensors and `reuse()` is harmless. The run's `tensorflow.onednn` tag says which case it was.
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
    """Serve allocations up to 32 MiB from the heap and keep up to 64 MiB of freed memory for reuse; whether the
    thresholds were set (False without glibc). Cheap: called after every compiled call, since any new
    generator-based iterator sets the 128 KiB threshold again."""
    mallopt = _mallopt()
    return mallopt is not None and bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and \
        bool(mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD))
