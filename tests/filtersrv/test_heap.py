"""filtersrv/heap.py: the filter server's processes keep freed heap (glibc's malloc thresholds raised), so a
pull body per batch no longer gets fresh pages from the OS each time."""
from __future__ import annotations

import ctypes
import os
import subprocess
import sys

import pytest

from sluice.filtersrv.heap import MMAP_BYTES

_PROBE = '''
import ctypes, sys
from sluice.filtersrv.heap import keep_freed_heap

class MallInfo2(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks",
                                              "fsmblks", "uordblks", "fordblks", "keepcost")]

libc = ctypes.CDLL(None)
libc.mallinfo2.restype = MallInfo2
took = keep_freed_heap() if sys.argv[1] == "keep" else None
before = libc.mallinfo2().hblks
block = bytes(int(sys.argv[2]))  # a pull body's worth
print(took, libc.mallinfo2().hblks - before)
'''


def _probe(mode: str, size: int) -> list[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MALLOC_", "GLIBC_TUNABLES"))}  # glibc defaults
    return subprocess.run([sys.executable, "-c", _PROBE, mode, str(size)], capture_output=True, text=True,
                          check=True, env=env).stdout.split()


@pytest.mark.skipif(not hasattr(ctypes.CDLL(None), "mallinfo2"), reason="not glibc >= 2.33")
def test_big_blocks_come_from_the_heap_once_kept():
    size = 8 * 1024 * 1024  # above glibc's default threshold and anything it raised itself at start-up
    assert _probe("as-is", size) == ["None", "1"]  # its own mapping, unmapped again when freed
    assert _probe("keep", size) == ["True", "0"]  # from the heap, reused by the next one
    assert _probe("keep", MMAP_BYTES + 1) == ["True", "1"]  # still mapped above the threshold
