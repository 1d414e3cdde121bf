"""Warming: keep the commit log's next pages in the page cache before the appender gets there.

Segments are sparse, so the first write into each 4 KiB page of the mapping
takes a page fault that allocates and zeroes a page, paid while the writer
holds the GIL (a large share of the append path). RocketMQ warms a new mapped file by writing zeros into it
(MappedFile.warmMappedFile); Sluice does the same continuously, a little ahead
of the write position, with ``os.pwrite`` from a thread of its own. pwrite
releases the GIL, so the page allocation runs on another core, and the
appender's later write into the mapping only installs the page.

Zeros go only where nothing is written yet: at or after the page that follows
the write position, and an appender whose bytes would land in a range being
zeroed waits for it (it never happens in practice: the warmer is far faster
than the appender and works ``ahead`` bytes in front of it).

Under synchronous flush the zeros are written durably (``durable``: RWF_DSYNC,
in smaller chunks). A segment's bytes are allocated but unwritten
(``posix_fallocate``), and the first write-back of an unwritten range changes
the file's extent map: every fdatasync of freshly appended records then also
wrote that metadata, a second disk round trip after the data. Over zeros made
durable ahead of time the records overwrite written blocks, and an fdatasync
writes only them. A commit fsync running while a chunk of zeros is being
written back waits for it too, so durable chunks are small.
"""
from __future__ import annotations

import logging
import mmap
import os
import threading
import time
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from _thread import LockType

    from sluice.store.mapped import MappedFileQueue

log = logging.getLogger(__name__)

#: after a failed warming write (ENOSPC, say) the warmer pauses this long at first, doubling up to the max
PAUSE_MIN_S = 1.0
PAUSE_MAX_S = 30.0

PAGE = mmap.PAGESIZE
CHUNK = 1 << 20
#: zeros written at a time when they must be durable (a commit fsync meanwhile waits for this many bytes)
DURABLE_CHUNK = 256 * 1024
#: durable zeros start this far past the write position at the least (a quarter of ``ahead`` if less): the
#: appender must not reach a range while its (slower) durable write runs, or it waits for it on the loop
DURABLE_MARGIN = 1024 * 1024
_ZEROS = memoryview(bytes(CHUNK))


class WarmedLog(Protocol):
    """What the warmer reads of the commit log it runs beside (store/commitlog.py CommitLog)."""

    #: Held by appenders; the warmer takes it to pick the next range and to publish progress.
    put_lock: LockType
    #: Absolute offset of the next byte to write.
    write_pos: int
    #: True once the log is closed: the warmer stops.
    closed: bool
    #: The segment files; the last one is being written.
    queue: MappedFileQueue


class Warmer:
    """Runs beside one CommitLog; every method but ``stop`` is called with the commit log's put lock held."""

    def __init__(self, commitlog: WarmedLog, ahead: int, *, durable: bool = False) -> None:
        """``durable``: make the zeros durable before counting them warm (synchronous flush; see above)."""
        self.cl = commitlog
        self.ahead = ahead
        self.durable = durable
        self.chunk = DURABLE_CHUNK if durable else CHUNK
        self.margin = min(DURABLE_MARGIN, ahead // 4) if durable else 0
        self.low = ahead // 2  # wake the thread when less than this much is warm ahead of the writer
        self.cond = threading.Condition(commitlog.put_lock)
        self.end = 0  # absolute offset up to which the segment being written is warm (or written)
        self.busy: tuple[int, int] | None = None  # the range being zeroed right now
        self.warmed_bytes = 0
        self._wake = threading.Event()
        self._stopped = False
        self._thread: threading.Thread | None = None

    # ---- called by the appender (put lock held) --------------------------------------------------------
    def before_write(self, nbytes: int) -> None:
        """Wait while the next ``nbytes`` from the write position overlap the range being zeroed."""
        b = self.busy
        while b is not None and self.cl.write_pos + nbytes > b[0] and self.cl.write_pos < b[1]:
            self.cond.wait(1.0)
            b = self.busy

    def after_write(self, end: int) -> None:
        if self.ahead <= 0 or end + self.low <= self.end or self._wake.is_set() or self._stopped:
            return
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="sluice-commitlog-warm", daemon=True)
            self._thread.start()
        self._wake.set()

    def reset(self) -> None:
        """The log was cut: forget what was warm."""
        self.end = 0

    # ---- lifecycle -----------------------------------------------------------------------------------
    def stop(self) -> None:
        """Stop the thread (called without the put lock: the thread takes it)."""
        self._stopped = True
        self._wake.set()
        t = self._thread
        if t is not None:
            t.join()
            self._thread = None

    def reopen(self) -> None:
        self._stopped = False
        self._wake.clear()
        self.end = 0

    # ---- the thread ----------------------------------------------------------------------------------
    def _run(self) -> None:
        pause = 0.0
        last_log = -1e18
        while not self._stopped:
            self._wake.wait(1.0)
            self._wake.clear()
            try:
                while not self._stopped and self._step():
                    pass
                pause = 0.0
            except Exception as e:
                # Warming is an optimisation: appends allocate for themselves (mapped.py). A full disk
                # (ENOSPC) pauses it with back-off, logged at most twice a minute.
                pause = min(PAUSE_MAX_S, max(PAUSE_MIN_S, pause * 2))
                if time.monotonic() - last_log >= PAUSE_MAX_S:
                    last_log = time.monotonic()
                    log.error("commit-log warming failed, paused %.0f s: %s", pause, e)
                self._wake.clear()
                deadline = time.monotonic() + pause
                while not self._stopped and time.monotonic() < deadline:
                    time.sleep(min(0.2, pause))

    def _step(self) -> bool:
        """Zero the next chunk ahead of the write position; False when there is nothing to do."""
        cl = self.cl
        with self.cond:
            if self._stopped or cl.closed:
                return False
            f = cl.queue.last()
            wpos = cl.write_pos
            if f is None or f.closed or not f.start <= wpos < f.end:
                return False
            start = max(self.end, -(-wpos // PAGE) * PAGE + self.margin)  # never the page holding written bytes
            stop = min(wpos + self.ahead, f.end, start + self.chunk)
            if start >= stop:
                return False
            self.busy = (start, stop)
            fd = os.dup(f._fd)  # the file may be closed meanwhile: the duplicate keeps it valid
            base = f.start
            contiguous = start - base <= f.alloc_end
        done = 0
        try:
            # Allocated first, all or nothing (tmpfs; a short pwrite would fill the disk to its last page),
            # so the zeros below cannot meet ENOSPC half way.
            os.posix_fallocate(fd, start - base, stop - start)
            done = _write_zeros(fd, stop - start, start - base, self.durable)
        finally:
            os.close(fd)
            with self.cond:
                self.busy = None
                if done > 0:
                    self.end = start + done
                    self.warmed_bytes += done
                    if contiguous:  # written zeros are allocated: the appender need not allocate them again
                        f.alloc_end = max(f.alloc_end, start - base + done)
                self.cond.notify_all()
        return done > 0


def _write_zeros(fd: int, n: int, pos: int, durable: bool) -> int:
    """pwrite ``n`` zeros at ``pos``; ``durable``: on disk when it returns (RWF_DSYNC syncs only this range,
    where an fdatasync would also write back the appender's pages)."""
    if durable:
        return os.pwritev(fd, [_ZEROS[:n]], pos, os.RWF_DSYNC)
    return os.pwrite(fd, _ZEROS[:n], pos)
