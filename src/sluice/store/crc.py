"""CRC32 (zlib's polynomial, as java.util.zip.CRC32) of record bodies: ISA-L's when installed.

The store computes one per appended record and checks one per record it serves.
zlib's table-driven CRC costs about 0.4 µs per KiB; ISA-L's (python-isal, the
same function with carry-less multiplication) about a tenth of that on large
bodies. Both give the same numbers; zlib is the fallback when the wheel is missing.
"""
from __future__ import annotations

try:
    from isal.isal_zlib import crc32
except ImportError:  # pragma: no cover - the dependency is declared; this keeps a bare install working
    from zlib import crc32

__all__ = ["crc32"]
