"""The checkpoint file: what is known durable, written atomically (sluice.persist.write_atomic).

Layout (big-endian, 64 bytes)::

    0 magic "SLCK" | 4 version (1) | 8 commit-log flushed offset | 16 commit-log flush time (ms)
    24 dispatch offset (consume queues durable up to this commit-log offset)
    32 index offset (key index durable up to this commit-log offset) | 40 min commit-log offset
    48 saved at (ms) | 56 reserved (4) | 60 CRC32 of bytes 0..59
"""
from __future__ import annotations

import logging
import struct
import time
import zlib
from dataclasses import dataclass
from pathlib import Path

from sluice.persist import write_atomic

log = logging.getLogger(__name__)

_FMT = struct.Struct(">4sIqqqqqqi")
assert _FMT.size == 60
_MAGIC = b"SLCK"
SIZE = 64


@dataclass(slots=True)
class Checkpoint:
    commitlog_offset: int = 0
    commitlog_time: int = 0
    dispatch_offset: int = 0
    index_offset: int = 0
    min_offset: int = 0
    saved_at: int = 0

    def encode(self) -> bytes:
        head = _FMT.pack(_MAGIC, 1, self.commitlog_offset, self.commitlog_time, self.dispatch_offset,
                         self.index_offset, self.min_offset, self.saved_at, 0)
        return head + struct.pack(">I", zlib.crc32(head))

    @classmethod
    def decode(cls, data: bytes) -> Checkpoint | None:
        if len(data) != SIZE or zlib.crc32(data[:60]) != struct.unpack_from(">I", data, 60)[0]:
            return None
        magic, version, cl, clt, disp, idx, mn, saved, _ = _FMT.unpack_from(data)
        if magic != _MAGIC or version != 1:
            return None
        return cls(cl, clt, disp, idx, mn, saved)


def load_checkpoint(path: Path) -> Checkpoint | None:
    """The saved checkpoint, or None when there is none or it does not verify."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return None
    cp = Checkpoint.decode(data)
    if cp is None:
        log.warning("checkpoint %s does not verify; ignoring it", path)
    return cp


def save_checkpoint(path: Path, cp: Checkpoint) -> None:
    cp.saved_at = int(time.time() * 1000)
    write_atomic(path, cp.encode())
