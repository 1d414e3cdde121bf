"""ConsumeQueueExt: per-queue variable-size units holding a message's filter bitmap (RocketMQ 4.x).

A unit, big-endian (store/src/main/java/org/apache/rocketmq/store/ConsumeQueueExt.java; sluice.format owns
the layout)::

    size short (20 + bitMapSize) | tagsCode long | msgStoreTime long | bitMapSize short | bitmap bytes

Units are appended to fixed-size files named by their 20-digit start offset in
``{root}/consumequeue_ext/{topic}/{queueId}/``. A unit never crosses a file
end: when it does not fit with 4 bytes to spare, short -1 is written at the
write position and the unit goes to the next file. A unit's address is its
offset plus Long.MIN_VALUE, which puts every address at or below
Integer.MIN_VALUE - 1; the consume queue stores it in a unit's tag-code slot,
where no tag code (never negative in Sluice) nor delivery time can be.

A unit's size short is written after the rest of it, so a crash mid-write
leaves a zero size, which load() reads as the end of the data.
"""
from __future__ import annotations

import logging
import os
import struct
import threading
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from sluice.errors import InvalidParameterError, StoreError
from sluice.store.ext_batch import ExtBatch, FewExtBatch
from sluice.format import (
    EXT_END_BLANK,
    EXT_MAX_ADDR,
    EXT_MAX_UNIT_SIZE,
    EXT_MIN_UNIT_SIZE,
    EXT_SIZE,
    EXT_UNIT_HEAD,
    EXT_UNIT_HEAD_FIELDS,
    LONG_MIN,
    ext_decorate as decorate,
    ext_undecorate as undecorate,
    is_ext_address,
)
from sluice.speedups import C
from sluice.store.mapped import MappedFile, open_file_run
from sluice.store.per_queue import OpenFilesLru

__all__ = [
    "ConsumeQueueExt", "ExtUnit", "ExtBatch", "FewExtBatch", "decorate", "undecorate", "is_ext_address",
    "is_ext_address_array", "ext_queue_dir", "MAX_ADDR", "MIN_UNIT_SIZE", "MAX_UNIT_SIZE",
]

log = logging.getLogger(__name__)

UNIT_HEAD = EXT_UNIT_HEAD
SIZE = EXT_SIZE
_HEAD_DTYPE = np.dtype(list(EXT_UNIT_HEAD_FIELDS))
assert _HEAD_DTYPE.itemsize == UNIT_HEAD.size

MIN_UNIT_SIZE = EXT_MIN_UNIT_SIZE
MAX_UNIT_SIZE = EXT_MAX_UNIT_SIZE
END_BLANK = EXT_END_BLANK
MAX_ADDR = EXT_MAX_ADDR
MAX_REAL_OFFSET = MAX_ADDR - LONG_MIN
_SIGN = np.uint64(1 << 63)
#: get_many reads, and put_many writes, this many units or fewer one by one (a numpy gather or a structured
#: array costs tens of calls whatever the count).
SMALL_BATCH = 16


def is_ext_address_array(codes: np.ndarray) -> np.ndarray:
    """Vectorised is_ext_address over int64 tag codes."""
    return np.asarray(codes, dtype=np.int64) <= MAX_ADDR


def ext_queue_dir(store_root: Path, topic: str, queue_id: int) -> Path:
    return Path(store_root) / "consumequeue_ext" / topic / str(queue_id)


@dataclass(frozen=True, slots=True)
class ExtUnit:
    tags_code: int
    msg_store_time: int
    bitmap: bytes


def _pack_units(tags_codes: list[int], msg_store_times: list[int], bitmaps: list[bytes], blen: int) -> bytes:
    """put_many's units back to back, size fields zero (speedups.ext_pack's twin; OverflowError out of range)."""
    units = np.zeros(len(bitmaps), dtype=[("size", ">i2"), ("tags", ">i8"), ("time", ">i8"), ("bm", ">i2"),
                                          ("bits", np.uint8, (blen,))])
    units["tags"] = tags_codes
    units["time"] = msg_store_times
    units["bm"] = blen
    if blen:
        units["bits"] = np.frombuffer(b"".join(bitmaps), dtype=np.uint8).reshape(len(bitmaps), blen)
    return units.tobytes()


