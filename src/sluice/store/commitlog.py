"""The commit log: every record of every topic, appended to fixed-size segments.

Records use RocketMQ's 4.x layout (sluice.format owns it). A segment that
cannot hold the next record plus 8 bytes ends with the blank marker
``[int remaining][int BLANK_MAGIC]`` and the record goes to the next segment,
so a record never spans two files. Zeros where a record's size should be mark
the end of the written data (segments are created sparse).

The append path encodes outside the lock, then under it only patches
QUEUEOFFSET, PHYSICALOFFSET and STORETIMESTAMP into the joined batch and copies
it into the mapping with one slice assignment per segment touched.
"""
from __future__ import annotations

import struct
import threading
import time
from collections.abc import Callable, Sequence
from collections import deque
from itertools import accumulate, repeat
from operator import add, sub
from pathlib import Path
from typing import TYPE_CHECKING

from sluice.errors import CorruptRecordError, StoreError
from sluice.format import (
    BLANK,
    BLANK_MAGIC,
    CORRUPT,
    END,
    END_OF_DATA,
    PARTIAL,
    END_FILE_MIN_BLANK_LENGTH,
    I32,
    I64,
    MAGIC_V1,
    MAGIC_V2,
    MIN_RECORD_SIZE,
    POS_QUEUEOFFSET,
    POS_SYSFLAG,
    QUEUE_PHYS,
    TOTAL_MAGIC,
    ParsedRecord,
    RecordWalk,
    parse_record,
    store_timestamp_pos,
    verify_record_bytes,
)
from sluice.speedups import C
from sluice.store.mapped import MappedFile, MappedFileQueue
from sluice.store.warm import Warmer

if TYPE_CHECKING:
    from sluice.store.dispatch_columns import PutRun

# The record decoders live with the layout in sluice.format; these names stay importable from here.
__all__ = ["CommitLog", "ParsedRecord", "parse_record", "verify_record_bytes", "MIN_RECORD_SIZE",
           "MAX_PENDING_BATCHES", "WARM_AHEAD", "SYNC_WARM_AHEAD"]

#: how many appended batches may wait for dispatch with their metadata (beyond that, dispatch parses the log)
MAX_PENDING_BATCHES = 8192
#: how far ahead of the write position the warmer keeps pages in the page cache (warm.py)
WARM_AHEAD = 16 * 1024 * 1024
#: the same under synchronous flush, where the zeros are written durably (warm.py): each commit fsync meanwhile
#: waits for the chunk being written, so less ahead keeps the burst at start and at each new segment short
SYNC_WARM_AHEAD = 4 * 1024 * 1024
#: bytes of a segment allocated at a time ahead of the writer (mapped.py); the warmer's zeros allocate too
ALLOC_CHUNK = 4 * 1024 * 1024
#: bytes a scan (recovery, check, rebuild) copies out of the mapping at a time; its pages are then released,
#: so a scan's memory does not grow with the segment size
SCAN_WINDOW = 8 * 1024 * 1024


def _queue_offsets(queued: Sequence[bool], qoff: int) -> tuple[list[int], int]:
    """Queue offsets when some records get none (stored as 0); and the queue's next offset."""
    out = []
    for q in queued:
        if q:
            out.append(qoff)
            qoff += 1
        else:
            out.append(0)
    return out, qoff


