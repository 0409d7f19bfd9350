"""The C allocator's handling of freed memory, for processes that run the same batch shapes over and over."""

from __future__ import annotations

import ctypes
import ctypes.util
import sys

from loguru import logger

# glibc's mallopt parameters (malloc.h)
M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
RETAIN_BYTES = 1 << 30


def keep_freed_memory() -> bool:
    """Let glibc keep freed blocks of up to 1 GiB in the process for reuse; True where it took effect.

    By default glibc gives every block above its mmap threshold (128 KiB at first, at most 32 MiB) its own
    mapping and unmaps it when freed, and returns the free top of the heap to the system. Inference frees
    and allocates the same activation sizes batch after batch, so each batch faults its activations back
    in, 4 KiB at a time, zero-filled by the kernel: about 160,000 page faults for 64 images of YOLOX-Nano at
    416 px, a fifth of the demo's time on a 2-core CPU (`python tools/benchmark.py allocator`). Kept, the
    process holds on to its largest batch's memory (its resident size stays at its peak instead of
    falling back between batches) and faults nothing after the first batch.

    A no-op returning False on other C libraries (musl, macOS, Windows) and under another allocator
    preloaded in glibc's place (jemalloc, tcmalloc: their mallopt does not exist or ignores these).
    """
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    # mallopt returns 1 on success; a glibc whose mmap threshold is capped below 1 GiB refuses the value
    kept = mallopt(M_MMAP_THRESHOLD, RETAIN_BYTES) == 1 and mallopt(M_TRIM_THRESHOLD, RETAIN_BYTES) == 1
    if not kept:
        logger.debug("glibc's mallopt refused to keep freed memory: the allocator is left as it is")
    return kept