class _ExtFile(MappedFile):
    """A MappedFile of an ext queue: created with O_EXCL (a new file must not reuse a stale one), never
    implicitly when opened, and read as a byte array by the vectorised unit reads."""

    __slots__ = ("_arr",)

    def __init__(self, path: Path, start: int, size: int, *, create: bool = False) -> None:
        super().__init__(path, start, size, flags=os.O_RDWR | (os.O_CREAT | os.O_EXCL if create else 0),
                         owner="ext queue")
        self._arr: np.ndarray | None = None

    @property
    def arr(self) -> np.ndarray:
        if self._arr is None:
            self._arr = np.frombuffer(self.mm, dtype=np.uint8)
        return self._arr

    def zero_from(self, pos: int) -> None:
        """Zero [pos, end), touching only the span that is not zero already (the rest may be sparse)."""
        nz = np.flatnonzero(self.arr[pos:max(pos, self.alloc_end)])  # unallocated bytes were never written
        if len(nz):
            stop = pos + int(nz[-1]) + 1
            self.mm[pos:stop] = bytes(stop - pos)

    def close(self) -> None:
        self._arr = None  # our own view of the mapping must go before it can close
        super().close()


class ConsumeQueueExt:
    """The ext units of one topic/queue. ``directory`` is ``ext_queue_dir(root, topic, queue_id)``.

    put runs on the dispatch thread, reads on pull threads; one lock serialises the short critical
    sections (reads touch only mapped memory).
    """

    def __init__(self, directory: Path, *, file_size: int = 48 * 1024 * 1024, bitmap_bytes_max: int = 64,
                 lru: OpenFilesLru | None = None) -> None:
        if not 0 <= bitmap_bytes_max <= MAX_UNIT_SIZE - MIN_UNIT_SIZE:
            raise InvalidParameterError(
                f"bitmap_bytes_max {bitmap_bytes_max} is outside 0..{MAX_UNIT_SIZE - MIN_UNIT_SIZE}")
        if file_size < MIN_UNIT_SIZE + bitmap_bytes_max + END_BLANK:
            raise InvalidParameterError(
                f"ext file size {file_size} cannot hold a unit with a {bitmap_bytes_max}-byte bitmap")
        self.directory = Path(directory)
        self.file_size = file_size
        self.bitmap_bytes_max = bitmap_bytes_max
        self._files: list[_ExtFile] = []
        self._write_off = 0  # ext-log offset where the next unit goes
        self._dirty: set[_ExtFile] = set()
        self._lock = threading.RLock()
        # The LRU of open per-queue files (per_queue.py) closes a cold queue's files; every use of
        # ``files`` (under ``_lock``) reopens them.
        self.lock = self._lock
        self.lru = lru
        self._evicted = False

    @property
    def files(self) -> list[_ExtFile]:
        """The open files, reopened if the LRU closed them; callers hold ``_lock``."""
        if self._evicted:
            self._files = open_file_run(self.directory, self.file_size, _ExtFile, size_name="ext file size")
            self._evicted = False
        if self.lru is not None:
            self.lru.touch(self)
        return self._files

    @files.setter
    def files(self, value: list[_ExtFile]) -> None:
        self._files = value

    def evict_files(self) -> None:
        """Called by the LRU with ``_lock`` held: make the units durable, close the files, keep the end."""
        self.flush()
        for f in self._files:
            f.close()
        self._files = []
        self._evicted = True

    # -- opening ---------------------------------------------------------------------------------------

    def load(self) -> None:
        """Open the files, find the end of the data in the last one and clear a torn unit after it."""
        with self._lock:
            self._close_files()
            self._files = files = open_file_run(self.directory, self.file_size, _ExtFile, size_name="ext file size")
            self._evicted = False
            if self.lru is not None:
                self.lru.touch(self)
            if files:
                last = files[-1]
                pos, full = self._scan(last)
                self._write_off = last.end if full else last.start + pos
                if not full:
                    last.zero_from(pos)

    def _unit_ok(self, f: _ExtFile, pos: int) -> int:
        """The size of the sound unit at ``pos``; 0 at the end of the data (or a torn unit), -1 at the end marker."""
        mm = f.mm
        # Nothing was written past the allocated bytes (and reading there could allocate: tmpfs).
        if pos + MIN_UNIT_SIZE > min(f.alloc_end, self.file_size - END_BLANK):
            return -1 if pos + 2 <= min(f.alloc_end, self.file_size) and SIZE.unpack_from(mm, pos)[0] == -1 else 0
        size, _tags, _time, bm = UNIT_HEAD.unpack_from(mm, pos)
        if size == 0 or size == -1:
            return -1 if size == -1 else 0
        if size < MIN_UNIT_SIZE or bm < 0 or size != MIN_UNIT_SIZE + bm or pos + size > self.file_size - END_BLANK:
            log.warning("%s: a torn or unreadable ext unit at %d (size %d, bitmap %d) ends the data",
                        f.path, pos, size, bm)
            return 0
        return size

    def _scan(self, f: _ExtFile) -> tuple[int, bool]:
        """Walk the units of ``f``: (position after the last sound unit, whether an end marker follows)."""
        arr, pos, run = f.arr, 0, 64
        while True:
            size = self._unit_ok(f, pos)
            if size == -1:
                return pos, True
            if size == 0:
                return pos, False
            # Units of one queue mostly share one size: check a run of them at once, growing the run.
            k = min(run, (min(self.file_size - END_BLANK, f.alloc_end) - pos) // size)
            if k <= 0:
                return pos, False
            at = pos + np.arange(k, dtype=np.int64) * size
            sizes = (arr[at].astype(np.int16) << 8) | arr[at + 1]
            bms = (arr[at + 18].astype(np.int16) << 8) | arr[at + 19]
            bad = np.flatnonzero((sizes != size) | (bms != size - MIN_UNIT_SIZE))
            good = int(bad[0]) if len(bad) else k
            pos += good * size
            run = run * 2 if good == k else 64

    # -- writing ---------------------------------------------------------------------------------------

    def put(self, tags_code: int, msg_store_time: int, bitmap: bytes) -> int:
        """Append a unit; returns its decorated (negative) address for the consume queue's tag-code slot.

        The unit :meth:`put_many` would write for a one-unit list (dispatch at a low rate puts one per step),
        without building its lists."""
        head = self._unit_head(tags_code, msg_store_time, bitmap)
        size = MIN_UNIT_SIZE + len(bitmap)
        with self._lock:
            if self._write_off + size > MAX_REAL_OFFSET:
                raise StoreError("the ext log has reached its highest address")
            return self._write_unit(head, bitmap, size)

    def _unit_head(self, tags_code: int, msg_store_time: int, bitmap: bytes) -> bytes:
        """A unit's packed head, its fields checked (InvalidParameterError for a field out of range)."""
        blen = len(bitmap)
        if blen > self.bitmap_bytes_max:
            raise InvalidParameterError(f"a {blen}-byte filter bitmap exceeds the ext limit of {self.bitmap_bytes_max}")
        try:
            return UNIT_HEAD.pack(MIN_UNIT_SIZE + blen, tags_code, msg_store_time, blen)
        except struct.error as e:
            raise InvalidParameterError(f"ext unit field out of range: {e}") from None

    def _write_unit(self, head: bytes, bitmap: bytes, size: int) -> int:
        """Under ``_lock``: write one checked unit at the end of the log; its address."""
        f, pos = self._file_with_room(size)
        if pos + size > f.alloc_end:
            f.allocate_to(pos + size)
        mm = f.mm
        mm[pos + 2:pos + size] = head[2:] + bitmap
        mm[pos:pos + 2] = head[:2]  # last: a unit with a size is whole
        self._dirty.add(f)
        addr = decorate(self._write_off)
        self._write_off += size
        return addr

    def put_many(self, tags_codes: list[int], msg_store_times: list[int], bitmaps: list[bytes]) -> list[int]:
        """Append many units (dispatch's batch): one buffer per file instead of one write per unit.

        Sizes are written after the rest of each chunk, as in put(). Returns the addresses in order."""
        n = len(bitmaps)
        if n == 0:
            return []
        if n <= SMALL_BATCH:  # a few units (dispatch at a low rate): building the structured array costs more
            return self._put_few(tags_codes, msg_store_times, bitmaps)
        # Sizes still zero: a crash mid-copy leaves no unit that looks whole. C packs the usual batch (one
        # bitmap length) and answers None for anything else, which the lines below sort out.
        raw = C.ext_pack(tags_codes, msg_store_times, bitmaps) if C is not None else None
        if raw is None and len(set(map(len, bitmaps))) > 1:
            return [self.put(t, s, b) for t, s, b in zip(tags_codes, msg_store_times, bitmaps)]
        blen = len(bitmaps[0])
        if blen > self.bitmap_bytes_max:
            raise InvalidParameterError(f"a {blen}-byte filter bitmap exceeds the ext limit of {self.bitmap_bytes_max}")
        size = MIN_UNIT_SIZE + blen
        if raw is None:  # no C, or a value it leaves to the twin (which says what is wrong)
            try:
                raw = _pack_units(tags_codes, msg_store_times, bitmaps, blen)
            except OverflowError as e:
                raise InvalidParameterError(f"ext unit field out of range: {e}") from None
        out: list[int] = []
        with self._lock:
            if self._write_off + n * size > MAX_REAL_OFFSET:
                raise StoreError("the ext log has reached its highest address")
            i = 0
            while i < n:
                f, pos = self._file_with_room(size)
                k = min((self.file_size - pos - END_BLANK) // size, n - i)
                f.allocate_to(pos + k * size)
                f.mm[pos:pos + k * size] = raw[i * size:(i + k) * size]
                arr = f.arr
                arr[pos:pos + k * size:size] = size >> 8
                arr[pos + 1:pos + k * size:size] = size & 0xFF
                self._dirty.add(f)
                start = decorate(self._write_off)
                out.extend(range(start, start + k * size, size))
                self._write_off += k * size
                i += k
        return out

    def _put_few(self, tags_codes: list[int], msg_store_times: list[int], bitmaps: list[bytes]) -> list[int]:
        """put_many unit by unit, as put() writes each; every unit is checked before the first is written."""
        heads = [self._unit_head(t, st, b) for t, st, b in zip(tags_codes, msg_store_times, bitmaps, strict=True)]
        out: list[int] = []
        with self._lock:
            if self._write_off + sum(MIN_UNIT_SIZE + len(b) for b in bitmaps) > MAX_REAL_OFFSET:
                raise StoreError("the ext log has reached its highest address")
            for head, bitmap in zip(heads, bitmaps):
                out.append(self._write_unit(head, bitmap, MIN_UNIT_SIZE + len(bitmap)))
        return out

    def _file_with_room(self, size: int) -> tuple[_ExtFile, int]:
        """The file and position the next unit of ``size`` bytes goes to. A file without room for it gets
        the end marker (size -1) at its write position, and the unit goes to a new file."""
        files = self.files  # once: each use touches the LRU
        f = files[-1] if files else None
        if f is None or self._write_off >= f.end:
            f = self._new_file()
        pos = self._write_off - f.start
        if size > self.file_size - pos - END_BLANK:
            f.allocate_to(pos + SIZE.size)
            SIZE.pack_into(f.mm, pos, -1)
            self._dirty.add(f)
            self._write_off = f.end
            f = self._new_file()
            pos = 0
        return f, pos

    def _new_file(self) -> _ExtFile:
        start = self._write_off - self._write_off % self.file_size
        self.directory.mkdir(parents=True, exist_ok=True)
        f = _ExtFile(self.directory / f"{start:020d}", start, self.file_size, create=True)
        self.files = self.files + [f]
        return f

    # -- reading ---------------------------------------------------------------------------------------

    def get(self, address: int) -> ExtUnit | None:
        """The unit at ``address``, or None when there is no sound unit there."""
        if not is_ext_address(address):
            return None
        off = undecorate(address)
        with self._lock:
            f = self._file_of(off)
            if f is None or off + MIN_UNIT_SIZE > self._write_off:
                return None
            pos = off - f.start
            if pos + MIN_UNIT_SIZE > self.file_size:
                return None
            size, tags, stime, bm = UNIT_HEAD.unpack_from(f.mm, pos)
            if bm < 0 or size != MIN_UNIT_SIZE + bm or pos + size > self.file_size or off + size > self._write_off:
                return None
            return ExtUnit(tags, stime, f.mm[pos + MIN_UNIT_SIZE:pos + size])

    def _file_of(self, off: int) -> _ExtFile | None:
        files = self.files
        if not files or off < files[0].start:
            return None
        i = (off - files[0].start) // self.file_size
        return files[i] if i < len(files) else None

    def get_many(self, addresses: np.ndarray) -> ExtBatch:
        """Read many units at once for the pull path (numpy gathers, no per-unit Python); a few units
        (SMALL_BATCH or fewer: a woken held pull, a consumer that keeps up) one by one, where the numpy
        calls' fixed costs would outweigh the work (the two give equal batches)."""
        a = np.ascontiguousarray(addresses, dtype=np.int64).reshape(-1)
        n = len(a)
        if n <= SMALL_BATCH:
            return self._get_few(a.tolist())
        if C is not None:
            return self._get_many_c(a)
        tags = np.zeros(n, dtype=np.int64)
        times = np.zeros(n, dtype=np.int64)
        lengths = np.zeros(n, dtype=np.int32)
        valid = np.zeros(n, dtype=bool)
        with self._lock:
            files = self.files
            if n == 0 or not files:
                return ExtBatch(tags, np.zeros((n, 0), dtype=np.uint8), lengths, times, valid)
            fs, base = self.file_size, files[0].start
            off = (a.view(np.uint64) ^ _SIGN).view(np.int64)  # undecorate without overflow
            cand = (a <= MAX_ADDR) & (off >= base) & (off + MIN_UNIT_SIZE <= self._write_off)
            rows = np.flatnonzero(cand)
            fidx = (off[rows] - base) // fs
            groups = []
            for i in np.unique(fidx):
                sel = rows[fidx == i]
                f = files[int(i)]
                pos = off[sel] - f.start
                sel, pos = sel[pos + MIN_UNIT_SIZE <= fs], pos[pos + MIN_UNIT_SIZE <= fs]
                head = f.arr[pos[:, None] + np.arange(MIN_UNIT_SIZE)].view(_HEAD_DTYPE).reshape(-1)
                size, bm = head["size"].astype(np.int64), head["bm"].astype(np.int64)
                ok = (bm >= 0) & (size == MIN_UNIT_SIZE + bm) & (pos + size <= fs) & (off[sel] + size <= self._write_off)
                sel, pos = sel[ok], pos[ok]
                tags[sel] = head["tags"][ok]
                times[sel] = head["time"][ok]
                lengths[sel] = bm[ok]
                valid[sel] = True
                groups.append((f, sel, pos))
            width = int(lengths.max()) if n else 0
            bitmaps = np.zeros((n, width), dtype=np.uint8)
            if width:
                cols = np.arange(width)
                for f, sel, pos in groups:
                    at = np.minimum(pos[:, None] + MIN_UNIT_SIZE + cols, fs - 1)
                    bitmaps[sel] = np.where(cols < lengths[sel][:, None], f.arr[at], 0)
        return ExtBatch(tags, bitmaps, lengths, times, valid)

    def _get_many_c(self, a: np.ndarray) -> ExtBatch:
        """get_many's batch with C (speedups.ext_gather) reading each file's units: heads first, then the
        bitmaps into rows as wide as the longest one met, as the numpy path builds them."""
        n = len(a)
        tags = np.zeros(n, dtype=np.int64)
        times = np.zeros(n, dtype=np.int64)
        lengths = np.zeros(n, dtype=np.int32)
        valid = np.zeros(n, dtype=bool)
        with self._lock:
            files = self.files
            if not files:
                return ExtBatch(tags, np.zeros((n, 0), dtype=np.uint8), lengths, times, valid)
            fs, base, end = self.file_size, files[0].start, self._write_off
            off = np.where(a <= MAX_ADDR, (a.view(np.uint64) ^ _SIGN).view(np.int64), -1)
            inside = off[off >= base]
            if len(inside) == 0:
                return ExtBatch(tags, np.zeros((n, 0), dtype=np.uint8), lengths, times, valid)
            first, last = (int(inside.min()) - base) // fs, (int(inside.max()) - base) // fs
            touched = files[first:last + 1]
            width = 0
            for f in touched:
                width = max(width, C.ext_gather(f.mm, f.start, fs, end, off, tags, times, lengths, valid, None, 0))
            bitmaps = np.zeros((n, width), dtype=np.uint8)
            if width:
                for f in touched:
                    C.ext_gather(f.mm, f.start, fs, end, off, tags, times, lengths, valid, bitmaps, width)
        return ExtBatch(tags, bitmaps, lengths, times, valid)

    def _get_few(self, addresses: list[int]) -> ExtBatch:
        """get_many's batch, unit by unit: the same checks as :meth:`get`, the same zero rows for the rest."""
        return self.get_few(addresses)[2].arrays()

    def get_few(self, addresses: list[int]) -> tuple[list[int], list[bool], FewExtBatch]:
        """get_many's batch for a few addresses (Python ints), read unit by unit, with its tag codes and valid
        flags as lists too (ext_files.resolve_units decides a woken pull's few units on them, no numpy); the
        batch builds its arrays only if they are read (FewExtBatch)."""
        n = len(addresses)
        tags = [0] * n
        times = [0] * n
        lengths = [0] * n
        bitmaps: list[bytes] = [b""] * n
        valid = [False] * n
        with self._lock:
            files = self.files
            if files:
                unpack, fs, write_off = UNIT_HEAD.unpack_from, self.file_size, self._write_off
                for i, address in enumerate(addresses):
                    if address > MAX_ADDR:
                        continue
                    off = address - LONG_MIN
                    f = self._file_of(off)
                    if f is None or off + MIN_UNIT_SIZE > write_off:
                        continue
                    pos = off - f.start
                    if pos + MIN_UNIT_SIZE > fs:
                        continue
                    size, tag, stime, bm = unpack(f.mm, pos)
                    if bm < 0 or size != MIN_UNIT_SIZE + bm or pos + size > fs or off + size > write_off:
                        continue
                    tags[i], times[i], lengths[i], valid[i] = tag, stime, bm, True
                    bitmaps[i] = f.mm[pos + MIN_UNIT_SIZE:pos + size]
        width = max(lengths, default=0)
        rows = b"".join(b.ljust(width, b"\0") for b in bitmaps) if width else b""
        return tags, valid, FewExtBatch(tags, valid, lengths, times, rows, width)

    def max_address(self) -> int:
        """The address the next unit will get (RocketMQ's getMaxAddress)."""
        return decorate(self._write_off)

    def min_address(self) -> int:
        with self._lock:
            return decorate(self.files[0].start if self.files else self._write_off)

    # -- recovery and retention ------------------------------------------------------------------------

    def truncate(self, address: int) -> None:
        """Recovery: drop every unit at or after ``address``."""
        if not is_ext_address(address):
            raise InvalidParameterError(f"{address} is not a ConsumeQueueExt address")
        off = undecorate(address)
        with self._lock:
            if off >= self._write_off:
                return
            if self.files:
                off = max(off, self.files[0].start)
            keep = [f for f in self.files if f.start < off]
            for f in self.files[len(keep):]:
                self._dirty.discard(f)
                f.delete()
            if keep and off < keep[-1].end:
                keep[-1].zero_from(off - keep[-1].start)
                self._dirty.add(keep[-1])
            self.files = keep
            self._write_off = off

    def truncate_by_max_address(self, address: int) -> None:
        """Recovery: keep the unit at ``address`` (the highest one the consume queue still points at),
        drop everything after it (RocketMQ's truncateByMaxAddress)."""
        unit = self.get(address)
        if unit is None:
            log.warning("%s: no unit at %d to truncate after; nothing dropped", self.directory, address)
            return
        self.truncate(address + MIN_UNIT_SIZE + len(unit.bitmap))

    def delete_below(self, address: int) -> None:
        """Retention: delete whole files that end at or below ``address``, never the last one."""
        off = undecorate(address) if is_ext_address(address) else 0
        with self._lock:
            files = list(self.files)
            gone = []
            while len(files) > 1 and files[0].end <= off:
                gone.append(files.pop(0))
            self.files = files
            for f in gone:
                self._dirty.discard(f)
                f.delete()

    # -- lifecycle -------------------------------------------------------------------------------------

    def flush(self) -> None:
        with self._lock:
            dirty, self._dirty = self._dirty, set()
            for f in dirty:
                f.sync()

    def _close_files(self, *, delete: bool = False) -> None:
        files = self.files if delete else self._files  # deleting needs them open
        if self.lru is not None:
            self.lru.forget(self)
        for f in files:
            if delete:
                f.delete()
            else:
                f.close()
        self._files = []
        self._evicted = False
        self._dirty = set()
        self._write_off = 0

    def close(self) -> None:
        with self._lock:
            self.flush()
            self._close_files()

    def destroy(self) -> None:
        """Delete every file of this queue (topic deletion)."""
        with self._lock:
            self._close_files(delete=True)
