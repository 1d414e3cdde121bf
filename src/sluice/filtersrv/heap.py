"""Keep freed heap memory in the filter server's processes instead of handing it back to the OS per batch.

Every broker answer a filter server filters is a fresh block of up to max_transfer_bytes (256 KiB by
default): received, copied into the worker's shared file, copied out again in the worker, and freed a
batch later. glibc's malloc serves blocks that size by mmap, or from a heap whose free top it trims back to
the OS once it passes the trim threshold (twice the last such block); either way the next batch faults the
pages in again and the kernel zeroes them, which cost more than the copies themselves. Raising both
thresholds (mallopt) makes such blocks come from the heap and keeps up to ``TRIM_BYTES`` of it freed for the
next batch: a bounded amount of memory held for less CPU per record. Elsewhere than glibc nothing changes.
"""
from __future__ import annotations

import ctypes
import logging

__all__ = ["keep_freed_heap", "TRIM_BYTES", "MMAP_BYTES"]

log = logging.getLogger(__name__)

#: Freed heap kept at its top (glibc's M_TRIM_THRESHOLD).
TRIM_BYTES = 32 * 1024 * 1024
#: Blocks at least this large still get their own mapping (M_MMAP_THRESHOLD); glibc's own ceiling for the
#: threshold it raises by itself, above the 16 MiB remoting frame limit, so any pull answer stays on the heap.
MMAP_BYTES = 32 * 1024 * 1024
# malloc.h
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3


def keep_freed_heap(trim_bytes: int = TRIM_BYTES, mmap_bytes: int = MMAP_BYTES) -> bool:
    """Set this process's malloc thresholds; True where the C library took both (glibc)."""
    try:
        mallopt = ctypes.CDLL(None).mallopt  # the C library this process runs on
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = (ctypes.c_int, ctypes.c_int), ctypes.c_int
    took = mallopt(_M_TRIM_THRESHOLD, trim_bytes) == 1 and mallopt(_M_MMAP_THRESHOLD, mmap_bytes) == 1
    if not took:
        log.debug("malloc thresholds not set (not glibc?): freed heap goes back to the OS as usual")
    return took
