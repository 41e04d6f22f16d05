"""Telling glibc's malloc to keep the memory a process frees, for the processes that decide placements.

``keep_freed_memory()`` is called where the scheduler extender's HTTP server starts
(hub/extender.py ``serve``) and by ``bench.latency`` (unless ``--glibc-default-malloc``), so the
benchmark measures what runs.

Why (issue 38, docs/placement.md "Decision latency on the full cluster"): a decision of ``fgd``
or ``default`` on the full cluster (1,213 nodes, 6,212 GPUs) makes numpy arrays of a few hundred
KB (a candidate's values per task type: 1,000 candidates by 90 types). With glibc's defaults they
are either above its mmap threshold or freed to the top of the heap past its trim threshold, so
glibc hands them back to the kernel and the next decision faults them in again, page by page:
``default`` alone took 175,000-225,000 minor page faults over the default list's 8,146 decisions
(about 98 in each decision of a task of no GPU), and those faults were much of its p99. Raising the
mmap threshold to 64 MiB and the trim threshold to 256 MiB takes that to about 17,600, and
``default``'s p99 (``bench.latency``, 2026-11-29) from 6.1-7.2 ms of CPU to 4.7-5.8 ms.

What it costs: the process keeps its heap at up to its peak (freed memory stays mapped, reused by
the next decision instead of being returned to the kernel), so its RSS no longer falls back after
a large decision. Measured on the full cluster's replay (``default`` alone in one process, the
default list): peak RSS 104 MiB either way, 105 MiB at the end against 102 MiB with glibc's
defaults: about 3 MiB kept. Setting a threshold by ``mallopt`` also turns off glibc's own
adjustment of the mmap threshold.
"""

from __future__ import annotations

import ctypes

# glibc's <malloc.h>
M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3

MMAP_THRESHOLD = 64 * 1024 * 1024  # an allocation under 64 MiB comes from the heap, not its own mmap
TRIM_THRESHOLD = 256 * 1024 * 1024  # the heap's free top is handed back to the kernel only past 256 MiB


def keep_freed_memory() -> bool:
    """Raise glibc's mmap and trim thresholds for this process (see the module's doc).

    True when glibc took both; False where the C library is not glibc (musl, macOS), where
    nothing is done.
    """
    try:
        libc = ctypes.CDLL(None)
    except OSError:
        return False
    if not hasattr(libc, "gnu_get_libc_version") or not hasattr(libc, "mallopt"):
        return False
    mallopt = libc.mallopt
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    mallopt.restype = ctypes.c_int
    # Both, whatever the first answers: mallopt returns 1 on success, 0 on error.
    mmap_set: bool = mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD) == 1
    trim_set: bool = mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD) == 1
    return mmap_set and trim_set
