"""Large freed CPU blocks kept for reuse (`malloc_keep`), where the C library is glibc.

glibc's malloc serves a block above its mmap threshold (adjusted as blocks are freed, at most
32 MB on 64-bit) with a fresh `mmap`, and unmaps it on free; the next block of that size is
mapped again and the kernel faults and zeroes it in, page by page, at first touch. A training
step that allocates the same large tensors every step (a cohort's stacked parameters and
gradients: 10 clients of the pfl CNN are 64 MB a tensor) pays that every step. With the mmap
threshold and the trim threshold raised, freed blocks stay in the heap and the next allocation
reuses them: on the pfl-CIFAR10 CPU workload fedexp and the plain loop beside it took 2.7-2.9 s
a run with it, 3.1-3.6 s without (docs/BENCHMARKS.md; separate runs, not paired). The process
keeps what it freed (its resident size stays at its peak), as jemalloc or tcmalloc, which
PyTorch's CPU tuning guide recommends for this, would. Results do not change: only where memory
comes from.
"""

from __future__ import annotations

import ctypes
import platform
import sys

M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # glibc's mallopt parameters (malloc.h)
KEEP_BYTES = 1 << 30  # blocks up to 1 GiB come from the heap; a freed top up to 1 GiB stays
_kept = False  # set in this process (a later run in it, a sweep's job, cannot undo it)


def keep_freed_blocks(enabled: bool) -> str:
    """Raise glibc's mmap and trim thresholds when `enabled`; returns what was done (a log
    line's words). Elsewhere (macOS, musl, Windows) it does nothing and says so."""
    global _kept
    if not enabled:
        if _kept:  # the thresholds stay as an earlier run of this process set them
            return "freed blocks kept for reuse, as an earlier run in this process set it"
        return "the C library's defaults (malloc_keep: false)"
    if not sys.platform.startswith("linux") or platform.libc_ver()[0] != "glibc":
        return "the C library's defaults (not glibc)"
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return "the C library's defaults (no mallopt)"
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    if mallopt(M_MMAP_THRESHOLD, KEEP_BYTES) != 1 or mallopt(M_TRIM_THRESHOLD, KEEP_BYTES) != 1:
        return "the C library's defaults (mallopt refused)"
    _kept = True
    return "freed blocks up to 1 GiB kept for reuse (glibc mallopt)"
