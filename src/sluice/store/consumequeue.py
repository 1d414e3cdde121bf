"""Consume queues: per topic and queue, 20-byte units pointing into the commit log.

Unit layout (big-endian, RocketMQ's ConsumeQueue; sluice.format owns it)::

    0 commitlog offset (int64) | 8 size (int32) | 12 tag code (int64)

The unit at byte ``20 * n`` of the queue is queue offset ``n``. Files hold
``units_per_file`` units and live at {root}/consumequeue/{topic}/{queueId}/{20-digit byte offset}.
A unit whose size is 0 is unwritten (files are sparse); padding units written
before the first real unit of a queue that starts mid-file are ``(0, 2**31-1, 0)``.
Reads come back as numpy structured arrays, a whole batch per call.
"""
from __future__ import annotations

import logging
import threading
from pathlib import Path

import numpy as np

from sluice.format import CQ_PAD_SIZE, CQ_UNIT, CQ_UNIT_FIELDS, CQ_UNIT_SIZE
from sluice.store.mapped import MappedFileQueue
from sluice.store.per_queue import OpenFilesLru, PerQueueTable

log = logging.getLogger(__name__)

#: a unit as numpy reads it (sluice.format.CQ_UNIT_FIELDS)
CQ_DTYPE = np.dtype(list(CQ_UNIT_FIELDS))
assert CQ_DTYPE.itemsize == CQ_UNIT_SIZE
PAD_SIZE = CQ_PAD_SIZE


