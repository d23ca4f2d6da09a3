"""Stop glibc malloc from handing memory back to the OS after every training step.

A training step frees and re-allocates the same activation buffers every time. With glibc's defaults,
blocks above the mmap threshold (128 KiB, raised dynamically up to 32 MiB) get their own mmap, and free
space at the top of the heap above the trim threshold is returned with brk/madvise; each step then
re-faults and zeroes fresh pages from the kernel. On this project's 2-core CPU machine that cost a training
loop half its speed. Raising both thresholds (mallopt M_TRIM_THRESHOLD, M_MMAP_THRESHOLD) keeps freed
memory in the process for the next step; the price is that resident memory stays at its peak.

Only glibc has mallopt with these meanings: on musl, macOS or Windows `tune_malloc` does nothing and
returns False. If the user already chose thresholds through glibc's environment variables
(MALLOC_TRIM_THRESHOLD_, MALLOC_MMAP_THRESHOLD_, or GLIBC_TUNABLES) their choice is kept.
"""

from __future__ import annotations

import ctypes
import os
import platform

M_TRIM_THRESHOLD = -1  # from glibc's malloc.h
M_MMAP_THRESHOLD = -3

USER_SETTINGS = ("MALLOC_TRIM_THRESHOLD_", "MALLOC_MMAP_THRESHOLD_", "GLIBC_TUNABLES")


def tune_malloc(trim_threshold: int = 1 << 30, mmap_threshold: int = 1 << 26) -> bool:
    """Set glibc's trim and mmap thresholds (bytes); True if both were applied, False if not glibc."""
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return False
    if any(name in os.environ for name in USER_SETTINGS):
        return False
    for value, name in ((trim_threshold, "trim_threshold"), (mmap_threshold, "mmap_threshold")):
        if not 0 <= value < 2**31:
            raise ValueError(f"{name}={value} must be between 0 and 2**31 - 1 bytes (mallopt takes a C int)")
    try:
        libc = ctypes.CDLL(None)
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    # mallopt returns 1 on success, 0 when glibc refuses the value.
    return bool(mallopt(M_TRIM_THRESHOLD, trim_threshold)) and bool(mallopt(M_MMAP_THRESHOLD, mmap_threshold))