class CommitLog:
    """Segments under {root}/commitlog, the write position, and the topic-queue offset table."""

    def __init__(self, directory: Path, file_size: int, *, warm_ahead: int = WARM_AHEAD,
                 write_by_fd: bool = False, durable_warm: bool = False) -> None:
        # write_by_fd (synchronous flush): records are written with pwrite, which makes the fsyncs after
        # them several times cheaper than after writes through the mapping (mapped.py).
        self.queue = MappedFileQueue(directory, file_size, write_by_fd=write_by_fd,
                                     alloc_chunk=min(file_size, ALLOC_CHUNK))
        self.file_size = file_size
        self.write_pos = 0  # absolute offset of the next byte to write (always a record boundary)
        self.put_lock = threading.Lock()
        #: next queue offset per (topic, queue id), assigned at append time
        self.queue_offsets: dict[tuple[str, int], int] = {}
        self.last_store_timestamp = 0
        self.closed = False
        # Serves the dispatcher: set after every append, unless the appender dispatches itself.
        self.appended = threading.Event()
        self.wake_dispatch = True
        self.dispatch_idle = True  # the dispatch thread sleeps on ``appended`` (else it polls)
        #: puts appended but not yet dispatched, by the commit-log offset of their first record
        self.pending: dict[int, PutRun] = {}
        # durable_warm (synchronous flush): the warmer's zeros are made durable, so fsyncs after appends
        # write no extent changes (warm.py).
        self.warm = Warmer(self, min(warm_ahead, file_size // 4), durable=durable_warm)

    # ---- lifecycle -------------------------------------------------------------------------------
    def load(self) -> None:
        self.queue.load()
        self.closed = False
        self.warm.reopen()

    def close(self) -> None:
        self.warm.stop()
        with self.put_lock:  # an append in flight finishes first; later ones are refused
            self.closed = True
            self.queue.close()

    @property
    def min_offset(self) -> int:
        return self.queue.min_offset

    # ---- append ----------------------------------------------------------------------------------
    def append(self, buf: bytearray, sizes: Sequence[int], topic: str, queue_id: int, ts_positions: Sequence[int],
               queued: Sequence[bool] | None = None, run: PutRun | None = None,
               ) -> tuple[list[int], Sequence[int], int, int]:
        """Append encoded records of one topic/queue (``buf`` holds them back to back, ``sizes`` says where
        each ends); return (commit-log offsets, queue offsets, store timestamp, end offset). Validation
        happened at encoding: nothing here can refuse a record.

        ``queued[i]`` false (prepared/rolled-back transactional records) stores queue offset 0 and does
        not advance the queue, as RocketMQ does.

        ``run`` (the records' columns for dispatch) gets the offsets and store time and is registered in
        ``pending`` before ``write_pos`` moves, so dispatch never misses it and need not parse the records."""
        key = (topic, queue_id)
        n = len(sizes)
        with self.put_lock:
            warm = self.warm
            if warm.busy is not None:  # first: waiting releases the lock, so nothing is read before it
                warm.before_write(len(buf) + END_FILE_MIN_BLANK_LENGTH)
            if self.closed:
                raise StoreError("the commit log is closed")
            now = max(int(time.time() * 1000), self.last_store_timestamp)
            self.last_store_timestamp = now
            qoff = self.queue_offsets.get(key, 0)
            wpos = self.write_pos
            f = self._writable_file(wpos)
            end = wpos + len(buf)
            if queued is None:
                qoffs: Sequence[int] = range(qoff, qoff + n)
                next_qoff = qoff + n
            else:
                qoffs, next_qoff = _queue_offsets(queued, qoff)
            if end + END_FILE_MIN_BLANK_LENGTH <= f.end:
                # The usual case: the batch fits the current segment; patch in place, one copy.
                if C is not None and queued is None and type(sizes) is list and type(ts_positions) is list:
                    phys = C.patch_records(buf, sizes, ts_positions, qoff, wpos, now)
                else:  # two packs per record, driven by C-level maps (no bytecode per record)
                    phys = list(accumulate(sizes, initial=wpos))
                    phys.pop()
                    rels = list(map(sub, phys, repeat(wpos)))
                    deque(map(QUEUE_PHYS.pack_into, repeat(buf), map(add, rels, repeat(POS_QUEUEOFFSET)), qoffs,
                              phys), 0)
                    deque(map(I64.pack_into, repeat(buf), map(add, rels, ts_positions), repeat(now)), 0)
                f.write(wpos - f.start, buf)
            else:
                self._prepare_roll(f, end)
                phys, end = self._append_rolling(f, buf, sizes, qoffs, ts_positions, now, wpos)
            self.queue_offsets[key] = next_qoff
            if run is not None and len(self.pending) < MAX_PENDING_BATCHES:
                run.phys, run.qoffs, run.store_timestamp = phys, qoffs, now
                self.pending[phys[0]] = run
            self.write_pos = end
            warm.after_write(end)
        if self.wake_dispatch and self.dispatch_idle and not self.appended.is_set():
            self.appended.set()  # set() takes a lock and wakes a thread: only when dispatch sleeps
        return phys, qoffs, now, end

    def _append_rolling(self, f: MappedFile, buf: bytearray, sizes: Sequence[int], qoffs: Sequence[int],
                        ts_positions: Sequence[int], now: int, wpos: int) -> tuple[list[int], int]:
        """The batch crosses a segment end: records that do not fit go to the next segment after a blank."""
        phys: list[int] = []
        chunk_start = 0  # start in buf of the bytes not yet copied into f
        chunk_phys = wpos
        rel = 0
        for n, q, t in zip(sizes, qoffs, ts_positions):
            if wpos + n + END_FILE_MIN_BLANK_LENGTH > f.end:
                if rel > chunk_start:
                    f.write(chunk_phys - f.start, memoryview(buf)[chunk_start:rel])
                f.write(wpos - f.start, TOTAL_MAGIC.pack(f.end - wpos, BLANK_MAGIC))
                wpos = f.end
                f = self._writable_file(wpos)
                chunk_start, chunk_phys = rel, wpos
            QUEUE_PHYS.pack_into(buf, rel + POS_QUEUEOFFSET, q, wpos)
            I64.pack_into(buf, rel + t, now)
            phys.append(wpos)
            wpos += n
            rel += n
        f.write(chunk_phys - f.start, memoryview(buf)[chunk_start:rel] if chunk_start else buf)
        return phys, wpos

    def _prepare_roll(self, f: MappedFile, end: int) -> None:
        """Before a batch that crosses the end of ``f`` writes anything: the rest of ``f`` and the next
        segment's first bytes are allocated, so a full disk fails the batch with nothing written (bytes
        written past ``write_pos`` would come back as records after a crash)."""
        f.allocate_to(f.size)
        nxt = self._writable_file(f.end)
        nxt.allocate_to(min(nxt.size, end + END_FILE_MIN_BLANK_LENGTH - nxt.start))

    def _writable_file(self, wpos: int) -> MappedFile:
        f = self.queue.last()
        if f is None:
            # An empty log (or one emptied by retention) continues at the file holding wpos.
            return self.queue.create(wpos - wpos % self.file_size)
        if wpos >= f.end:
            return self.queue.create(f.end)
        if wpos < f.start:  # the next segment was made for a batch that then failed (_prepare_roll)
            g = self.queue.find(wpos)
            if g is None:
                raise StoreError(f"no commit-log segment holds the write position {wpos}")
            return g
        return f

    # ---- read ------------------------------------------------------------------------------------
    def read(self, offset: int, size: int) -> bytes | None:
        """The bytes of the record at ``offset`` (``size`` as the consume queue says), or None if gone."""
        f = self.queue.find(offset)
        if f is None or offset + size > f.end or offset + size > self.write_pos:
            return None
        try:
            return f.read(offset - f.start, size)
        except ValueError:  # the mapping was closed by retention meanwhile
            return None

    def read_record(self, offset: int) -> bytes | None:
        """The whole record at ``offset`` using its own size field, or None if there is none."""
        f = self.queue.find(offset)
        if f is None or offset + 8 > self.write_pos:
            return None
        try:
            total, magic = TOTAL_MAGIC.unpack_from(f.mm, offset - f.start)
        except (ValueError, struct.error):
            return None
        if magic not in (MAGIC_V1, MAGIC_V2):
            raise CorruptRecordError(f"no record at commit-log offset {offset} (magic 0x{magic:08X})",
                                     path=str(f.path), offset=offset - f.start)
        if total < MIN_RECORD_SIZE or offset + total > min(f.end, self.write_pos):
            raise CorruptRecordError(f"record size {total} does not fit", path=str(f.path), offset=offset - f.start)
        return self.read(offset, total)

    def read_record_unchecked(self, offset: int) -> bytes | None:
        """The record at ``offset`` whose header decodes, CRC not checked (for check() to step over it)."""
        f = self.queue.find(offset)
        if f is None or offset + 4 > self.write_pos:  # past the written bytes nothing can be read safely
            return None
        try:
            total = I32.unpack_from(f.mm, offset - f.start)[0]
            if not MIN_RECORD_SIZE <= total <= min(f.end, self.write_pos) - offset:
                return None
            data = f.read(offset - f.start, total)
            parse_record(data, 0, check_crc=False)
        except (ValueError, struct.error, CorruptRecordError):
            return None
        return data

    def read_span(self, offset: int, max_bytes: int, *, release: bool = False) -> tuple[bytes, int]:
        """Up to ``max_bytes`` of written data from ``offset`` within one segment: (data, segment end).

        ``release``: drop the pages read from this process afterwards (a replay of the whole log must not
        keep it all resident)."""
        f = self.queue.find(offset)
        if f is None:
            return b"", -1
        end = min(f.end, self.write_pos, offset + max_bytes)
        try:
            n = max(0, end - offset)
            return (f.read_released if release else f.read)(offset - f.start, n), f.end
        except ValueError:
            return b"", -1

    def store_timestamp_at(self, offset: int) -> int | None:
        f = self.queue.find(offset)
        if f is None or offset + MIN_RECORD_SIZE > self.write_pos:
            return None
        try:
            sysflag = I32.unpack_from(f.mm, offset - f.start + POS_SYSFLAG)[0]
            return I64.unpack_from(f.mm, offset - f.start + store_timestamp_pos(sysflag))[0]
        except (ValueError, struct.error):
            return None

    # ---- recovery --------------------------------------------------------------------------------
    def scan(self, start: int, *, check_crc: bool = True, on_record: Callable[[ParsedRecord], None] | None = None,
             ) -> tuple[int, CorruptRecordError | None]:
        """Walk records from ``start`` (a record boundary) to the end of the written data.

        Returns (offset just after the last valid record, the error that stopped the walk or None).
        ``on_record(parsed)`` is called for each valid record.
        """
        pos = start
        while True:
            f = self.queue.find(pos)
            if f is None:
                return pos, None
            rel, stop, err = self._scan_segment(f, pos - f.start, check_crc, on_record)
            if stop not in (END, BLANK):  # zeros (the end of the written data) or damage
                return f.start + rel, err
            pos = f.end

    def _scan_segment(self, f: MappedFile, rel: int, check_crc: bool,
                      on_record: Callable[[ParsedRecord], None] | None) -> tuple[int, str | None, CorruptRecordError | None]:
        """Walk one segment from file offset ``rel`` in windows of SCAN_WINDOW bytes, releasing each
        window's pages once walked: (file offset where the walk stopped, why, the error). Bytes past the
        file's allocated ones were never written: the walk ends there as at zeros."""
        size, where = f.size, str(f.path)
        window = SCAN_WINDOW
        while True:
            limit = min(size, f.alloc_end)
            if rel + 8 > limit and limit < size:
                return rel, END_OF_DATA, None
            hi = min(limit, rel + window)
            last = hi == size
            data = f.read_released(rel, hi - rel)
            walk = RecordWalk(data, check_crc=check_crc, where=where, file_offset=rel, log_offset=f.start + rel,
                              window=not last)
            if on_record is None:
                for _ in walk:
                    pass
            else:
                for rec in walk:
                    on_record(rec)
            at = rel + walk.pos
            stop = walk.stop
            if stop == BLANK and not last:
                total = I32.unpack_from(data, walk.pos)[0]
                if total != size - at:
                    return at, CORRUPT, CorruptRecordError(f"blank marker says {total} bytes, {size - at} remain",
                                                             path=where, offset=at)
            if stop == PARTIAL and hi == limit:  # its bytes past the allocated ones were never written
                return at, CORRUPT, CorruptRecordError(f"a record of {walk.want} bytes runs past the written data",
                                                       path=where, offset=at)
            if stop == PARTIAL or (stop == END and not last):
                if at == rel:  # one record larger than the window: read it whole
                    window = max(window, walk.want, 8) * 2
                rel = at
                continue
            return at, stop, walk.error

    def truncate(self, offset: int) -> None:
        """Cut the log at ``offset``: later bytes are zeroed, later segments deleted."""
        with self.put_lock:
            self.queue.truncate(offset, dirty_end=None)
            self.write_pos = offset
            self.pending.clear()
            self.warm.reset()

    def segments(self) -> list[MappedFile]:
        return list(self.queue.files)