class ConsumeQueue:
    """One queue's units. Its files may be closed by the table's LRU (``evict_files``) when the queue is
    cold; every use goes through :attr:`queue` with ``lock`` held, which reopens them."""

    def __init__(self, topic: str, queue_id: int, directory: Path, units_per_file: int,
                 lru: OpenFilesLru | None = None) -> None:
        self.topic = topic
        self.queue_id = queue_id
        self.units_per_file = units_per_file
        self._mfq = MappedFileQueue(directory, units_per_file * CQ_UNIT_SIZE)
        self._evicted = False
        self.lru = lru
        self.max_offset = 0  # next queue offset to be written
        self.min_offset = 0  # smallest queue offset still readable
        self._flushed_units = 0
        # Held by every use of the files (reads too: the LRU must not close them under a reader); reentrant,
        # as the recovery helpers call each other.
        self.lock = threading.RLock()

    @property
    def queue(self) -> MappedFileQueue:
        """The queue's files, reopened if the LRU closed them; callers hold ``lock``."""
        if self._evicted:
            self._mfq.load()
            self._evicted = False
        if self.lru is not None:
            self.lru.touch(self)
        return self._mfq

    def evict_files(self) -> None:
        """The LRU closes a cold queue's files (units made durable first); the next use reopens them."""
        self.flush()
        self._mfq.close()
        self._evicted = True

    # ---- lifecycle -------------------------------------------------------------------------------
    def load(self) -> None:
        with self.lock:
            self._mfq.load()
            self._evicted = False
            files = self.queue.files
            self.max_offset = self._scan_max()
            self.min_offset = self._first_real(files[0]) if files else 0
            self._flushed_units = self.max_offset

    def _file_units(self, f) -> np.ndarray:
        """A copy of the units of file ``f`` that may hold data (those below its allocated bytes: the rest
        were never written), its pages released after: a scan of many queues keeps memory bounded."""
        n = f.alloc_end - f.alloc_end % CQ_UNIT_SIZE
        return np.frombuffer(f.read_released(0, n), dtype=CQ_DTYPE)

    def _scan_max(self) -> int:
        for f in reversed(self.queue.files):
            sizes = self._file_units(f)["size"]
            empty = np.flatnonzero(sizes == 0)
            if len(empty) == 0:
                return f.start // CQ_UNIT_SIZE + len(sizes)
            if empty[0] > 0:
                return f.start // CQ_UNIT_SIZE + int(empty[0])
            if f is self.queue.files[0]:
                return f.start // CQ_UNIT_SIZE
        return 0

    def _first_real(self, f) -> int:
        units = self._file_units(f)
        real = np.flatnonzero((units["size"] > 0) & (units["size"] != PAD_SIZE))
        return f.start // CQ_UNIT_SIZE + (int(real[0]) if len(real) else 0)

    def close(self) -> None:
        with self.lock:
            if self.lru is not None:
                self.lru.forget(self)
            self._mfq.close()
            self._evicted = True

    def destroy(self) -> None:
        with self.lock:
            self.queue.destroy()
            self.max_offset = self.min_offset = 0

    # ---- write -----------------------------------------------------------------------------------
    def put(self, first_offset: int, units: np.ndarray) -> None:
        """Write ``units`` (CQ_DTYPE) for queue offsets first_offset, first_offset+1, ...

        Re-dispatched units (below max_offset, e.g. after recovery) overwrite what is there.
        """
        with self.lock:
            if first_offset > self.max_offset:
                if self.queue.files:
                    # Units went missing (damaged files); keep offsets meaningful by padding the hole.
                    log.warning("consume queue %s/%d: units %d..%d missing; padding",
                                self.topic, self.queue_id, self.max_offset, first_offset)
                    pad_from = self.max_offset
                else:
                    # A queue that starts mid-file (its earlier files are gone): pad to the file start.
                    pad_from = first_offset - first_offset % self.units_per_file
                    self.min_offset = first_offset
                pad = np.zeros(first_offset - pad_from, dtype=CQ_DTYPE)
                pad["size"] = PAD_SIZE
                self._write(pad_from, pad.tobytes())
            skip = max(0, self.queue.min_offset // CQ_UNIT_SIZE - first_offset)
            if skip:
                units = units[skip:]
                first_offset += skip
            if len(units):
                self._write(first_offset, units.tobytes())
            self.max_offset = max(self.max_offset, first_offset + len(units))

    def put_unit(self, offset: int, phys: int, size: int, tag: int) -> None:
        """Write one unit at queue ``offset``: what :meth:`put` does with a one-unit array, without numpy
        (dispatch at a low rate writes one unit per step). A unit that needs padding before it, or whose
        file does not exist yet, goes the way of :meth:`put`."""
        data = CQ_UNIT.pack(phys, size, tag)
        with self.lock:
            if offset <= self.max_offset:
                pos = offset * CQ_UNIT_SIZE
                f = self.queue.find(pos)
                if f is not None:  # files hold whole units; a unit in a file is not below the queue's first
                    f.write(pos - f.start, data)
                    if offset >= self.max_offset:
                        self.max_offset = offset + 1
                    return
            self.put(offset, np.frombuffer(data, dtype=CQ_DTYPE))

    def _write(self, offset: int, data: bytes) -> None:
        pos = offset * CQ_UNIT_SIZE
        end = pos + len(data)
        q = self.queue
        while pos < end:
            f = q.find(pos)
            if f is None:
                last = q.last()
                f = q.create(last.end if last else pos - pos % q.file_size)
                if not (f.start <= pos < f.end):
                    continue
            n = min(end, f.end) - pos
            done = len(data) - (end - pos)
            f.write(pos - f.start, data[done:done + n])
            pos += n

    # ---- read ------------------------------------------------------------------------------------
    def get_units(self, offset: int, max_units: int, release: bool = False) -> np.ndarray | None:
        """Units from ``offset`` (at most ``max_units``, never past max_offset); None if not stored.

        ``release``: read a copy and drop its pages from this process afterwards (``store check`` walks
        every queue and must not keep them all resident)."""
        stop = min(self.max_offset, offset + max_units)
        parts = []
        pos = offset * CQ_UNIT_SIZE
        end = stop * CQ_UNIT_SIZE
        if pos >= end:
            return None
        with self.lock:
            q = self.queue
            while pos < end:
                f = q.find(pos)
                if f is None:
                    break
                n = min(end, f.end) - pos
                try:
                    data = f.read_released(pos - f.start, n) if release else f.read(pos - f.start, n)
                    parts.append(np.frombuffer(data, dtype=CQ_DTYPE))
                except ValueError:  # closed under us by retention
                    break
                pos += n
        if not parts:
            return None
        return parts[0] if len(parts) == 1 else np.concatenate(parts)

    def unit_bytes(self, offset: int) -> bytes | None:
        """The 20 stored bytes of the unit at ``offset`` (no numpy: a woken held pull reads one), or None."""
        if not self.min_offset <= offset < self.max_offset:
            return None
        pos = offset * CQ_UNIT_SIZE
        with self.lock:
            f = self.queue.find(pos)
            if f is None or pos + CQ_UNIT_SIZE > f.end:
                return None
            try:
                return f.read(pos - f.start, CQ_UNIT_SIZE)
            except ValueError:  # closed under us by retention
                return None

    def unit(self, offset: int) -> tuple[int, int, int] | None:
        u = self.get_units(offset, 1)
        if u is None or len(u) == 0:
            return None
        return int(u["offset"][0]), int(u["size"][0]), int(u["tag"][0])

    def last_unit_end(self) -> int:
        """Commit-log offset just after the last unit's record, or -1 when the queue is empty."""
        for off in range(self.max_offset - 1, max(self.min_offset, self.max_offset - 64) - 1, -1):
            u = self.unit(off)
            if u and 0 < u[1] < PAD_SIZE:
                return u[0] + u[1]
        return -1

    # ---- recovery and retention ------------------------------------------------------------------
    def truncate_after_commitlog(self, commitlog_end: int) -> int:
        """Drop units whose record ends after ``commitlog_end``; return how many were dropped."""
        with self.lock:
            new_max = self.max_offset
            for f in reversed(self.queue.files):
                first = f.start // CQ_UNIT_SIZE
                if first >= new_max:
                    continue
                units = self._file_units(f)[: new_max - first]
                real = (units["size"] > 0) & (units["size"] != PAD_SIZE)
                bad = real & (units["offset"] + units["size"] > commitlog_end)
                if not bad.any():
                    break
                keep = np.flatnonzero(real & ~bad)
                new_max = first + (int(keep[-1]) + 1 if len(keep) else 0)
                if len(keep):
                    break
            dropped = self.max_offset - new_max
            if dropped:
                self.queue.truncate(new_max * CQ_UNIT_SIZE, dirty_end=self.max_offset * CQ_UNIT_SIZE)
                self.max_offset = new_max
                self.min_offset = min(self.min_offset, new_max)
            return dropped

    def truncate(self, offset: int) -> None:
        """Forget units at and after queue offset ``offset``."""
        with self.lock:
            if offset < self.max_offset:
                self.queue.truncate(offset * CQ_UNIT_SIZE, dirty_end=self.max_offset * CQ_UNIT_SIZE)
                self.max_offset = offset
                self.min_offset = min(self.min_offset, offset)

    def delete_below(self, commitlog_min: int) -> int:
        """Delete files whose units all point below ``commitlog_min`` (never the last); move min_offset."""
        with self.lock:
            count = 0
            files = self.queue.files
            for f in files[:-1]:
                units = self._file_units(f)
                real = units[(units["size"] > 0) & (units["size"] != PAD_SIZE)]
                if len(real) and int(real["offset"][-1]) >= commitlog_min:
                    break
                count += 1
            if count:
                self.queue.delete_first(count)
            self._correct_min(commitlog_min)
            return count

    def _correct_min(self, commitlog_min: int) -> None:
        for f in self.queue.files:
            units = self._file_units(f)
            first = f.start // CQ_UNIT_SIZE
            valid = units[: max(0, self.max_offset - first)]
            ok = np.flatnonzero((valid["size"] > 0) & (valid["size"] != PAD_SIZE) & (valid["offset"] >= commitlog_min))
            if len(ok):
                self.min_offset = first + int(ok[0])
                return
        self.min_offset = self.max_offset

    def flush(self) -> None:
        target = self.max_offset
        if target != self._flushed_units:
            with self.lock:
                if not self._evicted:  # an evicted queue was flushed when its files were closed
                    self._mfq.sync(self._flushed_units * CQ_UNIT_SIZE, target * CQ_UNIT_SIZE + 1)
                self._flushed_units = target


class ConsumeQueueTable(PerQueueTable[ConsumeQueue]):
    """All consume queues of the store, created on first use."""

    def __init__(self, root: Path, units_per_file: int, *, max_open: int = 1024) -> None:
        super().__init__(root)
        self.units_per_file = units_per_file
        #: queues with open files, at most max_open (StoreConfig.max_open_queues)
        self.lru = OpenFilesLru(max_open)

    def _new(self, topic: str, queue_id: int, directory: Path) -> ConsumeQueue:
        return ConsumeQueue(topic, queue_id, directory, self.units_per_file, self.lru)
