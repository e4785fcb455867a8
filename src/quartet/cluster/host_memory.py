"""A host process keeps the memory it frees, for its next phase, instead of handing it back to the OS.

A host alternates phases (generation, log-probs, the update), each allocating and freeing its activations.
glibc's malloc gives large freed blocks back to the kernel: blocks above its mmap threshold (128 KiB,
rising to at most 32 MiB) are unmapped on free, and free memory at the top of the heap is trimmed. The next
phase then faults every page in again, and the kernel zeroes each. On the 2-core machine of
docs/throughput.md a GRPO step at 20M took ~1 s more in its first steps for it: 165,000 faults and 1.45 s
of system time in one update, none once the host kept its memory.

`keep_freed_memory` turns both off in this process (`mallopt`: `M_TRIM_THRESHOLD` -1 never trims,
`M_MMAP_MAX` 0 serves large blocks from the heap). Freed memory stays in the process and serves its next
allocations; the process's resident size stays at its peak, the size the memory plan counts. Other C
libraries (musl, macOS) are left as they are. `cluster.keep_freed_memory: false` keeps glibc's defaults.
"""

from __future__ import annotations

import ctypes
import sys

__all__ = ["keep_freed_memory"]

M_TRIM_THRESHOLD = -1
"""mallopt's parameter number (malloc.h); the value -1 turns trimming off."""
M_MMAP_MAX = -4
"""mallopt's parameter number (malloc.h); the value 0 turns mmap off for large blocks."""


def keep_freed_memory() -> bool:
    """Keep this process's freed memory for reuse (glibc only); whether it took effect."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None)
        libc.gnu_get_libc_version  # noqa: B018 - glibc only: musl has no mallopt with these parameters
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    return bool(mallopt(M_TRIM_THRESHOLD, -1)) and bool(mallopt(M_MMAP_MAX, 0))
